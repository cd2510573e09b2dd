// tool_util.hpp — host helpers of the CLI: checked CUDA and cuBLAS calls, an owning device
// buffer, the GPU probe, and the CUDA-event timer every benchmark number comes from. The CLI is
// built on the public headers alone, so it checks its own CUDA calls here.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpu_clocks.hpp"
#include "stats.hpp"  // median
#include "moekit/tensor.hpp"

namespace moekit::cli {

inline void cuda_check(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  throw CudaError(std::string("CUDA error '") + cudaGetErrorString(err) + "' in " + what + " at " + file + ":" +
                  std::to_string(line));
}

inline void cublas_check(cublasStatus_t st, const char* what, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  throw CudaError(std::string("cuBLAS error ") + cublasGetStatusName(st) + " (" + cublasGetStatusString(st) +
                  ") in " + what + " at " + file + ":" + std::to_string(line));
}

}  // namespace moekit::cli

#define MK_CUDA_CHECK(expr) ::moekit::cli::cuda_check((expr), #expr, __FILE__, __LINE__)
// After a <<<>>> launch: configuration errors surface through cudaGetLastError.
#define MK_LAUNCH_CHECK(name) ::moekit::cli::cuda_check(cudaGetLastError(), name, __FILE__, __LINE__)
#define MK_CUBLAS_CHECK(expr) ::moekit::cli::cublas_check((expr), #expr, __FILE__, __LINE__)

namespace moekit::cli {

// One cudaMalloc'ed allocation, freed when the owner goes away (move-only).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(int64_t bytes) : bytes_(bytes) {
    if (bytes > 0) MK_CUDA_CHECK(cudaMalloc(&ptr_, size_t(bytes)));
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  void* get() const { return ptr_; }
  template <class T> T* as() const { return static_cast<T*>(ptr_); }
  int64_t bytes() const { return bytes_; }

 private:
  // A failed free while unwinding must not terminate: report it and go on.
  void release() noexcept {
    if (ptr_ != nullptr) {
      const cudaError_t err = cudaFree(ptr_);
      if (err != cudaSuccess) fprintf(stderr, "moekit: cudaFree failed: %s\n", cudaGetErrorString(err));
    }
    ptr_ = nullptr;
  }
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

// n elements of T from the device (synchronous cudaMemcpy).
template <class T>
std::vector<T> copy_to_host(const void* p, int64_t n) {
  std::vector<T> v(size_t(std::max<int64_t>(n, 0)));
  if (n > 0) MK_CUDA_CHECK(cudaMemcpy(v.data(), p, size_t(n) * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// Owning wrappers of a stream and a cuBLAS handle bound to it.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { MK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};
struct Cublas {
  cublasHandle_t h = nullptr;
  explicit Cublas(cudaStream_t s) {
    MK_CUBLAS_CHECK(cublasCreate(&h));
    MK_CUBLAS_CHECK(cublasSetStream(h, s));
  }
  ~Cublas() { cublasDestroy(h); }
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;
};

// What kind of GPU this process sees. bench needs Hopper (sm_90a); check falls back to the CPU.
enum class GpuKind { none, other, hopper };
struct GpuProbe {
  GpuKind kind = GpuKind::none;
  std::string detail;  // why there is none, or the device's name and compute capability
};
inline GpuProbe probe_gpu() {
  GpuProbe p;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not a sticky error: clear it so no later check reports it again
    p.detail = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err);
    return p;
  }
  if (count == 0) {
    p.detail = "cudaGetDeviceCount returned 0 devices";
    return p;
  }
  int dev = 0;
  MK_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  p.detail = std::string(prop.name) + " (compute capability " + std::to_string(prop.major) + "." +
             std::to_string(prop.minor) + ")";
  // sm_90a code runs on compute capability 9.0 only (the "a" features are not forward-compatible).
  p.kind = (prop.major == 9 && prop.minor == 0) ? GpuKind::hopper : GpuKind::other;
  return p;
}

// bench and tune: true on a Hopper GPU; else says plainly what the command needs and what runs
// here instead (on stderr), and the caller exits with kExitNoGpu.
inline bool require_hopper(const char* command, const char* why, const char* instead) {
  const GpuProbe gpu = probe_gpu();
  if (gpu.kind == GpuKind::hopper) return true;
  std::fprintf(stderr, "moekit %s needs an NVIDIA Hopper GPU (sm_90a: H100 or H200)%s.\n  %s: %s.\n  %s\n", command, why,
               gpu.kind == GpuKind::none ? "No CUDA device found" : "This GPU is not supported", gpu.detail.c_str(),
               instead);
  return false;
}

// Runs body(i) `warmup` times, then `steps` times between CUDA events, and returns the median
// step time in ms. All events are recorded up front and read after one final synchronisation:
// no host sync inside the timed region. `i` counts every call (warm-up included), so a body that
// rotates among weight copies by i keeps rotating through the warm-up into the timed steps.
inline double time_median_ms(cudaStream_t stream, int warmup, int steps, const std::function<void(int)>& body) {
  if (steps < 1) throw Error("--steps: must be at least 1, got " + std::to_string(steps));
  std::vector<cudaEvent_t> ev(size_t(2 * steps), nullptr);
  struct Destroy {
    std::vector<cudaEvent_t>& ev;
    ~Destroy() {
      for (cudaEvent_t e : ev)
        if (e) cudaEventDestroy(e);
    }
  } destroy{ev};
  for (cudaEvent_t& e : ev) MK_CUDA_CHECK(cudaEventCreate(&e));
  int call = 0;
  for (int i = 0; i < warmup; ++i) body(call++);
  for (int i = 0; i < steps; ++i) {
    MK_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * i)], stream));
    body(call++);
    MK_CUDA_CHECK(cudaEventRecord(ev[size_t(2 * i + 1)], stream));
  }
  // While the timed steps run, the host samples the SM clock and power every 2 ms (gpu_clocks.hpp):
  // it polls the last event instead of blocking on it, which the GPU's timeline does not see.
  std::vector<ClockSample> samples;
  MK_CUDA_CHECK(cudaGetLastError());  // a launch's error first: the polls below may overwrite the last error
  while (cudaEventQuery(ev.back()) == cudaErrorNotReady) {
    const std::optional<ClockSample> c = sample_gpu_clocks();
    if (!c) break;  // no NVML: block on the event below
    if (cudaEventQuery(ev.front()) == cudaSuccess) samples.push_back(*c);  // inside the timed steps
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();  // the polls' "not yet", no error
  set_last_timed_clocks(summarize_clocks(samples));
  MK_CUDA_CHECK(cudaEventSynchronize(ev.back()));
  MK_CUDA_CHECK(cudaGetLastError());
  std::vector<double> ms(static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    float t = 0;
    MK_CUDA_CHECK(cudaEventElapsedTime(&t, ev[size_t(2 * i)], ev[size_t(2 * i + 1)]));
    ms[size_t(i)] = t;
  }
  return median(ms);
}

}  // namespace moekit::cli
