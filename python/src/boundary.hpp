// boundary.hpp — where Python arrays become moekit::Tensor views (bindings.cpp's helpers).
//
// A Call converts the arguments of one entry: an array with DLPack support (or a capsule),
// then its dtype (bf16, f32, i32, i64 — the load counter's — or e4m3: DLPack's float8_e4m3fn,
// torch.float8_e4m3fn), rank, row-major strides and finally its CUDA device — in that order, so
// that what is wrong with an array itself is reported on any machine — and throws moekit::Error
// naming the argument. It
// keeps the imported arrays alive for the call and checks that they share one device;
// DeviceScope makes that device current while the kernels launch.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moekit/moe.hpp"

namespace moekit::py {

namespace nb = nanobind;

// NOTES: inputs are imported read-only (nb::ro) so read-only producers (JAX, read-only NumPy)
// are accepted; outputs and the workspace must be writable.
using InArray = nb::ndarray<nb::ro>;
using OutArray = nb::ndarray<>;

[[noreturn]] inline void fail(const char* fn, const char* arg, const std::string& what) {
  throw Error(std::string("moekit.") + fn + ": argument '" + arg + "': " + what);
}

inline const char* device_name(int device_type) {
  switch (device_type) {
    case nb::device::cpu::value: return "cpu";
    case nb::device::cuda::value: return "cuda";
    case nb::device::cuda_host::value: return "cuda_host (pinned host memory)";
    case nb::device::cuda_managed::value: return "cuda_managed";
    case nb::device::rocm::value: return "rocm";
    case nb::device::metal::value: return "metal";
    default: return "an unsupported device";
  }
}

inline std::string dtype_str(nb::dlpack::dtype d) {
  std::string base;
  switch (nb::dlpack::dtype_code(d.code)) {
    case nb::dlpack::dtype_code::Int: base = "int"; break;
    case nb::dlpack::dtype_code::UInt: base = "uint"; break;
    case nb::dlpack::dtype_code::Float: base = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: base = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: base = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    case nb::dlpack::dtype_code::Float8_E4M3FN: return "float8_e4m3fn";
    case nb::dlpack::dtype_code::Float8_E5M2: return "float8_e5m2";
    case nb::dlpack::dtype_code::Float8_E4M3FNUZ: return "float8_e4m3fnuz";
    case nb::dlpack::dtype_code::Float8_E5M2FNUZ: return "float8_e5m2fnuz";
    default: base = "code" + std::to_string(d.code) + "_"; break;
  }
  std::string s = base + std::to_string(d.bits);
  if (d.lanes != 1) s += "x" + std::to_string(d.lanes);
  return s;
}

inline std::string shape_str(const int64_t* v, size_t n) {
  std::string s = "[";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

inline bool is_dtype(nb::dlpack::dtype d, nb::dlpack::dtype_code code, int bits) {
  return d.code == uint8_t(code) && d.bits == bits && d.lanes == 1;
}

// The arguments of one call, converted at the boundary. Keeps the imported arrays alive for the
// call and checks that they all live on one CUDA device.
class Call {
 public:
  explicit Call(const char* fn) : fn_(fn) {}

  // A required input (read-only access).
  Tensor in(const char* arg, nb::handle h) { return convert<InArray>(arg, h); }
  // An optional input: None means "not given".
  Tensor in_opt(const char* arg, nb::handle h) { return h.is_none() ? Tensor() : in(arg, h); }
  // A required output (written by the kernels).
  Tensor out(const char* arg, nb::handle h) { return convert<OutArray>(arg, h); }
  // An optional output (expert_load, added to in place): None means "not given".
  Tensor out_opt(const char* arg, nb::handle h) { return h.is_none() ? Tensor() : out(arg, h); }

  // A caller's workspace: a contiguous CUDA byte buffer of at least `need` bytes (the plan's
  // plan.workspace_bytes), starting on a 256-byte boundary; its base and size.
  struct Buffer {
    void* base;
    size_t bytes;
  };
  Buffer buffer(const char* arg, nb::handle h, size_t need) {
    const Tensor raw = convert<OutArray>(arg, h, /*any_dtype=*/true);
    const Buffer b{raw.data, size_t(raw_bytes_)};
    if (b.bytes < need)
      fail(fn_, arg, "has " + std::to_string(b.bytes) + " bytes; this plan needs plan.workspace_bytes = " +
                         std::to_string(need));
    if (reinterpret_cast<uintptr_t>(b.base) % 256 != 0)
      fail(fn_, arg, "must start on a 256-byte boundary (a fresh allocation does; a slice may not)");
    return b;
  }

  // The forward's workspace (at least workspace_bytes(plan)), as the raw buffer (for the entries
  // that carve it themselves) and carved.
  struct WorkspaceArg {
    void* base;
    size_t bytes;
    Workspace ws;
  };
  WorkspaceArg workspace(const ForwardPlan& plan, nb::handle h) {
    const Buffer b = buffer("workspace", h, moekit::workspace_bytes(plan));
    return WorkspaceArg{b.base, b.bytes, carve_workspace(plan, b.base, b.bytes)};
  }

  // The device every array is on (the current device when none was given).
  int device() const {
    if (device_ >= 0) return device_;
    int d = 0;
    cudaError_t err = cudaGetDevice(&d);
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw CudaError(std::string("moekit.") + fn_ + ": no CUDA device is usable (" + cudaGetErrorString(err) + ")");
    }
    return d;
  }

 private:
  template <class Array>
  Tensor convert(const char* arg, nb::handle h, bool any_dtype = false) {
    Array a;
    // Checked in this order: an array at all, dtype, rank, strides, then the device.
    if (h.is_none()) fail(fn_, arg, "is required but was None");
    if (!nb::try_cast(h, a, /*convert=*/false)) {
      const std::string tn = nb::cast<std::string>(nb::type_name(h.type()));
      throw nb::type_error((std::string("moekit.") + fn_ + ": argument '" + arg +
                            "': expected an array with DLPack support (torch.Tensor, CuPy array, DLPack capsule), got " + tn)
                               .c_str());
    }
    Tensor t;
    const nb::dlpack::dtype d = a.dtype();
    if (is_dtype(d, nb::dlpack::dtype_code::Bfloat, 16)) t.dtype = DType::bf16;
    else if (is_dtype(d, nb::dlpack::dtype_code::Float, 32)) t.dtype = DType::f32;
    else if (is_dtype(d, nb::dlpack::dtype_code::Int, 32)) t.dtype = DType::i32;
    else if (is_dtype(d, nb::dlpack::dtype_code::Int, 64)) t.dtype = DType::i64;
    else if (is_dtype(d, nb::dlpack::dtype_code::Float8_E4M3FN, 8)) t.dtype = DType::e4m3;
    else if (!any_dtype)
      fail(fn_, arg, "expected dtype bf16, f32, i32, i64 or e4m3 (float8_e4m3fn) (as the entry documents), got " +
                         dtype_str(d));
    const size_t nd = a.ndim();
    if (nd > size_t(Tensor::kMaxRank) && !any_dtype)
      fail(fn_, arg, "expected at most " + std::to_string(Tensor::kMaxRank) + " dimensions, got " + std::to_string(nd));
    // Row-major contiguous (strides in elements); dimensions of extent 1 may have any stride.
    int64_t expect = 1;
    for (size_t i = nd; i-- > 0;) {
      if (a.shape(i) != 1 && a.stride(i) != expect)
        fail(fn_, arg, "must be contiguous (row-major): shape " + shape_str(a.shape_ptr(), nd) + " has strides " +
                           shape_str(a.stride_ptr(), nd) + " (in elements); pass a contiguous copy");
      expect *= int64_t(a.shape(i));
    }
    if (any_dtype && nd != 1) fail(fn_, arg, "expected a 1-D byte buffer, got " + std::to_string(nd) + " dimensions");
    // The device last: what is wrong with an array's type or layout is reported even on a CPU.
    if (a.device_type() != nb::device::cuda::value)
      fail(fn_, arg, std::string("expected a CUDA device array, got one on ") + device_name(a.device_type()));
    if (device_ < 0) {
      device_ = a.device_id();
      device_arg_ = arg;
    } else if (a.device_id() != device_) {
      fail(fn_, arg, "is on CUDA device " + std::to_string(a.device_id()) + " but '" + device_arg_ +
                         "' is on CUDA device " + std::to_string(device_));
    }
    t.data = const_cast<void*>(static_cast<const void*>(a.data()));
    if (any_dtype) {
      raw_bytes_ = int64_t(a.nbytes());
      t.rank = 1;
      t.shape[0] = raw_bytes_;
    } else {
      t.rank = int(nd);
      for (size_t i = 0; i < nd; ++i) t.shape[i] = int64_t(a.shape(i));
    }
    keep(std::move(a));
    return t;
  }

  // The imported arrays own their DLPack tensors (a capsule's producer may hold the only other
  // reference): keep them until the call returns.
  void keep(InArray&& a) { keep_in_.push_back(std::move(a)); }
  void keep(OutArray&& a) { keep_out_.push_back(std::move(a)); }

  const char* fn_;
  int device_ = -1;
  const char* device_arg_ = "";
  int64_t raw_bytes_ = 0;
  std::vector<InArray> keep_in_;
  std::vector<OutArray> keep_out_;
};

// Makes `device` current for the scope of one call (the kernels launch on the current device).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device) cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  static void cuda(cudaError_t err, const char* what) {
    if (err == cudaSuccess) return;
    cudaGetLastError();
    throw CudaError(std::string("moekit: ") + what + " failed: " + cudaGetErrorString(err));
  }
  int prev_ = -1;
};

inline cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// Runs `launch` (the library call) on the device of the call's arrays, with the GIL released.
template <class Launch>
void launch_on_device(const Call& c, Launch&& launch) {
  DeviceScope dev(c.device());
  nb::gil_scoped_release nogil;
  launch();
}

}  // namespace moekit::py
