// combine_launch.hpp — combine entry points for other stages' launchers (no kernels here: each
// kernel lives in one translation unit, combine.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moekit::detail {

// y[t] = sum_j rows[row_of[t*k + j]] in slot order j (row_of -1: absent, adds nothing): combine's
// kernel, arithmetic and order, over rows that sit anywhere (the EP path's returned rows). bf16
// rows [*, hidden] and y [tokens, hidden]; hidden a multiple of 8; no validation (callers do it).
void launch_combine_gathered(const void* rows, const int32_t* row_of, void* y, int64_t tokens, int64_t hidden, int topk,
                             cudaStream_t stream);

}  // namespace moekit::detail
