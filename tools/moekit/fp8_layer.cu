// fp8_layer.cu — definitions of fp8_layer.hpp: the FP8 copies of the layer's expert weights and
// the check of an FP8 forward against ref::moe_tokens_fp8 (fidelity) and ref::moe_tokens
// (calc_diff against the unquantized bf16 layer), both in double on the host.
#include "fp8_layer.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "moekit/reference.hpp"

namespace moekit::cli {

int64_t Fp8Weights::copy_bytes() const {
  const MoeShape& s = shape();
  const int64_t kbH = fp8_blocks(s.hidden), kbF = fp8_blocks(s.inter);
  return s.experts * (3 * s.hidden * s.inter + 4 * (w13_scale_rows(s.inter) * kbH + kbH * kbF));
}

int Fp8Weights::ensure(int want, int64_t keep_free, cudaStream_t stream) {
  const MoeShape& s = shape();
  const int64_t E = s.experts, H = s.hidden, F = s.inter, kbH = fp8_blocks(H), kbF = fp8_blocks(F);
  while (int(copies_.size()) < want) {
    size_t free_bytes = 0, total = 0;
    MK_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    if (!copies_.empty() && int64_t(free_bytes) - copy_bytes() < keep_free) break;
    Fp8Copy c{DeviceBuffer(E * 2 * F * H), DeviceBuffer(E * w13_scale_rows(F) * kbH * 4), DeviceBuffer(E * H * F),
              DeviceBuffer(E * kbH * kbF * 4)};
    quantize_weights(Tensor(layer_.w13(0).data, DType::bf16, {2 * E, F, H}), Tensor(c.w13.get(), DType::e4m3, {2 * E, F, H}),
                     Tensor(c.w13_scale.get(), DType::f32, {2 * E, kbF, kbH}), stream);
    quantize_weights(layer_.w2(0), Tensor(c.w2.get(), DType::e4m3, {E, H, F}),
                     Tensor(c.w2_scale.get(), DType::f32, {E, kbH, kbF}), stream);
    copies_.push_back(std::move(c));
  }
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  return int(copies_.size());
}

ExpertWeights Fp8Weights::at(int c) const {
  const MoeShape& s = shape();
  const Fp8Copy& w = copies_.at(size_t(c));
  return {Tensor(w.w13.get(), DType::e4m3, {s.experts, 2 * s.inter, s.hidden}),
          Tensor(w.w2.get(), DType::e4m3, {s.experts, s.hidden, s.inter}),
          Tensor(w.w13_scale.get(), DType::f32, {s.experts, w13_scale_rows(s.inter), fp8_blocks(s.hidden)}),
          Tensor(w.w2_scale.get(), DType::f32, {s.experts, fp8_blocks(s.hidden), fp8_blocks(s.inter)})};
}

std::vector<std::pair<const void*, int64_t>> Fp8Weights::ranges(const std::string& stage, int c,
                                                                const std::vector<int32_t>& touched) const {
  const ExpertWeights w = at(c);
  std::vector<std::pair<const void*, int64_t>> r;
  const bool up = stage == "up" || stage == "experts" || stage == "layer";
  const bool down = stage == "down" || stage == "experts" || stage == "layer";
  if (stage == "router" || stage == "layer") r.emplace_back(layer_.w_gate(0).data, layer_.w_gate(0).bytes());
  auto slice = [&](const Tensor& t, int32_t e) {
    const int64_t per = t.bytes() / t.dim(0);
    r.emplace_back(static_cast<const char*>(t.data) + e * per, per);
  };
  for (int32_t e : touched) {
    if (up) slice(w.w13, e), slice(w.w13_scale, e);
    if (down) slice(w.w2, e), slice(w.w2_scale, e);
  }
  return r;
}

Fp8Oracle::Fp8Oracle(const GpuLayer& layer, const Fp8Weights& fp8, const MoeShape& shape, const Workspace& ws,
                     const Tensor& x, int check_tokens, cudaStream_t stream)
    : shape_(shape) {
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  const int64_t T = shape.tokens, H = shape.hidden, k = shape.topk, kbH = fp8_blocks(H);
  topk_ids_ = copy_to_host<int32_t>(ws.topk_ids.data, T * k);
  topk_w_ = copy_to_host<float>(ws.topk_weights.data, T * k);
  x_q_ = copy_to_host<ref::fp8>(ws.x_q.data, T * H);
  x_scale_ = copy_to_host<float>(ws.x_scale.data, T * kbH);
  const auto x_bf16 = copy_to_host<ref::bf16>(x.data, T * H);
  const int64_t n = std::min<int64_t>(T, std::max(2, check_tokens));
  for (int64_t i = 0; i < n; ++i) tokens_.push_back(n == 1 ? 0 : i * (T - 1) / (n - 1));
  tokens_.erase(std::unique(tokens_.begin(), tokens_.end()), tokens_.end());
  // The experts of the sampled tokens, renumbered 0..U-1 in compact host copies.
  std::vector<int32_t> used;
  for (int64_t t : tokens_)
    for (int64_t j = 0; j < k; ++j) used.push_back(topk_ids_[size_t(t * k + j)]);
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  experts_used_ = used.size();
  std::vector<int32_t> ids(size_t(T * k), 0);
  for (int64_t t : tokens_)
    for (int64_t j = 0; j < k; ++j)
      ids[size_t(t * k + j)] = int32_t(std::lower_bound(used.begin(), used.end(), topk_ids_[size_t(t * k + j)]) - used.begin());
  const ExpertWeights w = fp8.at(0);
  auto gather = [&](const Tensor& t, auto elem) {
    using E = decltype(elem);
    const int64_t per = t.bytes() / t.dim(0) / int64_t(sizeof(E));
    std::vector<E> out(used.size() * size_t(per));
    for (size_t i = 0; i < used.size(); ++i)
      MK_CUDA_CHECK(cudaMemcpy(out.data() + i * size_t(per), static_cast<const E*>(t.data) + used[i] * per,
                               size_t(per) * sizeof(E), cudaMemcpyDeviceToHost));
    return out;
  };
  const auto w13_q = gather(w.w13, ref::fp8{}), w2_q = gather(w.w2, ref::fp8{});
  const auto w13_s = gather(w.w13_scale, 0.0f), w2_s = gather(w.w2_scale, 0.0f);
  const auto w13_b = gather(layer.w13(0), ref::bf16{}), w2_b = gather(layer.w2(0), ref::bf16{});
  MoeShape su = shape;
  su.experts = int64_t(used.size());
  const ref::Fp8Experts fw{w13_q.data(), w13_s.data(), w2_q.data(), w2_s.data()};
  y_fid_ = ref::moe_tokens_fp8(su, x_q_.data(), x_scale_.data(), fw, ids.data(), topk_w_.data(), tokens_);
  y_unq_ = ref::moe_tokens(su, x_bf16.data(), w13_b.data(), w2_b.data(), ids.data(), topk_w_.data(), tokens_);
}

std::vector<int32_t> Fp8Oracle::touched_experts() const {
  std::vector<int32_t> out;
  for (int32_t e : topk_ids_)
    if (e >= 0 && e < shape_.experts) out.push_back(e);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Fp8Check Fp8Oracle::check(const Workspace& ws, const Tensor& y, cudaStream_t stream) const {
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  const int64_t T = shape_.tokens, H = shape_.hidden, k = shape_.topk, kbH = fp8_blocks(H);
  Fp8Check c;
  c.topk_ids = copy_to_host<int32_t>(ws.topk_ids.data, T * k);
  c.expert_counts = copy_to_host<int32_t>(ws.expert_counts.data, shape_.experts);
  // The oracles hold for this run only if it routed and quantized x bitwise as the run they were
  // computed from (both are plan-independent and deterministic); floats compare as bits.
  auto same_bits = [](const auto& a, const auto& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  };
  const bool same_inputs = c.topk_ids == topk_ids_ && same_bits(copy_to_host<float>(ws.topk_weights.data, T * k), topk_w_) &&
                           same_bits(copy_to_host<ref::fp8>(ws.x_q.data, T * H), x_q_) &&
                           same_bits(copy_to_host<float>(ws.x_scale.data, T * kbH), x_scale_);
  std::vector<double> got;
  for (int64_t t : tokens_) {
    const auto row = copy_to_host<ref::bf16>(static_cast<const ref::bf16*>(y.data) + t * H, H);
    for (int64_t h = 0; h < H; ++h) got.push_back(ref::to_float(row[size_t(h)]));
  }
  c.fidelity = ref::rel_norm_error(got, y_fid_);
  c.calc_diff = ref::calc_diff(got, y_unq_);
  c.ok = same_inputs && c.fidelity <= kFp8FidelityTol && c.calc_diff < kFp8LayerCalcDiffMax;
  char line[320];
  std::snprintf(line, sizeof line,
                "check %s: fp8 T=%lld, %zu tokens, %zu experts: y vs the oracle on the quantized values %.2e (<= %.2e), "
                "calc_diff vs the unquantized bf16 layer %.2e (< %.0e)",
                c.ok ? "OK" : "FAILED", (long long)T, tokens_.size(), experts_used_, c.fidelity, kFp8FidelityTol,
                c.calc_diff, kFp8LayerCalcDiffMax);
  c.summary = line;
  if (!same_inputs)
    c.summary += "\n  routing or quantized x differs (bitwise) from the run the oracles were computed from";
  return c;
}

Fp8Check check_fp8(const GpuLayer& layer, const Fp8Weights& fp8, const ForwardPlan& plan, const Workspace& ws,
                   const Tensor& x, const Tensor& y, int check_tokens, cudaStream_t stream) {
  return Fp8Oracle(layer, fp8, plan.shape, ws, x, check_tokens, stream).check(ws, y, stream);
}

}  // namespace moekit::cli
