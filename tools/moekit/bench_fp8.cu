// bench_fp8.cu — `moekit bench --dtype fp8`: the layer with DeepSeek-V3's FP8 experts (e4m3
// weights with 128 x 128 block scales, quantized on the device from the preset's bf16 weights by
// moekit::quantize_weights). For each T: one forward, checked against the oracle on the same
// quantized values (fidelity) and against the unquantized bf16 layer (calc_diff); then every
// stage timed, with the FP8 ceiling (cuBLASLt, fp8_blas.hpp), the streaming read of the FP8 bytes
// and two baselines in the same run: the expert FFN on cuBLASLt FP8 with 128-block scales, and
// moekit's own bf16 experts.
//
//   build/moekit bench --dtype fp8 --preset deepseek-v3 --tokens 1,64,4096 --json ds-fp8.json
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench.hpp"
#include "ceilings.cuh"
#include "fp8_blas.hpp"
#include "metrics.hpp"
#include "moekit/reference.hpp"
#include "report.hpp"
#include "timing.hpp"

namespace moekit::cli {

namespace {

// The bounds of the check, derived in tests/gpu/fp8_forward_test.cu: y against the oracle on the
// same quantized values (act re-quantized by the oracle: a few codes flip), and the layer's
// calc_diff against the unquantized bf16 layer (four e4m3 roundings).
constexpr double kFp8FidelityTol = 1.0 / 32;
constexpr double kFp8LayerCalcDiffMax = 5e-3;

// One FP8 copy of the layer's expert weights (bitwise identical copies rotate past L2).
struct Fp8Copy {
  DeviceBuffer w13, w13_scale, w2, w2_scale;
};

class Fp8Weights {
 public:
  explicit Fp8Weights(const GpuLayer& layer) : layer_(layer) {}
  const MoeShape& shape() const { return layer_.spec().shape; }
  int64_t copy_bytes() const {
    const MoeShape& s = shape();
    const int64_t kbH = fp8_blocks(s.hidden), kbF = fp8_blocks(s.inter);
    return s.experts * (3 * s.hidden * s.inter + 4 * (w13_scale_rows(s.inter) * kbH + kbH * kbF));
  }
  // Quantizes bf16 copy 0 into FP8 copies until there are `want` (while keep_free bytes stay free).
  int ensure(int want, int64_t keep_free, cudaStream_t stream) {
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
  ExpertWeights at(int c) const {
    const MoeShape& s = shape();
    const Fp8Copy& w = copies_.at(size_t(c));
    return {Tensor(w.w13.get(), DType::e4m3, {s.experts, 2 * s.inter, s.hidden}),
            Tensor(w.w2.get(), DType::e4m3, {s.experts, s.hidden, s.inter}),
            Tensor(w.w13_scale.get(), DType::f32, {s.experts, w13_scale_rows(s.inter), fp8_blocks(s.hidden)}),
            Tensor(w.w2_scale.get(), DType::f32, {s.experts, fp8_blocks(s.hidden), fp8_blocks(s.inter)})};
  }
  // Byte ranges of the FP8 weights (and scales) `stage` reads in copy c, for its read time.
  std::vector<std::pair<const void*, int64_t>> ranges(const std::string& stage, int c,
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

 private:
  const GpuLayer& layer_;
  std::vector<Fp8Copy> copies_;
};

template <class T>
std::vector<T> to_host(const void* p, int64_t n) {
  std::vector<T> v(size_t(std::max<int64_t>(n, 0)));
  if (n > 0) MK_CUDA_CHECK(cudaMemcpy(v.data(), p, size_t(n) * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

struct Fp8Check {
  bool ok = false;
  std::vector<int32_t> topk_ids, expert_counts;
  double fidelity = 0, calc_diff = 0;
  std::string summary;
};

// The finished forward (ws, y) on FP8 copy 0 against the oracles on sampled tokens; only the
// experts those tokens use are copied to the host.
Fp8Check check_fp8(const GpuLayer& layer, const Fp8Weights& fp8, const ForwardPlan& plan, const Workspace& ws,
                   const Tensor& x, const Tensor& y, int check_tokens, cudaStream_t stream) {
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  const MoeShape& s = plan.shape;
  const int64_t T = s.tokens, H = s.hidden, k = s.topk, kbH = fp8_blocks(H);
  Fp8Check c;
  c.topk_ids = to_host<int32_t>(ws.topk_ids.data, T * k);
  c.expert_counts = to_host<int32_t>(ws.expert_counts.data, s.experts);
  const auto weights = to_host<float>(ws.topk_weights.data, T * k);
  const auto x_q = to_host<ref::fp8>(ws.x_q.data, T * H);
  const auto x_scale = to_host<float>(ws.x_scale.data, T * kbH);
  const auto x_bf16 = to_host<ref::bf16>(x.data, T * H);
  const auto y_host = to_host<ref::bf16>(y.data, T * H);
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

struct Context {
  const BenchArgs& args;
  GpuLayer& layer;
  Fp8Weights& fp8;
  const DeviceInfo& dev;
  const RunInfo& info;
  const CublasLt& lt;
  cudaStream_t stream;
};

bool bench_tokens(const Context& cx, int64_t T, std::vector<Row>& rows) {
  const BenchArgs& args = cx.args;
  GpuLayer& layer = cx.layer;
  const LayerSpec& spec = layer.spec();
  const cudaStream_t s = cx.stream;
  MoeShape shape = spec.shape;
  shape.tokens = T;
  const int64_t H = shape.hidden, F = shape.inter, E = shape.experts;
  const ForwardPlan plan = plan_forward(shape, cx.dev, Precision::fp8);
  const DeviceBuffer x = random_activations(T, H, args.seed, kStreamX, s);
  const DeviceBuffer y(T * H * 2), wsbuf(int64_t(workspace_bytes(plan)));
  const Tensor xt(x.get(), DType::bf16, {T, H}), yt(y.get(), DType::bf16, {T, H});
  void* const wsp = wsbuf.get();
  const size_t wsb = size_t(wsbuf.bytes());
  const Workspace ws = carve_workspace(plan, wsp, wsb);
  auto inputs = [&](int c) {
    MoeInputs in = layer.inputs(0, xt);
    const ExpertWeights w = cx.fp8.at(c);
    in.w13 = w.w13, in.w2 = w.w2, in.w13_scale = w.w13_scale, in.w2_scale = w.w2_scale;
    return in;
  };
  auto forward = [&](int c) { moe_forward(plan, inputs(c), spec.router, yt, wsp, wsb, s); };

  MK_CUDA_CHECK(cudaMemsetAsync(y.get(), 0xff, size_t(y.bytes()), s));  // poisoned: an unwritten row fails
  forward(0);
  const Fp8Check chk = check_fp8(layer, cx.fp8, plan, ws, xt, yt, args.check_tokens, s);
  std::printf("\n%s\n", chk.summary.c_str());
  if (!chk.ok) return false;
  const auto y_checked = to_host<uint16_t>(y.get(), T * H);

  std::vector<int32_t> touched;
  for (int64_t e = 0; e < E; ++e)
    if (chk.expert_counts[size_t(e)] > 0) touched.push_back(int32_t(e));
  // Copies for L2 rotation, sized for the FP8 down weights (the smallest stage's bytes).
  const int64_t smallest = int64_t(touched.size()) * H * F, rotate = kRotateL2Multiple * cx.dev.l2_bytes;
  const int want = smallest >= rotate ? 1 : int(std::min<int64_t>(kMaxWeightCopies, (rotate + smallest - 1) / smallest));
  const int copies = std::min(want, cx.fp8.ensure(want, kKeepFreeBytes, s));
  const std::string rotation = copies > 1 ? "rotating " + std::to_string(copies) + " fp8 weight copies" : "";

  const int warmup = args.warmup, steps = args.steps;
  constexpr int kSmallStageReps = 10;
  auto timed = [&](const std::function<void(int)>& step, int reps = 1) {
    LayerGraphs graph;
    capture_rotated(graph, step, copies, reps, s);
    return time_rotated_ms(graph, copies, warmup, steps, s) / reps;
  };
  auto up = [&](int c) {
    const ExpertWeights w = cx.fp8.at(c);
    expert_up(plan, ws.x_q, w.w13, ws, s, w.w13_scale);
  };
  auto down = [&](int c) {
    const ExpertWeights w = cx.fp8.at(c);
    expert_down(plan, w.w2, ws.topk_weights, ws, s, w.w2_scale);
  };
  std::map<std::string, double> ms;
  ms["router"] = timed([&](int) {
    route(xt, layer.w_gate(0), Tensor{}, layer.score_bias(), spec.router, ws.topk_ids, ws.topk_weights, s,
          ws.router_logits);
  }, kSmallStageReps);
  ms["quantize"] = timed([&](int) { quantize_tokens(plan, xt, ws, s); }, kSmallStageReps);
  ms["align"] = timed([&](int) { align(plan, ws.topk_ids, ws, s); }, kSmallStageReps);
  ms["up"] = timed(up);
  ms["down"] = timed(down);
  ms["combine"] = timed([&](int) {
    if (plan.down_splits > 1) combine_partials(ws.y_partials, shape.topk, yt, s);
    else combine(ws.y_rows, shape.topk, yt, s);
  }, kSmallStageReps);
  ms["experts"] = timed([&](int c) { up(c), down(c); });
  ms["layer"] = time_median_ms(s, warmup, steps, [&](int i) { forward(i % copies); });
  LayerGraphs graphs;
  for (int c = 0; c < copies; ++c) graphs.capture([&] { forward(c); }, s);
  ms["layer-graph"] = time_median_ms(s, warmup, steps, [&](int i) { graphs.launch(i % copies, s); });

  std::map<std::string, double> read_ms;
  for (const char* stage : {"router", "up", "down", "experts", "layer"}) {
    std::vector<StreamReader> readers;
    for (int c = 0; c < copies; ++c) readers.emplace_back(cx.fp8.ranges(stage, c, touched));
    read_ms[stage] = rotated_read_ms(readers, s, warmup, steps);
  }
  read_ms["layer-graph"] = read_ms["layer"];

  // Baselines: cuBLASLt FP8 with 128-block scales; moekit's bf16 experts on the same routing.
  std::vector<Fp8BaselineResult> blas;
  double bf16_ms = 0;
  std::string bf16_config;
  if (!args.no_baselines) {
    Fp8BaselineRequest q;
    q.shape = shape;
    q.x_q = ws.x_q, q.x_scale = ws.x_scale, q.topk_weights = ws.topk_weights;
    for (int c = 0; c < copies; ++c) q.weights.push_back(cx.fp8.at(c));
    q.topk_ids = &chk.topk_ids;
    q.warmup = warmup, q.steps = steps, q.stream = s, q.lt = &cx.lt;
    blas = run_fp8_baselines(q);
    const ForwardPlan bplan = plan_forward(shape, cx.dev);
    const DeviceBuffer bws_buf(int64_t(workspace_bytes(bplan)));
    const Workspace bws = carve_workspace(bplan, bws_buf.get(), size_t(bws_buf.bytes()));
    MK_CUDA_CHECK(cudaMemcpyAsync(bws.topk_weights.data, ws.topk_weights.data, size_t(ws.topk_weights.bytes()),
                                  cudaMemcpyDeviceToDevice, s));
    align(bplan, ws.topk_ids, bws, s);
    const WeightRotation rot = rotate_weights(layer, touched, cx.dev.l2_bytes, 0, s);
    LayerGraphs g;
    capture_rotated(g, [&](int c) {
      expert_up(bplan, xt, layer.w13(c), bws, s);
      expert_down(bplan, layer.w2(c), bws.topk_weights, bws, s);
    }, rot.copies, 1, s);
    bf16_ms = time_rotated_ms(g, rot.copies, warmup, steps, s);
    bf16_config = bplan.str() + (rot.note.empty() ? "" : "; " + rot.note);
  }

  MK_CUDA_CHECK(cudaStreamSynchronize(s));
  bool ok = true;
  const int32_t rows_padded = to_host<int32_t>(ws.num_rows_padded.data, 1)[0];
  if (to_host<uint16_t>(y.get(), T * H) != y_checked) {
    std::printf("DETERMINISM FAILED: y after the timed runs differs from the checked y (T=%lld)\n", (long long)T);
    ok = false;
  }
  Routed routed{int64_t(touched.size()), rows_padded, plan.block_m()};
  int32_t max_count = 0;
  for (int32_t c : chk.expert_counts) max_count = std::max(max_count, c);
  const double tpe = shape.assignments() > 0 ? double(max_count) / (double(shape.assignments()) / double(E)) : 0;
  auto make_row = [&](const std::string& stage, const std::string& impl, double t_ms, const std::string& note,
                      Precision p = Precision::fp8) {
    Row r;
    r.preset = spec.name, r.shape = shape, r.stage = stage, r.impl = impl, r.ms = t_ms;
    r.cost = stage_cost(stage, shape, routed, p);
    if (read_ms.count(stage) && p == Precision::fp8) r.read_time_ms = read_ms[stage];
    r.tokens_per_expert_max_over_mean = tpe, r.touched_experts = routed.touched_experts;
    r.config = plan.str(), r.note = note, r.weight_copies = copies, r.skew = args.skew;
    r.dtype = precision_name(p);
    if (p == Precision::fp8) r.calc_diff = chk.calc_diff, r.fidelity_err = chk.fidelity;
    return r;
  };
  std::printf("plan: %s; %lld experts touched (%.1f MB of fp8 expert weights)%s%s\n", plan.str().c_str(),
              (long long)routed.touched_experts, double(stage_cost("experts", shape, routed, Precision::fp8).weight_bytes) / 1e6,
              rotation.empty() ? "" : "; ", rotation.c_str());
  print_table_header();
  for (const char* stage : {"router", "quantize", "align", "up", "down", "combine", "experts", "layer", "layer-graph"}) {
    rows.push_back(make_row(stage, "moekit", ms[stage], rotation));
    print_row(rows.back(), cx.info);
  }
  for (const Fp8BaselineResult& b : blas) {
    if (!b.ok) {
      std::printf("BASELINE FAILED: %s %s (row omitted)\n", b.impl.c_str(), b.error.c_str());
      ok = false;
      continue;
    }
    rows.push_back(make_row("experts", b.impl, b.ms, b.note + "; checked: " + b.check_detail));
    rows.back().read_time_ms = read_ms["experts"];
    print_row(rows.back(), cx.info);
  }
  if (bf16_ms > 0) {
    rows.push_back(make_row("experts", "moekit-bf16", bf16_ms, "the bf16 path on the same routing: " + bf16_config,
                            Precision::bf16));
    print_row(rows.back(), cx.info);
  }
  return ok;
}

}  // namespace

int run_bench_fp8(const BenchArgs& args, const std::string& command) {
  const LayerSpec spec = resolve_layer(args.layer);
  if (!require_hopper("bench", "", "On this machine, `moekit check` runs the CPU oracle instead.")) return kExitNoGpu;
  if (args.tokens.empty()) throw Error("--tokens: give at least one token count");
  if (args.skew || args.ep) throw Error("--dtype fp8: --skew and --ep run the bf16 layer only");
  const DeviceInfo dev = query_device();
  Stream stream;
  Cublas blas(stream.s);
  const CublasLt lt;
  RunInfo info;
  info.command = command, info.date = iso_utc_now(), info.gpu = dev.name, info.sm_count = dev.sm_count;
  info.l2_bytes = dev.l2_bytes;
  std::printf("moekit bench %s — %s, fp8 experts, on %s (%d SMs), %d steps after %d warm-up\n", kVersion,
              spec.str().c_str(), dev.name.c_str(), dev.sm_count, args.steps, args.warmup);
  const Ceilings ceil = measure_ceilings(dev, blas.h, stream.s, args.seed, args.warmup, args.steps);
  info.read_ceiling_TBps = ceil.read_TBps, info.read_ceiling_bytes = ceil.read_bytes;
  info.dense_ceiling_TFLOPs = ceil.dense_TFLOPs, info.dense_ceiling_dim = ceil.gemm_dim;
  const Fp8Ceiling f8 = measure_fp8_ceiling(lt, stream.s, args.warmup, args.steps, args.seed);
  if (!f8.ok) throw CudaError("the FP8 ceiling could not be measured: " + f8.error);
  info.fp8_ceiling_TFLOPs = f8.TFLOPs;
  const MoeShape& sh = spec.shape;
  const Fp8Ceiling up_shape = measure_fp8_gemm(lt, 16384, 2 * sh.inter, sh.hidden, stream.s, args.warmup, args.steps, args.seed);
  const Fp8Ceiling down_shape = measure_fp8_gemm(lt, 16384, sh.hidden, sh.inter, stream.s, args.warmup, args.steps, args.seed);
  char note[256];
  std::snprintf(note, sizeof note, "%lld^3 e4m3 cuBLASLt, per-tensor scales (%s); on the experts' shapes at 16384 rows: up %.0f, down %.0f TFLOP/s",
                (long long)kFp8CeilingDim, f8.note.c_str(), up_shape.ok ? up_shape.TFLOPs : 0.0, down_shape.ok ? down_shape.TFLOPs : 0.0);
  info.fp8_ceiling_note = note;
  std::printf("ceilings: streaming read %.3f TB/s; dense bf16 %.1f TFLOP/s; fp8 %.1f TFLOP/s (%s)\n", ceil.read_TBps,
              ceil.dense_TFLOPs, f8.TFLOPs, note);

  GpuLayer layer(spec, args.seed, stream.s);
  Fp8Weights fp8(layer);
  fp8.ensure(1, kKeepFreeBytes, stream.s);
  const Context cx{args, layer, fp8, dev, info, lt, stream.s};
  std::vector<Row> rows;
  bool ok = true;
  for (int64_t T : args.tokens) {
    if (!bench_tokens(cx, T, rows)) {
      std::printf("check or verification failed for T=%lld\n", (long long)T);
      ok = false;
      if (rows.empty() || rows.back().shape.tokens != T) return kExitFailed;  // failed before timing
    }
  }
  if (!args.json.empty()) {
    write_json(args.json, info, rows);
    std::printf("\nwrote %zu rows to %s\n", rows.size(), args.json.c_str());
  }
  return ok ? kExitOk : kExitFailed;
}

}  // namespace moekit::cli
