// moekit/tensor.hpp — the plain tensor view every public entry takes, and the error types.
//
// A Tensor is a non-owning view of contiguous, row-major device (or host) memory with a dtype
// and a shape. Entries validate views against what they expect and throw moekit::Error naming
// the argument; an empty view (data == nullptr, rank 0) means "not given".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace moekit {

// e4m3: 8-bit floating point E4M3 (OCP FP8 "E4M3FN": no infinities, one NaN pattern, finite range
// ±448; PyTorch's float8_e4m3fn), the expert weights' and activations' type of FP8 plans.
// i64: 64-bit signed integers (torch.int64), the type of the opt-in load counter (moe.hpp,
// expert_load).
enum class DType : int { bf16, f32, i32, e4m3, i64 };

const char* dtype_name(DType d);
int64_t dtype_bytes(DType d);

// Thrown for invalid arguments: the message names the argument and what was expected.
struct Error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Thrown when the CUDA runtime or cuBLAS reports a failure.
struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Tensor {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::bf16;
  int rank = 0;
  int64_t shape[kMaxRank] = {0, 0, 0, 0};

  Tensor() = default;
  Tensor(const void* ptr, DType dt, std::initializer_list<int64_t> dims);

  bool given() const { return data != nullptr || rank > 0; }
  int64_t numel() const;
  int64_t bytes() const { return numel() * dtype_bytes(dtype); }
  int64_t dim(int i) const { return shape[i]; }
  template <class T> T* as() const { return static_cast<T*>(data); }
  std::string shape_str() const;
};

}  // namespace moekit
