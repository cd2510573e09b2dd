// per_device.hpp — one-time launch setup (the shared-memory opt-in, grid sizes from the SM count
// and occupancy), done once per kernel instance *and device*: cudaFuncSetAttribute applies to the
// current device only, and devices may differ in SM count. One process may drive several GPUs
// (the Python bindings switch the current device per call; expert parallelism runs a rank per GPU).
// The first call on a device does the setup, so capture a CUDA graph after one eager call there.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <mutex>
#include <optional>
#include <string>

#include "common/cuda_check.hpp"
#include "moekit/tensor.hpp"

namespace moekit::detail {

inline constexpr int kMaxDevices = 64;

template <class T>
class PerDevice {
 public:
  // The value for the current device, made by make(device) on first use there.
  template <class Make>
  T get(Make make) {
    int device = 0;
    MK_CUDA_CHECK(cudaGetDevice(&device));
    if (device < 0 || device >= kMaxDevices)
      throw CudaError("moekit supports devices 0.." + std::to_string(kMaxDevices - 1) + ", got " + std::to_string(device));
    std::lock_guard<std::mutex> lock(mutex_);
    std::optional<T>& v = values_[size_t(device)];
    if (!v) v = make(device);
    return *v;
  }

 private:
  std::mutex mutex_;
  std::array<std::optional<T>, kMaxDevices> values_{};
};

}  // namespace moekit::detail
