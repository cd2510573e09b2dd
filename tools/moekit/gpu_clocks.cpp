// gpu_clocks.cpp — NVML opened at run time for gpu_clocks.hpp. The driver ships libnvidia-ml.so.1;
// the CUDA toolkit here ships no nvml.h, so the five entry points are declared from NVML's
// documented, stable C ABI (nvml.h: nvmlReturn_t is an int enum, NVML_SUCCESS = 0; a device is an
// opaque pointer; NVML_CLOCK_SM = 1; power in milliwatts). Linking NVML instead would make the CLI
// fail to start on a machine without the driver (CI).
#include "gpu_clocks.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

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
  nvmlDevice_t device = nullptr;
  ClockInfoFn clock_info = nullptr;
  PowerFn power = nullptr;
  ReasonsFn reasons = nullptr;  // may be missing (older drivers name it ...ThrottleReasons)

  Nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
    auto by_bus = reinterpret_cast<HandleByBusIdFn>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    clock_info = reinterpret_cast<ClockInfoFn>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    power = reinterpret_cast<PowerFn>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    reasons = reinterpret_cast<ReasonsFn>(dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons"));
    if (!reasons) reasons = reinterpret_cast<ReasonsFn>(dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons"));
    if (!init || !by_bus || !clock_info || !power || init() != kNvmlSuccess) return;
    int dev = 0;
    char bus_id[32] = {};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, dev) != cudaSuccess) {
      (void)cudaGetLastError();  // no GPU: leave no error behind for the CLI's own checks
      return;
    }
    ok = by_bus(bus_id, &device) == kNvmlSuccess;
  }
};

std::optional<ClockStats> g_last;

}  // namespace

std::optional<ClockSample> sample_gpu_clocks() {
  static const Nvml nvml;  // bound once, to the device current at the first sample
  if (!nvml.ok) return std::nullopt;
  ClockSample s;
  unsigned long long reasons = 0;
  if (nvml.clock_info(nvml.device, kNvmlClockSm, &s.sm_mhz) != kNvmlSuccess) return std::nullopt;
  if (nvml.power(nvml.device, &s.power_mw) != kNvmlSuccess) s.power_mw = 0;
  if (nvml.reasons && nvml.reasons(nvml.device, &reasons) == kNvmlSuccess) s.reasons = reasons;
  return s;
}

void set_last_timed_clocks(std::optional<ClockStats> s) { g_last = s; }
std::optional<ClockStats> last_timed_clocks() { return g_last; }

}  // namespace moekit::cli
