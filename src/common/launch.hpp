// launch.hpp — every moekit kernel is launched with programmatic dependent launch (PDL): the
// next kernel of the layer is scheduled while the current one drains, and waits in-kernel
// (pdl_wait) before it reads anything a predecessor wrote. Launch latency and grid tails overlap
// instead of adding up — what decode, a chain of short kernels, is made of. Graph-capture safe.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/cuda_check.hpp"

namespace moekit::detail {

// cudaLaunchKernelEx with one launch attribute, checked.
template <class... KernelParams, class... Args>
void launch_with(const char* name, const cudaLaunchAttribute& attr, void (*kernel)(KernelParams...), dim3 grid,
                 dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[1] = {attr};
  cfg.attrs = attrs;
  cfg.numAttrs = 1;
  cuda_check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), name, __FILE__, __LINE__);
}

template <class... KernelParams, class... Args>
void launch_pdl(const char* name, void (*kernel)(KernelParams...), dim3 grid, dim3 block, size_t smem,
                cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  launch_with(name, attr, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// A cooperative launch (every CTA resident at once, so the kernel may barrier across the grid):
// no PDL attribute, so it starts after its predecessor completes; its own pdl_trigger still lets
// the next PDL kernel queue behind it. Graph-capture safe.
template <class... KernelParams, class... Args>
void launch_cooperative(const char* name, void (*kernel)(KernelParams...), dim3 grid, dim3 block, size_t smem,
                        cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  launch_with(name, attr, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace moekit::detail
