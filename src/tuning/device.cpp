// device.cpp — what the planner knows of a GPU, read from the device: query_device() for the
// caller's plan, and a per-device cache of it for the entries that plan on their own (route()).
#include <cuda_runtime_api.h>

#include "common/cuda_check.hpp"
#include "common/per_device.hpp"
#include "moekit/moe.hpp"
#include "tuning/planner.hpp"

namespace moekit {

DeviceInfo query_device(int device) {
  if (device < 0) MK_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp p{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  DeviceInfo d;
  d.name = p.name;
  d.sm_count = p.multiProcessorCount;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.smem_per_block_optin = int64_t(p.sharedMemPerBlockOptin);
  d.l2_bytes = p.l2CacheSize;
  return d;
}

namespace tuning {
const DeviceInfo& current_device() {
  // cudaGetDeviceProperties costs tens of microseconds: once per device, not per call.
  static detail::PerDevice<const DeviceInfo*> cache;
  return *cache.get([](int device) { return new DeviceInfo(query_device(device)); });
}
}  // namespace tuning

}  // namespace moekit
