// launch.hpp — every moekit kernel is launched with programmatic dependent launch (PDL): the
// next kernel of the layer is scheduled while the current one drains, and waits in-kernel
// (pdl_wait) before it reads anything a predecessor wrote. Launch latency and grid tails overlap
// instead of adding up — what decode, a chain of short kernels, is made of. Graph-capture safe.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "common/cuda_check.hpp"

namespace moekit::detail {

template <class... KernelParams, class... Args>
void launch_pdl(const char* name, void (*kernel)(KernelParams...), dim3 grid, dim3 block, size_t smem,
                cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cuda_check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), name, __FILE__, __LINE__);
}

}  // namespace moekit::detail
