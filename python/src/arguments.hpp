// arguments.hpp — the bindings' arguments that are not arrays (bindings.cpp, bindings_backward.cpp):
// names of enum values ('softmax', 'bf16', ...), the router's options, and the device a plan is
// made for (None: the current GPU, an index, or a moekit.DeviceInfo: a described GPU, no GPU
// needed). Each parser names the argument it refuses, as boundary.hpp does for arrays.
#pragma once

#include <nanobind/nanobind.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>

#include "boundary.hpp"
#include "moekit/moe.hpp"

namespace moekit::py {

inline Scoring parse_scoring(const char* fn, const std::string& s) {
  if (s == "softmax") return Scoring::softmax;
  if (s == "sigmoid") return Scoring::sigmoid;
  fail(fn, "scoring", "expected 'softmax' or 'sigmoid', got '" + s + "'");
}

// The precision of the expert GEMMs, by name (include/moekit/moe.hpp, Precision).
inline Precision parse_precision(const char* fn, const std::string& s) {
  if (s == "bf16") return Precision::bf16;
  if (s == "fp8") return Precision::fp8;
  fail(fn, "precision", "expected 'bf16' or 'fp8', got '" + s + "'");
}

inline RouterOptions router_options(const char* fn, const std::string& scoring, bool renormalize, int64_t n_group,
                                    int64_t topk_group, double routed_scaling_factor) {
  RouterOptions o;
  o.scoring = parse_scoring(fn, scoring);
  o.renormalize = renormalize;
  o.n_group = n_group;
  o.topk_group = topk_group;
  o.routed_scaling_factor = float(routed_scaling_factor);
  return o;
}

// ---- devices --------------------------------------------------------------------------------

inline int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it so later calls see a clean state
    return 0;
  }
  return n;
}

[[noreturn]] inline void no_gpu(const char* fn) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  cudaGetLastError();
  throw CudaError(std::string("moekit.") + fn + ": no CUDA GPU is available (" +
                  (err == cudaSuccess ? std::string("0 devices") : std::string(cudaGetErrorString(err))) +
                  "); moekit's kernels need an NVIDIA Hopper GPU (sm_90a). To plan without a GPU, pass "
                  "device=moekit.DeviceInfo(...)");
}

// cudaGetDeviceProperties is slow (it reads every attribute): query each device once (inline: one
// cache for every file of the extension).
inline const DeviceInfo& device_info(const char* fn, int device) {
  static std::map<int, DeviceInfo> cache;
  if (device < 0) {
    if (device_count() == 0) no_gpu(fn);
    if (cudaGetDevice(&device) != cudaSuccess) no_gpu(fn);
  } else if (device >= device_count()) {
    if (device_count() == 0) no_gpu(fn);
    fail(fn, "device", "CUDA device " + std::to_string(device) + " does not exist (" +
                           std::to_string(device_count()) + " visible)");
  }
  auto it = cache.find(device);
  if (it == cache.end()) it = cache.emplace(device, query_device(device)).first;
  return it->second;
}

// A planner's `device` argument: None (the current GPU), a device index, or a moekit.DeviceInfo
// (a described GPU: plans without one). The reference lives as long as the argument.
inline const DeviceInfo& device_arg(const char* fn, nb::handle device) {
  if (nb::isinstance<DeviceInfo>(device)) return nb::cast<const DeviceInfo&>(device);
  int index = -1;
  if (!device.is_none() && !nb::try_cast(device, index))
    throw nb::type_error((std::string("moekit.") + fn +
                          ": argument 'device': expected None, a device index or a moekit.DeviceInfo")
                             .c_str());
  return device_info(fn, index);
}

}  // namespace moekit::py
