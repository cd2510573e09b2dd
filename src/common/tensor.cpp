// tensor.cpp — Tensor view helpers and dtype names of moekit/tensor.hpp (host only).
#include "moekit/tensor.hpp"

namespace moekit {

const char* dtype_name(DType d) {
  switch (d) {
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::i32: return "i32";
    case DType::e4m3: return "e4m3";
    case DType::i64: return "i64";
  }
  return "?";
}

int64_t dtype_bytes(DType d) {
  switch (d) {
    case DType::bf16: return 2;
    case DType::e4m3: return 1;
    case DType::f32:
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

Tensor::Tensor(const void* ptr, DType dt, std::initializer_list<int64_t> dims)
    : data(const_cast<void*>(ptr)), dtype(dt), rank(int(dims.size())) {
  if (dims.size() > size_t(kMaxRank)) throw Error("Tensor: rank above 4 is not supported");
  int i = 0;
  for (int64_t d : dims) shape[i++] = d;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return rank == 0 ? 0 : n;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace moekit
