// bench_fp8.cu — `moekit bench --dtype fp8`: the layer with DeepSeek-V3's FP8 experts (e4m3
// weights with 128 x 128 block scales, quantized on the device from the preset's bf16 weights:
// fp8_layer.hpp). For each T: one forward, checked against the oracle on the same
// quantized values (fidelity) and against the unquantized bf16 layer (calc_diff); then every
// stage timed, with the FP8 ceiling (cuBLASLt, fp8_blas.hpp), the streaming read of the FP8 bytes
// and two baselines in the same run: the expert FFN on cuBLASLt FP8 with 128-block scales, and
// moekit's own bf16 experts.
//
//   build/moekit bench --dtype fp8 --preset deepseek-v3 --tokens 1,64,4096 --json ds-fp8.json
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench.hpp"
#include "ceilings.cuh"
#include "fp8_blas.hpp"
#include "fp8_layer.hpp"
#include "metrics.hpp"
#include "report.hpp"
#include "timing.hpp"

namespace moekit::cli {

namespace {

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
  const auto y_checked = copy_to_host<uint16_t>(y.get(), T * H);

  std::vector<int32_t> touched;
  for (int64_t e = 0; e < E; ++e)
    if (chk.expert_counts[size_t(e)] > 0) touched.push_back(int32_t(e));
  // Copies for L2 rotation, sized for the FP8 down weights (the smallest stage's bytes).
  const int want = rotation_copies_wanted(int64_t(touched.size()) * H * F, cx.dev.l2_bytes);
  const int copies = std::min(want, cx.fp8.ensure(want, kKeepFreeBytes, s));
  const std::string rotation = copies > 1 ? "rotating " + std::to_string(copies) + " fp8 weight copies" : "";

  const int warmup = args.warmup, steps = args.steps;
  constexpr int kSmallStageReps = 10;
  auto timed = [&](const std::function<void(int)>& step, int reps = 1) {
    return rotated_graph_ms(step, copies, reps, warmup, steps, s);
  };
  auto up = [&](int c) {
    const ExpertWeights w = cx.fp8.at(c);
    expert_up(plan, ws.x_q, w.w13, ws, s, w.w13_scale);
  };
  auto down = [&](int c) {
    const ExpertWeights w = cx.fp8.at(c);
    expert_down(plan, w.w2, ws.topk_weights, ws, s, w.w2_scale);
  };
  StageTimes ms;  // timing.hpp: each stage's time and clocks
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
  double bf16_ms = 0, bf16_read_ms = 0;  // moekit's bf16 experts, and the read of their bf16 weights
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
    bf16_ms = rotated_graph_ms([&](int c) {
      expert_up(bplan, xt, layer.w13(c), bws, s);
      expert_down(bplan, layer.w2(c), bws.topk_weights, bws, s);
    }, rot.copies, 1, warmup, steps, s);
    bf16_config = bplan.str() + (rot.note.empty() ? "" : "; " + rot.note);
    std::vector<StreamReader> readers;
    for (int c = 0; c < rot.copies; ++c) readers.emplace_back(weight_ranges("experts", layer, c, touched));
    bf16_read_ms = rotated_read_ms(readers, s, warmup, steps);
  }

  MK_CUDA_CHECK(cudaStreamSynchronize(s));
  bool ok = true;
  const int32_t rows_padded = copy_to_host<int32_t>(ws.num_rows_padded.data, 1)[0];
  if (copy_to_host<uint16_t>(y.get(), T * H) != y_checked) {
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
    r.tokens_per_expert = chk.expert_counts;
    r.config = plan.str(), r.note = note, r.weight_copies = copies, r.skew = args.skew;
    r.dtype = precision_name(p);
    if (impl == "moekit") r.clocks = ms.clocks(stage);
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
    print_row(rows.back(), cx.info);
  }
  if (bf16_ms > 0) {
    rows.push_back(make_row("experts", "moekit-bf16", bf16_ms, "the bf16 path on the same routing: " + bf16_config,
                            Precision::bf16));
    rows.back().read_time_ms = bf16_read_ms;  // its own weights' read, for its x_read and x_roof
    print_row(rows.back(), cx.info);
  }
  return ok;
}

}  // namespace

int run_bench_fp8(const BenchArgs& args, const std::string& command) {
  const LayerSpec spec = resolve_layer(args.layer);
  if (!require_hopper("bench", "", "On this machine, `moekit check --cpu` runs the CPU oracle.")) return kExitNoGpu;
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
  write_rows(args.json, args.csv, info, rows);
  return ok ? kExitOk : kExitFailed;
}

}  // namespace moekit::cli
