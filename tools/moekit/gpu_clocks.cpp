// gpu_clocks.cpp — NVML opened at run time for gpu_clocks.hpp. The driver ships libnvidia-ml.so.1;
// the CUDA toolkit here ships no nvml.h, so the five entry points are declared from NVML's
// documented, stable C ABI, checked against nvml.h of NVML 13.5 (PyPI nvidia-nvml-dev): nvmlReturn_t
// is an int enum, NVML_SUCCESS = 0; a device is an opaque pointer; NVML_CLOCK_SM = 1; power in
// milliwatts; the reason bits as gpu_clocks.hpp names them. Linking NVML instead would make the CLI
// fail to start on a machine without the driver (CI).
#include "gpu_clocks.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <utility>
#include <vector>

namespace moekit::cli {
namespace {

using nvmlDevice_t = struct nvmlDevice_st*;
using InitFn = int (*)();
using HandleByBusIdFn = int (*)(const char*, nvmlDevice_t*);
using ClockInfoFn = int (*)(nvmlDevice_t, int, unsigned*);
using PowerFn = int (*)(nvmlDevice_t, unsigned*);
using ReasonsFn = int (*)(nvmlDevice_t, unsigned long long*);
constexpr int kNvmlSuccess = 0, kNvmlClockSm = 1;

struct Nvml {
  bool ok = false;
  HandleByBusIdFn by_bus = nullptr;
  ClockInfoFn clock_info = nullptr;
  PowerFn power = nullptr;
  ReasonsFn reasons = nullptr;  // may be missing (older drivers name it ...ThrottleReasons)

  Nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
    by_bus = reinterpret_cast<HandleByBusIdFn>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    clock_info = reinterpret_cast<ClockInfoFn>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    power = reinterpret_cast<PowerFn>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    reasons = reinterpret_cast<ReasonsFn>(dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons"));
    if (!reasons) reasons = reinterpret_cast<ReasonsFn>(dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons"));
    ok = init && by_bus && clock_info && power && init() == kNvmlSuccess;
  }
  // The NVML handle of the current CUDA device (by its PCI bus id), looked up once per device: the
  // EP bench switches devices on one thread.
  nvmlDevice_t current() {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return (void)cudaGetLastError(), nullptr;
    if (size_t(dev) >= handles.size()) handles.resize(size_t(dev) + 1, {false, nullptr});
    auto& [looked, handle] = handles[size_t(dev)];
    if (!looked) {
      looked = true;
      char bus_id[32] = {};
      if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, dev) != cudaSuccess || by_bus(bus_id, &handle) != kNvmlSuccess) {
        (void)cudaGetLastError();  // leave no error behind for the CLI's own checks
        handle = nullptr;
      }
    }
    return handle;
  }
  std::vector<std::pair<bool, nvmlDevice_t>> handles;  // per CUDA device: looked up yet, handle
};

thread_local std::optional<ClockStats> g_last;

}  // namespace

std::optional<ClockSample> sample_gpu_clocks() {
  static Nvml nvml;  // opened once; the CLI samples from one host thread
  if (!nvml.ok) return std::nullopt;
  const nvmlDevice_t device = nvml.current();
  if (!device) return std::nullopt;
  ClockSample s;
  unsigned long long reasons = 0;
  if (nvml.clock_info(device, kNvmlClockSm, &s.sm_mhz) != kNvmlSuccess) return std::nullopt;
  if (nvml.power(device, &s.power_mw) != kNvmlSuccess) s.power_mw = 0;
  if (nvml.reasons && nvml.reasons(device, &reasons) == kNvmlSuccess) s.reasons = reasons;
  return s;
}

void set_last_timed_clocks(std::optional<ClockStats> s) { g_last = s; }
std::optional<ClockStats> last_timed_clocks() { return g_last; }

}  // namespace moekit::cli
