// fp8_layer.cu — definitions of fp8_layer.hpp: the FP8 copies of the layer's expert weights and
// the check of an FP8 forward against ref::moe_tokens_fp8 (fidelity) and ref::moe_tokens
// (calc_diff against the unquantized bf16 layer).
#include "fp8_layer.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
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

// The finished forward (ws, y) on FP8 copy 0 against the oracles on sampled tokens; only the
// experts those tokens use are copied to the host.
Fp8Check check_fp8(const GpuLayer& layer, const Fp8Weights& fp8, const ForwardPlan& plan, const Workspace& ws,
                   const Tensor& x, const Tensor& y, int check_tokens, cudaStream_t stream) {
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  const MoeShape& s = plan.shape;
  const int64_t T = s.tokens, H = s.hidden, k = s.topk, kbH = fp8_blocks(H);
  Fp8Check c;
  c.topk_ids = copy_to_host<int32_t>(ws.topk_ids.data, T * k);
  c.expert_counts = copy_to_host<int32_t>(ws.expert_counts.data, s.experts);
  const auto weights = copy_to_host<float>(ws.topk_weights.data, T * k);
  const auto x_q = copy_to_host<ref::fp8>(ws.x_q.data, T * H);
  const auto x_scale = copy_to_host<float>(ws.x_scale.data, T * kbH);
  const auto x_bf16 = copy_to_host<ref::bf16>(x.data, T * H);
  const auto y_host = copy_to_host<ref::bf16>(y.data, T * H);
  std::vector<int64_t> tokens;
  const int64_t n = std::min<int64_t>(T, std::max(2, check_tokens));
  for (int64_t i = 0; i < n; ++i) tokens.push_back(n == 1 ? 0 : i * (T - 1) / (n - 1));
  tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
  // The experts of the sampled tokens, renumbered 0..U-1 in compact host copies.
  std::vector<int32_t> used;
  for (int64_t t : tokens)
    for (int64_t j = 0; j < k; ++j) used.push_back(c.topk_ids[size_t(t * k + j)]);
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  std::vector<int32_t> ids(size_t(T * k), 0);
  for (int64_t t : tokens)
    for (int64_t j = 0; j < k; ++j)
      ids[size_t(t * k + j)] = int32_t(std::lower_bound(used.begin(), used.end(), c.topk_ids[size_t(t * k + j)]) - used.begin());
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
  MoeShape su = s;
  su.experts = int64_t(used.size());
  const ref::Fp8Experts fw{w13_q.data(), w13_s.data(), w2_q.data(), w2_s.data()};
  const auto fid = ref::moe_tokens_fp8(su, x_q.data(), x_scale.data(), fw, ids.data(), weights.data(), tokens);
  const auto unq = ref::moe_tokens(su, x_bf16.data(), w13_b.data(), w2_b.data(), ids.data(), weights.data(), tokens);
  std::vector<double> got;
  for (int64_t t : tokens)
    for (int64_t h = 0; h < H; ++h) got.push_back(ref::to_float(y_host[size_t(t * H + h)]));
  c.fidelity = ref::rel_norm_error(got, fid);
  c.calc_diff = ref::calc_diff(got, unq);
  c.ok = c.fidelity <= kFp8FidelityTol && c.calc_diff < kFp8LayerCalcDiffMax;
  char line[320];
  std::snprintf(line, sizeof line,
                "check %s: fp8 T=%lld, %zu tokens, %zu experts: y vs the oracle on the quantized values %.2e (<= %.2e), "
                "calc_diff vs the unquantized bf16 layer %.2e (< %.0e)",
                c.ok ? "OK" : "FAILED", (long long)T, tokens.size(), used.size(), c.fidelity, kFp8FidelityTol,
                c.calc_diff, kFp8LayerCalcDiffMax);
  c.summary = line;
  return c;
}

}  // namespace moekit::cli
