// launch.hpp — stage 5's internal launchers (host-only): the layer, combine() / combine_partials()
// and the EP path call them on validated arguments. No kernels here: each lives in combine.cu's
// translation unit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moekit::detail {

// y[t] = sum_j rows[row_of ? row_of[t*k + j] : t*k + j] in slot order j (row_of -1: absent, adds
// nothing): bf16 rows [*, hidden] and y [tokens, hidden], hidden a multiple of 8. With row_of the
// rows sit anywhere (the EP path's returned rows).
void launch_combine(const void* rows, const int32_t* row_of, void* y, int64_t tokens, int64_t hidden, int topk,
                    cudaStream_t stream);
// y[t] = sum_j sum_s partials[s][t*k + j] (j outer, s inner; FP32, bf16 out): split-K's combine.
void launch_combine_partials(const float* partials, int splits, void* y, int64_t tokens, int64_t hidden, int topk,
                             cudaStream_t stream);

}  // namespace moekit::detail
