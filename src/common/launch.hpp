// launch.hpp — every moekit kernel is launched with programmatic dependent launch (PDL): the
// next kernel of the layer is scheduled while the current one drains, and waits in-kernel
// (pdl_wait) before it reads anything a predecessor wrote. Launch latency and grid tails overlap
// instead of adding up — what decode, a chain of short kernels, is made of. Graph-capture safe.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "common/cuda_check.hpp"

namespace moekit::detail {

// cudaLaunchKernelEx with N launch attributes, checked.
template <size_t N, class... KernelParams, class... Args>
void launch_with(const char* name, const cudaLaunchAttribute (&attrs)[N], void (*kernel)(KernelParams...), dim3 grid,
                 dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute copy[N];
  for (size_t i = 0; i < N; ++i) copy[i] = attrs[i];
  cfg.attrs = copy;
  cfg.numAttrs = unsigned(N);
  cuda_check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), name, __FILE__, __LINE__);
}

inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  return attr;
}
inline cudaLaunchAttribute cluster_attribute(unsigned cluster_x) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster_x;
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  return attr;
}

template <class... KernelParams, class... Args>
void launch_pdl(const char* name, void (*kernel)(KernelParams...), dim3 grid, dim3 block, size_t smem,
                cudaStream_t stream, Args&&... args) {
  const cudaLaunchAttribute attrs[1] = {pdl_attribute()};
  launch_with(name, attrs, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// PDL with clusters of `cluster_x` CTAs along x (grid.x a multiple of it).
template <class... KernelParams, class... Args>
void launch_pdl_cluster(const char* name, unsigned cluster_x, void (*kernel)(KernelParams...), dim3 grid, dim3 block,
                        size_t smem, cudaStream_t stream, Args&&... args) {
  const cudaLaunchAttribute attrs[2] = {pdl_attribute(), cluster_attribute(cluster_x)};
  launch_with(name, attrs, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// A cooperative launch (every CTA resident at once, so the kernel may barrier across the grid):
// no PDL attribute, so it starts after its predecessor completes; its own pdl_trigger still lets
// the next PDL kernel queue behind it. Graph-capture safe.
template <class... KernelParams, class... Args>
void launch_cooperative(const char* name, void (*kernel)(KernelParams...), dim3 grid, dim3 block, size_t smem,
                        cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attrs[1] = {};
  attrs[0].id = cudaLaunchAttributeCooperative;
  attrs[0].val.cooperative = 1;
  launch_with(name, attrs, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace moekit::detail
