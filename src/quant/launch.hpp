// launch.hpp — the FP8 quantizers' internal launchers (host-only): the layer, quantize_tokens() and
// quantize_weights() call them on validated arguments. The kernels live in quantize.cu's
// translation unit (quantize.cuh). Neither allocates nor synchronises: graph-capture safe.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moekit::detail {

// x [tokens, hidden] bf16 -> x_q [tokens, hidden] e4m3 and x_scale [tokens, ceil(hidden/128)] f32,
// per token row and 128-column group (the last group partial when hidden % 128 != 0); hidden a
// multiple of 16, pointers 16-byte aligned.
void launch_quantize_tokens(const void* x_bf16, int64_t tokens, int64_t hidden, void* x_q, float* x_scale,
                            cudaStream_t stream);
// w [projections, rows, cols] bf16 -> q (same shape) e4m3 and scale [projections, ceil(rows/128),
// ceil(cols/128)] f32, per 128 x 128 block (partial at the edges); cols a multiple of 16.
void launch_quantize_weights(const void* w_bf16, int64_t projections, int64_t rows, int64_t cols, void* q,
                             float* scale, cudaStream_t stream);

}  // namespace moekit::detail
