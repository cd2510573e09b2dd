// cuda_check.hpp — every CUDA runtime call and launch is checked; failures throw CudaError.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "moekit/tensor.hpp"

namespace moekit::detail {

inline void cuda_check(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  throw CudaError(std::string("CUDA error '") + cudaGetErrorString(err) + "' in " + what + " at " +
                  file + ":" + std::to_string(line));
}

}  // namespace moekit::detail

#define MK_CUDA_CHECK(expr) ::moekit::detail::cuda_check((expr), #expr, __FILE__, __LINE__)
// After a <<<>>> launch: configuration errors surface through cudaGetLastError.
#define MK_LAUNCH_CHECK(name) ::moekit::detail::cuda_check(cudaGetLastError(), name, __FILE__, __LINE__)
