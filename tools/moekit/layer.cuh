// layer.cuh — definitions of layer.hpp: the GPU fill kernel and GpuLayer. Included by bench.cu
// only (the CLI's translation units are listed in CMakeLists.txt), so each symbol is defined once.
#pragma once

#include <cuda_bf16.h>

#include <cmath>

#include "layer.hpp"
#include "rng.hpp"

namespace moekit::cli {

namespace {

constexpr int kFillThreads = 256;
// Grid-stride fill: enough blocks to cover every SM several times, no more (a 15 GB tensor
// would otherwise need billions of blocks).
constexpr int64_t kFillBlocksPerSm = 8;

__global__ void __launch_bounds__(kFillThreads)
    fill_normal_bf16_kernel(__nv_bfloat16* out, int64_t n, float std, uint64_t seed, uint64_t rng_stream) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    __nv_bfloat16 v = __float2bfloat16_rn(std * hash_normal(seed, rng_stream, uint64_t(i)));
    // Never zeros: a draw that rounds to 0 becomes a small value of the same scale.
    if (__bfloat162float(v) == 0.0f) v = __float2bfloat16_rn(std * 0x1p-6f);
    out[i] = v;
  }
}

int fill_blocks(int64_t n) {
  int dev = 0, sms = 0;
  MK_CUDA_CHECK(cudaGetDevice(&dev));
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t needed = (n + kFillThreads - 1) / kFillThreads;
  return int(std::max<int64_t>(1, std::min<int64_t>(needed, kFillBlocksPerSm * sms)));
}

}  // namespace

void fill_normal_bf16(void* out, int64_t n, float std, uint64_t seed, uint64_t rng_stream, cudaStream_t stream) {
  if (n <= 0) return;
  fill_normal_bf16_kernel<<<fill_blocks(n), kFillThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(out), n, std,
                                                                        seed, rng_stream);
  MK_LAUNCH_CHECK("fill_normal_bf16_kernel");
}

DeviceBuffer random_activations(int64_t tokens, int64_t hidden, uint64_t seed, uint64_t rng_stream,
                                cudaStream_t stream) {
  DeviceBuffer x(tokens * hidden * 2);
  fill_normal_bf16(x.get(), tokens * hidden, kXStd, seed, rng_stream, stream);
  return x;
}

GpuLayer::GpuLayer(const LayerSpec& spec, uint64_t seed, cudaStream_t stream) : spec_(spec), seed_(seed) {
  const MoeShape& s = spec.shape;
  if (spec.score_bias) {
    // E floats: drawn on the host (the same function as the GPU fills) and uploaded.
    std::vector<float> bias(size_t(s.experts));
    for (int64_t e = 0; e < s.experts; ++e) bias[size_t(e)] = kScoreBiasStd * hash_normal(seed, kStreamScoreBias, uint64_t(e));
    set_score_bias(bias, stream);
  }
  ensure_copies(1, 0, stream);
}

int64_t GpuLayer::copy_bytes() const {
  const MoeShape& s = spec_.shape;
  return 2 * (s.experts * s.hidden + s.experts * 3 * s.inter * s.hidden);
}

int GpuLayer::ensure_copies(int want, int64_t keep_free_bytes, cudaStream_t stream) {
  const MoeShape& s = spec_.shape;
  while (copies() < want) {
    size_t free_bytes = 0, total_bytes = 0;
    MK_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (!copies_.empty() && int64_t(free_bytes) - copy_bytes() < keep_free_bytes) break;
    WeightCopy c;
    c.w_gate = DeviceBuffer(s.experts * s.hidden * 2);
    c.w13 = DeviceBuffer(s.experts * 2 * s.inter * s.hidden * 2);
    c.w2 = DeviceBuffer(s.experts * s.hidden * s.inter * 2);
    // Same seed and streams for every copy: the copies are bitwise identical, so routing and
    // outputs do not depend on which copy a timed step reads.
    fill_normal_bf16(c.w_gate.get(), s.experts * s.hidden, kRouterLogitStd / std::sqrt(float(s.hidden)), seed_,
                     kStreamWGate, stream);
    fill_normal_bf16(c.w13.get(), s.experts * 2 * s.inter * s.hidden, 1.0f / std::sqrt(float(s.hidden)), seed_,
                     kStreamW13, stream);
    fill_normal_bf16(c.w2.get(), s.experts * s.hidden * s.inter, 1.0f / std::sqrt(float(s.inter)), seed_,
                     kStreamW2, stream);
    copies_.push_back(std::move(c));
  }
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  return copies();
}

Tensor GpuLayer::w_gate(int c) const {
  const MoeShape& s = spec_.shape;
  return Tensor(copies_.at(size_t(c)).w_gate.get(), DType::bf16, {s.experts, s.hidden});
}
Tensor GpuLayer::w13(int c) const {
  const MoeShape& s = spec_.shape;
  return Tensor(copies_.at(size_t(c)).w13.get(), DType::bf16, {s.experts, 2 * s.inter, s.hidden});
}
Tensor GpuLayer::w2(int c) const {
  const MoeShape& s = spec_.shape;
  return Tensor(copies_.at(size_t(c)).w2.get(), DType::bf16, {s.experts, s.hidden, s.inter});
}
Tensor GpuLayer::score_bias() const {
  if (bias_host_.empty()) return Tensor{};
  return Tensor(bias_.get(), DType::f32, {spec_.shape.experts});
}

void GpuLayer::set_score_bias(const std::vector<float>& bias, cudaStream_t stream) {
  if (!bias.empty() && int64_t(bias.size()) != spec_.shape.experts)
    throw Error("score bias: expected " + std::to_string(spec_.shape.experts) + " values, got " + std::to_string(bias.size()));
  bias_host_ = bias;
  if (bias.empty()) return;
  if (bias_.get() == nullptr) bias_ = DeviceBuffer(int64_t(bias.size()) * 4);
  MK_CUDA_CHECK(cudaMemcpyAsync(bias_.get(), bias.data(), bias.size() * 4, cudaMemcpyHostToDevice, stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));  // `bias` may go away when we return
}

MoeInputs GpuLayer::inputs(int c, const Tensor& x) const {
  MoeInputs in;
  in.x = x;
  in.w_gate = w_gate(c);
  in.score_bias = score_bias();
  in.w13 = w13(c);
  in.w2 = w2(c);
  return in;
}

}  // namespace moekit::cli
