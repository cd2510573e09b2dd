// check.cpp — `moekit check`, and the oracle check `moekit bench` runs before it times anything:
// a GPU forward pass compared with the CPU reference (src/reference) on sampled tokens. Only the
// sampled tokens' rows and the experts they touch are copied to the host (DeepSeek-V3's w13 alone
// is 15 GB). `check --cpu` runs the oracle's self-check (cpu_oracle.hpp); without a Hopper GPU and
// without --cpu, `check` fails (kExitNoGpu).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "bench.hpp"
#include "cpu_oracle.hpp"
#include "moekit/reference.hpp"
#include "rng.hpp"
#include "tool_util.hpp"

namespace moekit::cli {

namespace {

using ref::bf16;

void to_host(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) MK_CUDA_CHECK(cudaMemcpy(dst, src, size_t(bytes), cudaMemcpyDeviceToHost));
}
const char* at(const Tensor& t, int64_t byte_offset) { return static_cast<const char*>(t.data) + byte_offset; }

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

std::vector<int64_t> sample_tokens(int64_t T, int n, uint64_t seed) {
  std::set<int64_t> pick;
  if (T <= n) {
    for (int64_t t = 0; t < T; ++t) pick.insert(t);
  } else {
    pick = {0, T - 1};
    for (uint64_t i = 0; int64_t(pick.size()) < n; ++i) pick.insert(int64_t(hash3(seed, kStreamSample, i) % uint64_t(T)));
  }
  return {pick.begin(), pick.end()};
}

ForwardOracle::ForwardOracle(const GpuLayer& layer, const MoeShape& shape, const Workspace& ws, const Tensor& x,
                             int check_tokens, uint64_t seed, cudaStream_t stream)
    : shape_(shape) {
  const int64_t T = shape.tokens, H = shape.hidden, F = shape.inter, E = shape.experts, k = shape.topk;
  // The forward ran on `stream` (non-blocking): finish it before plain cudaMemcpy reads results.
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  // Routing of every token (small).
  topk_ids_.resize(size_t(T * k));
  topk_w_.resize(size_t(T * k));
  to_host(topk_ids_.data(), ws.topk_ids.data, T * k * 4);
  to_host(topk_w_.data(), ws.topk_weights.data, T * k * 4);
  for (int32_t e : topk_ids_)
    if (e < 0 || e >= E) ids_in_range_ = false;

  // Sampled tokens: x rows, and the oracle's routing from the same x and w_gate.
  tokens_ = sample_tokens(T, check_tokens, seed);
  const int64_t n = int64_t(tokens_.size());
  std::vector<bf16> xs(size_t(n * H)), wg(size_t(E * H));
  for (int64_t i = 0; i < n; ++i) to_host(xs.data() + i * H, at(x, tokens_[size_t(i)] * H * 2), H * 2);
  to_host(wg.data(), layer.w_gate(0).data, E * H * 2);
  const std::vector<float>& bias = layer.score_bias_host();
  // The layer's logits (tensor cores, in the workspace) must be within the oracle's bound; the
  // oracle's selection then runs on them, so the routing compares bitwise.
  std::vector<float> logits(size_t(n * E));
  for (int64_t i = 0; i < n; ++i)
    to_host(logits.data() + i * E, at(ws.router_logits, tokens_[size_t(i)] * E * 4), E * 4);
  std::string logit_error;
  logits_beyond_bound_ = ref::logits_beyond_bound(logits.data(), xs.data(), wg.data(), n, H, E, &logit_error);
  if (logits_beyond_bound_ > 0) first_mismatch_ = "logits beyond the tensor-core bound: " + logit_error;
  const ref::Routing want = ref::route(logits.data(), bias.empty() ? nullptr : bias.data(), n, E, k, layer.spec().router);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = tokens_[size_t(i)];
    const bool same = std::memcmp(&topk_ids_[size_t(t * k)], &want.ids[size_t(i * k)], size_t(k) * 4) == 0 &&
                      std::memcmp(&topk_w_[size_t(t * k)], &want.weights[size_t(i * k)], size_t(k) * 4) == 0;
    if (same) continue;
    if (route_mismatches_++ == 0)
      first_mismatch_ = "token " + std::to_string(t) + " slot 0: GPU expert " + std::to_string(topk_ids_[size_t(t * k)]) +
                        " weight " + fmt("%.9g", topk_w_[size_t(t * k)]) + ", oracle expert " +
                        std::to_string(want.ids[size_t(i * k)]) + " weight " + fmt("%.9g", want.weights[size_t(i * k)]);
  }

  // y of the sampled tokens from the double-precision naive loop, with the GPU's routing (so a
  // check isolates stages 2-5), on host copies of only the experts those tokens use.
  if (!ids_in_range_) return;
  std::map<int32_t, int32_t> local;  // expert -> index among the copied ones
  std::vector<int32_t> ids_local(size_t(n * k));
  std::vector<float> w_local(size_t(n * k));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = topk_ids_[size_t(tokens_[size_t(i)] * k + j)];
      const auto it = local.emplace(e, int32_t(local.size())).first;
      ids_local[size_t(i * k + j)] = it->second;
      w_local[size_t(i * k + j)] = topk_w_[size_t(tokens_[size_t(i)] * k + j)];
    }
  const int64_t n_e = int64_t(local.size()), w13_e = 2 * F * H, w2_e = H * F;
  experts_copied_ = n_e;
  // Uninitialised: every element is overwritten by the copies (GBs for DeepSeek-V3 at T >= 16).
  auto w13 = std::make_unique_for_overwrite<bf16[]>(size_t(n_e * w13_e));
  auto w2 = std::make_unique_for_overwrite<bf16[]>(size_t(n_e * w2_e));
  for (const auto& [e, l] : local) {
    to_host(w13.get() + l * w13_e, at(layer.w13(0), int64_t(e) * w13_e * 2), w13_e * 2);
    to_host(w2.get() + l * w2_e, at(layer.w2(0), int64_t(e) * w2_e * 2), w2_e * 2);
  }
  std::vector<int64_t> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rows[size_t(i)] = i;
  const MoeShape ls{n, H, F, n_e, k};
  y_ref_ = ref::moe_tokens(ls, xs.data(), w13.get(), w2.get(), ids_local.data(), w_local.data(), rows);
}

std::vector<int32_t> ForwardOracle::touched_experts() const {
  std::vector<bool> used(size_t(shape_.experts), false);
  for (int32_t e : topk_ids_)
    if (e >= 0 && e < shape_.experts) used[size_t(e)] = true;
  std::vector<int32_t> out;
  for (int64_t e = 0; e < shape_.experts; ++e)
    if (used[size_t(e)]) out.push_back(int32_t(e));
  return out;
}

ForwardCheck ForwardOracle::check(const Workspace& ws, const Tensor& y, cudaStream_t stream) const {
  const int64_t T = shape_.tokens, H = shape_.hidden, E = shape_.experts, k = shape_.topk;
  ForwardCheck r;
  std::vector<std::string> failures;
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  try {
    check_status(ws, stream);
  } catch (const Error& e) {
    failures.push_back(e.what());
  }

  // This run's routing must be the one the oracle was computed from (the router does not depend
  // on the plan, and it is deterministic), and align's counts its histogram.
  r.topk_ids.resize(size_t(T * k));
  std::vector<float> topk_w(size_t(T * k));
  to_host(r.topk_ids.data(), ws.topk_ids.data, T * k * 4);
  to_host(topk_w.data(), ws.topk_weights.data, T * k * 4);
  const bool same_routing = r.topk_ids == topk_ids_ &&
                            std::memcmp(topk_w.data(), topk_w_.data(), topk_w.size() * sizeof(float)) == 0;
  r.expert_counts.resize(size_t(E));
  to_host(r.expert_counts.data(), ws.expert_counts.data, E * 4);
  to_host(&r.rows_padded, ws.num_rows_padded.data, 4);
  std::vector<int32_t> hist(size_t(E), 0);
  for (int32_t e : r.topk_ids)
    if (e >= 0 && e < E) ++hist[size_t(e)];
  if (!ids_in_range_) failures.push_back("router wrote an expert id outside [0, E)");
  if (hist != r.expert_counts) failures.push_back("align's expert_counts differ from the histogram of topk_ids");

  const int64_t n = int64_t(tokens_.size());
  r.tokens_checked = n;
  r.route_mismatches = route_mismatches_;
  if (r.route_mismatches > 0)
    failures.push_back(std::to_string(r.route_mismatches) + " of " + std::to_string(n) +
                       " sampled tokens route differently from the oracle (bitwise), e.g. " + first_mismatch_);
  if (logits_beyond_bound_ > 0)
    failures.push_back(std::to_string(logits_beyond_bound_) + " router logits of the sampled tokens are beyond the bound (" +
                       first_mismatch_ + ")");
  if (!same_routing)
    failures.push_back("routing differs (bitwise) from the run the oracle was computed from: the router is not deterministic");

  if (ids_in_range_) {
    r.experts_copied = experts_copied_;
    std::vector<bf16> ys(size_t(n * H));
    for (int64_t i = 0; i < n; ++i) to_host(ys.data() + i * H, at(y, tokens_[size_t(i)] * H * 2), H * 2);
    int64_t worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> got(static_cast<size_t>(H)), exp(y_ref_.begin() + i * H, y_ref_.begin() + (i + 1) * H);
      for (int64_t h = 0; h < H; ++h) got[size_t(h)] = ref::to_float(ys[size_t(i * H + h)]);
      double err = ref::rel_norm_error(got, exp);
      if (std::isnan(err)) err = INFINITY;  // a NaN must fail, and stay the worst
      if (err > r.y_err_max) {
        r.y_err_max = err;
        worst = tokens_[size_t(i)];
      }
    }
    if (!(r.y_err_max <= kYRelTolerance))
      failures.push_back("y of token " + std::to_string(worst) + " has relative norm error " + fmt("%.3e", r.y_err_max) +
                         " > " + fmt("%.0e", kYRelTolerance));
  }

  r.ok = failures.empty();
  r.summary = "check T=" + std::to_string(T) + ": " + std::to_string(n) + " tokens (0, T-1 and sampled), " +
              std::to_string(r.experts_copied) + " experts copied; routing " +
              (r.route_mismatches == 0 ? "bitwise equal" : "DIFFERS") + "; y rel err max " + fmt("%.3e", r.y_err_max) +
              " (bound " + fmt("%.0e", kYRelTolerance) + "): " + (r.ok ? "OK" : "FAILED");
  for (const std::string& f : failures) r.summary += "\n  " + f;
  return r;
}

ForwardCheck check_forward(const GpuLayer& layer, const ForwardPlan& plan, const Workspace& ws, const Tensor& x,
                           const Tensor& y, int check_tokens, uint64_t seed, cudaStream_t stream) {
  return ForwardOracle(layer, plan.shape, ws, x, check_tokens, seed, stream).check(ws, y, stream);
}

void poisoned_forward(const GpuLayer& layer, const ForwardPlan& plan, const Tensor& x, const Tensor& y, void* ws,
                      size_t ws_bytes, cudaStream_t stream) {
  // 0xffff is a bf16 NaN: a row the forward fails to write cannot pass.
  if (y.bytes() > 0) MK_CUDA_CHECK(cudaMemsetAsync(y.data, 0xff, size_t(y.bytes()), stream));
  moe_forward(plan, layer.inputs(0, x), layer.spec().router, y, ws, ws_bytes, stream);
}

ForwardCheck checked_forward(const GpuLayer& layer, const ForwardPlan& plan, const Tensor& x, const Tensor& y,
                             void* ws, size_t ws_bytes, int check_tokens, uint64_t seed, cudaStream_t stream) {
  poisoned_forward(layer, plan, x, y, ws, ws_bytes, stream);
  return check_forward(layer, plan, carve_workspace(plan, ws, ws_bytes), x, y, check_tokens, seed, stream);
}

int run_check(const CheckArgs& a) {
  const LayerSpec spec = resolve_layer(a.layer);
  const int64_t cpu_tokens = a.tokens_given ? a.tokens : kCpuOracleTokens;
  if (a.cpu) return run_cpu_oracle(a.layer, spec, cpu_tokens, a.seed);
  const GpuProbe gpu = probe_gpu();
  if (gpu.kind != GpuKind::hopper) {
    // One line, and a failure: a CI job that asked for the GPU check must not pass on the oracle.
    std::fprintf(stderr, "moekit check: no Hopper GPU (sm_90a) here (%s); `moekit check --cpu` runs the CPU oracle\n",
                 gpu.detail.c_str());
    return kExitNoGpu;
  }
  std::printf("moekit check on %s: %s, T=%lld\n", gpu.detail.c_str(), spec.str().c_str(), (long long)a.tokens);
  Stream stream;
  GpuLayer layer(spec, a.seed, stream.s);
  MoeShape shape = spec.shape;
  shape.tokens = a.tokens;
  const ForwardPlan plan = plan_forward(shape, query_device());
  const DeviceBuffer x = random_activations(shape.tokens, shape.hidden, a.seed, kStreamX, stream.s);
  const DeviceBuffer y(shape.tokens * shape.hidden * 2);
  const DeviceBuffer ws(int64_t(workspace_bytes(plan)));
  // Poison y (0xffff is a bf16 NaN): a row the forward fails to write cannot pass.
  MK_CUDA_CHECK(cudaMemsetAsync(y.get(), 0xff, size_t(y.bytes()), stream.s));
  const Tensor xt(x.get(), DType::bf16, {shape.tokens, shape.hidden});
  const Tensor yt(y.get(), DType::bf16, {shape.tokens, shape.hidden});
  moe_forward(plan, layer.inputs(0, xt), spec.router, yt, ws.get(), size_t(ws.bytes()), stream.s);
  const Workspace w = carve_workspace(plan, ws.get(), size_t(ws.bytes()));
  std::printf("plan: %s\n", plan.str().c_str());
  const ForwardCheck c = check_forward(layer, plan, w, xt, yt, a.check_tokens, a.seed, stream.s);
  std::printf("%s\n", c.summary.c_str());
  return c.ok ? kExitOk : kExitFailed;
}

}  // namespace moekit::cli
