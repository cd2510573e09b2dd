// gpu_util.hpp — helpers of the GPU tests: the skip-without-GPU fixture, device buffers,
// fresh random inputs, poisoning, and a host-side model of one layer.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/cuda_check.hpp"
#include "errors.hpp"
#include "moekit/moe.hpp"
#include "moekit/reference.hpp"

namespace moekit::test {

using test_errors::throws_naming;

// GPU tests skip (visibly: ctest reports "Skipped") when there is no CUDA device.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      cudaGetLastError();
      GTEST_SKIP() << "no CUDA GPU on this machine: GPU tests run in scripts/gpu-check";
    }
    MK_CUDA_CHECK(cudaStreamCreate(&stream));
  }
  void TearDown() override {
    if (stream) cudaStreamDestroy(stream);
  }
  cudaStream_t stream = nullptr;
};

// A fresh seed per run (printed on failure via SCOPED_TRACE by the callers).
inline uint64_t fresh_seed() { return (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}(); }

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : count(n) {
    if (n) MK_CUDA_CHECK(cudaMalloc(&ptr, n * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), count(o.count) { o.ptr = nullptr, o.count = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr, o.ptr), std::swap(count, o.count);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  void upload(const std::vector<T>& host) {
    MK_CUDA_CHECK(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download(size_t n = size_t(-1)) const {
    std::vector<T> host(n == size_t(-1) ? count : n);
    if (!host.empty()) MK_CUDA_CHECK(cudaMemcpy(host.data(), ptr, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // Poison: all bits set (NaN for floats and bf16, -1 for ints) so unwritten outputs show.
  void poison() {
    if (count) MK_CUDA_CHECK(cudaMemset(ptr, 0xff, count * sizeof(T)));
  }
};

// A checking kernel's one result (counts, the first failure): zeroed on the device, filled by
// launch(pointer) on `stream`, read back once the stream is done.
template <class T, class Launch>
T device_result(cudaStream_t stream, Launch&& launch) {
  DeviceBuffer<T> d(1);
  MK_CUDA_CHECK(cudaMemsetAsync(d.ptr, 0, sizeof(T), stream));
  launch(d.ptr);
  MK_CUDA_CHECK(cudaGetLastError());
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  return d.download()[0];
}

// One captured CUDA graph (global capture mode: a sync or allocation inside fails), replayable.
class CapturedGraph {
 public:
  template <class F>
  CapturedGraph(cudaStream_t stream, F&& enqueue) {
    MK_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    enqueue();
    MK_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
    MK_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
  }
  void launch(cudaStream_t stream) const { MK_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// The bits of floats, for bitwise comparisons that also hold for NaN payloads and -0.
inline std::vector<uint32_t> float_bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

inline std::vector<ref::bf16> random_bf16(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<ref::bf16> v(n);
  for (auto& x : v) x = ref::to_bf16(d(rng));
  return v;
}
inline std::vector<float> random_f32(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
// Small integers in [-r, r] as bf16: GEMMs over them are exact in FP32.
inline std::vector<ref::bf16> small_int_bf16(size_t n, std::mt19937_64& rng, int r) {
  std::uniform_int_distribution<int> d(-r, r);
  std::vector<ref::bf16> v(n);
  for (auto& x : v) x = ref::to_bf16(float(d(rng)));
  return v;
}

// Host inputs of one expert-GEMM test: random (weights scaled 1/sqrt(K)) or small integers with
// power-of-two routing weights, for which the GEMMs are exact in FP32.
struct GemmInputs {
  std::vector<ref::bf16> x, w13, w2;  // [T,H], [E,2F,H], [E,H,F]
  std::vector<float> weights;         // [T*k]
};
inline GemmInputs make_gemm_inputs(const MoeShape& s, std::mt19937_64& rng, bool small_ints) {
  GemmInputs in;
  const size_t nx = size_t(s.tokens * s.hidden), n13 = size_t(s.experts * 2 * s.inter * s.hidden),
               n2 = size_t(s.experts * s.hidden * s.inter);
  in.x = small_ints ? small_int_bf16(nx, rng, 2) : random_bf16(nx, rng);
  in.w13 = small_ints ? small_int_bf16(n13, rng, 1) : random_bf16(n13, rng, 1.0f / std::sqrt(float(s.hidden)));
  in.w2 = small_ints ? small_int_bf16(n2, rng, 2) : random_bf16(n2, rng, 1.0f / std::sqrt(float(s.inter)));
  in.weights.resize(size_t(s.tokens * s.topk));
  for (auto& w : in.weights) w = small_ints ? std::ldexp(1.0f, int(rng() % 5) - 2) : float(rng() % 1000) / 1000.0f + 0.01f;
  return in;
}

// The GEMM tests' device side: copies of the inputs and a poisoned workspace for `plan`, already
// aligned from `ids` on `stream` (what both expert GEMMs read).
struct AlignedGemmInputs {
  DeviceBuffer<ref::bf16> x, w13, w2;
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<float> weights;
  DeviceBuffer<unsigned char> ws_buf;
  Workspace ws;
  AlignedGemmInputs(const ForwardPlan& plan, const GemmInputs& in, const std::vector<int32_t>& topk_ids,
                    cudaStream_t stream)
      : x(in.x), w13(in.w13), w2(in.w2), ids(topk_ids), weights(in.weights), ws_buf(workspace_bytes(plan)) {
    ws_buf.poison();
    ws = carve_workspace(plan, ws_buf.ptr, ws_buf.count);
    align(plan, Tensor(ids.ptr, DType::i32, {plan.shape.tokens, plan.shape.topk}), ws, stream);
  }
};

inline std::vector<float> to_float(const std::vector<ref::bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = ref::to_float(v[i]);
  return f;
}
inline std::vector<double> to_double(const std::vector<ref::bf16>& v) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = ref::to_float(v[i]);
  return d;
}

// Routings the adversarial tests use: each returns topk_ids [T*k] (distinct ids per token).
enum class RoutingKind { Uniform, AllOnOne, EmptyExperts, SingleToken };
inline std::vector<int32_t> make_routing(RoutingKind kind, int64_t T, int64_t k, int64_t E, std::mt19937_64& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<int32_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) perm[size_t(e)] = int32_t(e);
    if (kind == RoutingKind::AllOnOne) {
      // Every token: slot 0 on expert E-1, the rest on the lowest ids (distinct).
      for (int64_t j = 0; j < k; ++j) ids[size_t(t * k + j)] = j == 0 ? int32_t(E - 1) : int32_t(j - 1);
      continue;
    }
    const int64_t pool = kind == RoutingKind::EmptyExperts ? std::max<int64_t>(k, E / 4) : E;
    std::shuffle(perm.begin(), perm.begin() + pool, rng);
    for (int64_t j = 0; j < k; ++j) ids[size_t(t * k + j)] = perm[size_t(j)];
  }
  return ids;
}

// Assignments per expert of `ids` (the load counter's oracle): ids outside [0, E) are not counted.
inline std::vector<int64_t> expert_histogram(const std::vector<int32_t>& ids, int64_t E) {
  std::vector<int64_t> h(static_cast<size_t>(E), 0);
  for (int32_t e : ids)
    if (e >= 0 && e < E) ++h[size_t(e)];
  return h;
}

// Exactly `counts[e]` assignments per expert (sum must be T*k, each token's ids distinct when
// counts allow): used for the 0 / 1 / BLOCK_M / BLOCK_M+1 cases. Assignment a goes to the expert
// round-robin over a per-expert quota, which keeps a token's k ids distinct when every count <= T.
inline std::vector<int32_t> routing_with_counts(const std::vector<int64_t>& counts, int64_t k) {
  std::vector<int32_t> ids;
  for (size_t e = 0; e < counts.size(); ++e)
    for (int64_t c = 0; c < counts[e]; ++c) ids.push_back(int32_t(e));
  // Column-major fill: slot j of token t gets ids[j*T + t], so equal ids land on distinct tokens.
  const int64_t T = int64_t(ids.size()) / k;
  std::vector<int32_t> out(ids.size());
  for (int64_t j = 0; j < k; ++j)
    for (int64_t t = 0; t < T; ++t) out[size_t(t * k + j)] = ids[size_t(j * T + t)];
  return out;
}

}  // namespace moekit::test
