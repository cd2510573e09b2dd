// baseline_kernels.cuh — what the cuBLAS baselines of the forward (baselines.cu) and of the
// backward (backward_baseline.cu) share: a grid-stride launch size, and the gather of activation
// rows into expert order that each baseline runs once, untimed, before it times its GEMMs.
// Everything here is in an anonymous namespace (as in ceilings.cuh): each includer gets its own
// kernel, so no definition is shared across units.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

namespace moekit::cli {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;  // grid-stride beyond this: plenty to fill any GPU

unsigned blocks_for(int64_t n) { return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks))); }

// out[r] = x[src_token[r]], 16-byte vectors (H % 8 == 0).
__global__ void gather_rows_kernel(const uint4* __restrict__ x, const int32_t* __restrict__ src_token,
                                   uint4* __restrict__ out, int64_t rows, int64_t vecs_per_row) {
  const int64_t n = rows * vecs_per_row, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / vecs_per_row, c = i % vecs_per_row;
    out[i] = x[int64_t(src_token[r]) * vecs_per_row + c];
  }
}

}  // namespace

}  // namespace moekit::cli
