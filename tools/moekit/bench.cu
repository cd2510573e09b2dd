// bench.cu — `moekit bench`: for each T, run the layer once and check it against the CPU oracle
// (check.cpp), then time every stage alone, the experts (up+down), the whole layer and the layer
// replayed from a CUDA graph, with the streaming-read and dense-GEMM ceilings and the cuBLAS
// baselines measured in the same run (docs/design.md, "What the benchmarks report"). Prints a table; --json writes rows.
//
//   build/moekit bench --preset qwen3-30b-a3b --tokens 1,16,64,512 --json qwen.json
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "bench.hpp"
#include "ceilings.cuh"
#include "layer.cuh"
#include "metrics.hpp"
#include "report.hpp"
#include "skew.hpp"
#include "timing.hpp"

namespace moekit::cli {

namespace {

struct Context {
  const BenchArgs& args;
  GpuLayer& layer;
  const DeviceInfo& dev;
  const RunInfo& info;
  cudaStream_t stream;
  cublasHandle_t blas;
};

// Checks, times and reports one token count; `rows` gets every row that was measured. A failed
// check times nothing; a failure after timing (determinism, a baseline) keeps the rows.
Outcome bench_tokens(const Context& cx, int64_t T, std::vector<Row>& rows) {
  const BenchArgs& args = cx.args;
  GpuLayer& layer = cx.layer;
  const LayerSpec& spec = layer.spec();
  const cudaStream_t s = cx.stream;
  MoeShape shape = spec.shape;
  shape.tokens = T;
  const int64_t H = shape.hidden, F = shape.inter, E = shape.experts, A = shape.assignments();
  const ForwardPlan plan = plan_forward(shape, cx.dev);
  const DeviceBuffer x = random_activations(T, H, args.seed, kStreamX, s);
  const DeviceBuffer y(T * H * 2), wsbuf(int64_t(workspace_bytes(plan)));
  const Tensor xt(x.get(), DType::bf16, {T, H}), yt(y.get(), DType::bf16, {T, H});
  void* const wsp = wsbuf.get();
  const size_t wsb = size_t(wsbuf.bytes());
  const Workspace ws = carve_workspace(plan, wsp, wsb);

  // ---- check before timing: y poisoned, one forward, the oracle (check.cpp).
  const ForwardCheck chk = checked_forward(layer, plan, xt, yt, wsp, wsb, args.check_tokens, args.seed, s);
  std::printf("\n%s\n", chk.summary.c_str());
  if (!chk.ok) return Outcome::check_failed;
  std::vector<uint16_t> y_checked(size_t(T * H)), y_after(size_t(T * H));
  MK_CUDA_CHECK(cudaMemcpy(y_checked.data(), y.get(), size_t(y.bytes()), cudaMemcpyDeviceToHost));

  // ---- weight copies for L2 rotation, sized by the experts this routing touches.
  std::vector<int32_t> touched;
  for (int64_t e = 0; e < E; ++e)
    if (chk.expert_counts[size_t(e)] > 0) touched.push_back(int32_t(e));
  const int64_t touched_bytes = int64_t(touched.size()) * 3 * H * F * 2;
  const int64_t baseline_bytes = args.no_baselines ? 0 : A * (2 * H + 3 * F) * 2;
  const WeightRotation rot = rotate_weights(layer, touched, cx.dev.l2_bytes, baseline_bytes, s);  // timing.hpp
  const int copies = rot.copies;
  const std::string rotation = rot.note;

  // ---- moekit stages, each alone on the workspace of the checked run (inputs stay valid).
  const int warmup = args.warmup, steps = args.steps;
  // Stages are timed as CUDA graphs of `reps` back-to-back calls (rep r on weight copy
  // (c + r) % copies, so the L2 rotation holds): eager launches of a few-microsecond kernel
  // measure the host's launch rate, not the GPU; a layer in production runs as a graph. The
  // small stages take kSmallStageReps per graph; the GEMMs are long enough alone.
  constexpr int kSmallStageReps = 10;
  auto timed = [&](const std::function<void(int)>& step, int reps = 1) {
    return rotated_graph_ms(step, copies, reps, warmup, steps, s);
  };
  auto timed_eager = [&](const std::function<void(int)>& step) {
    return time_median_ms(s, warmup, steps, [&](int i) { step(i % copies); });
  };
  auto up = [&](int c) { expert_up(plan, xt, layer.w13(c), ws, s); };
  auto down = [&](int c) { expert_down(plan, layer.w2(c), ws.topk_weights, ws, s); };
  auto forward = [&](int c) { moe_forward(plan, layer.inputs(c, xt), spec.router, yt, wsp, wsb, s); };
  StageTimes ms;  // timing.hpp: each stage's time and clocks
  ms["router"] = timed([&](int c) {  // the call moe_forward makes, logits scratch included
    route(xt, layer.w_gate(c), Tensor{}, layer.score_bias(), spec.router, ws.topk_ids, ws.topk_weights, s,
          ws.router_logits);
  }, kSmallStageReps);
  ms["align"] = timed([&](int) { align(plan, ws.topk_ids, ws, s); }, kSmallStageReps);
  ms["up"] = timed(up);
  ms["down"] = timed(down);
  ms["combine"] = timed([&](int) {  // the combine moe_forward runs for this plan
    if (plan.down_splits > 1) combine_partials(ws.y_partials, shape.topk, yt, s);
    else combine(ws.y_rows, shape.topk, yt, s);
  }, kSmallStageReps);
  ms["experts"] = timed([&](int c) {
    up(c);
    down(c);
  });
  ms["layer"] = timed_eager(forward);  // eager: host launch cost included
  LayerGraphs graphs;                  // one graph per weight copy, launched one by one
  for (int c = 0; c < copies; ++c) graphs.capture([&] { forward(c); }, s);
  ms["layer-graph"] = timed_eager([&](int c) { graphs.launch(c, s); });

  // ---- read time: the same weight bytes streamed with the same rotation.
  std::map<std::string, double> read_ms;
  for (const char* stage : {"router", "up", "down", "experts", "layer"}) {
    std::vector<StreamReader> readers;
    for (int c = 0; c < copies; ++c) readers.emplace_back(weight_ranges(stage, layer, c, touched));
    read_ms[stage] = rotated_read_ms(readers, s, warmup, steps);
  }
  read_ms["layer-graph"] = read_ms["layer"];

  std::vector<BaselineResult> baselines;
  if (!args.no_baselines) {
    BaselineRequest q;
    q.layer = &layer;
    q.tokens = T;
    q.x = xt;
    q.topk_ids = &chk.topk_ids;
    q.copies = copies;
    q.warmup = warmup;
    q.steps = steps;
    q.stream = s;
    q.blas = cx.blas;
    baselines = run_baselines(q);
  }

  // ---- after timing: the histogram and padded length from the workspace, and determinism.
  MK_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<int32_t> counts(static_cast<size_t>(E));
  int32_t rows_padded = 0;
  MK_CUDA_CHECK(cudaMemcpy(counts.data(), ws.expert_counts.data, size_t(E) * 4, cudaMemcpyDeviceToHost));
  MK_CUDA_CHECK(cudaMemcpy(&rows_padded, ws.num_rows_padded.data, 4, cudaMemcpyDeviceToHost));
  MK_CUDA_CHECK(cudaMemcpy(y_after.data(), y.get(), size_t(y.bytes()), cudaMemcpyDeviceToHost));
  bool ok = true;
  if (y_after != y_checked) {
    std::printf("DETERMINISM FAILED: y after the timed runs differs from the checked y (T=%lld)\n", (long long)T);
    ok = false;
  }
  Routed routed{0, rows_padded, plan.block_m()};
  int32_t max_count = 0;
  for (int32_t c : counts) {
    routed.touched_experts += c > 0;
    max_count = std::max(max_count, c);
  }
  const double tpe = A > 0 ? double(max_count) / (double(A) / double(E)) : 0;

  auto make_row = [&](const std::string& stage, const std::string& impl, double t_ms, const std::string& note) {
    Row r;
    r.preset = spec.name;
    r.shape = shape;
    r.stage = stage;
    r.impl = impl;
    r.ms = t_ms;
    r.cost = stage_cost(stage, shape, routed);
    if (read_ms.count(stage)) r.read_time_ms = read_ms[stage];
    r.tokens_per_expert_max_over_mean = tpe;
    r.touched_experts = routed.touched_experts;
    r.tokens_per_expert = counts;
    r.config = plan.str();
    r.note = note;
    r.weight_copies = copies;
    r.skew = args.skew;
    if (impl == "moekit") r.clocks = ms.clocks(stage);
    return r;
  };
  // The aligned layout's padding: the GEMMs compute whole block_m-row blocks.
  const int64_t padded_rows = chk.rows_padded;
  std::printf("plan: %s; %lld experts touched (%.1f MB of expert weights); %lld of %lld padded rows used (%.1f%%)%s%s%s\n",
              plan.str().c_str(), (long long)routed.touched_experts, double(touched_bytes) / 1e6, (long long)A,
              (long long)padded_rows, padded_rows > 0 ? 100.0 * double(A) / double(padded_rows) : 100.0,
              rotation.empty() ? "" : "; ", rotation.c_str(), ok ? "; y bitwise unchanged by the timed runs" : "");
  print_table_header();
  for (const char* stage : kStages) {
    std::string note = rotation;
    if (std::strcmp(stage, "layer-graph") == 0)
      note = "moe_forward captured once per weight copy (global capture mode) and replayed" + (rotation.empty() ? "" : "; " + rotation);
    rows.push_back(make_row(stage, "moekit", ms[stage], note));
    print_row(rows.back(), cx.info);
  }
  for (const BaselineResult& b : baselines) {
    if (!b.ok) {
      std::printf("BASELINE FAILED: %s (row omitted)\n", b.error.c_str());
      ok = false;
      continue;
    }
    char err[48];
    std::snprintf(err, sizeof err, "; checked rel err %.2e", b.check_err);
    rows.push_back(make_row("experts", b.impl, b.ms, b.note + err + (rotation.empty() ? "" : "; " + rotation)));
    print_row(rows.back(), cx.info);
  }
  return ok ? Outcome::ok : Outcome::verify_failed;
}

}  // namespace

RunInfo start_bench_run(const char* title, const LayerSpec& spec, const BenchArgs& args, const std::string& command,
                        const DeviceInfo& dev, cublasHandle_t blas, cudaStream_t stream) {
  RunInfo info;
  info.command = command;
  info.date = iso_utc_now();
  info.gpu = dev.name;
  info.sm_count = dev.sm_count;
  info.l2_bytes = dev.l2_bytes;
  std::printf("%s %s — %s on %s (%d SMs, L2 %.0f MB), %d steps after %d warm-up\n", title, kVersion,
              spec.str().c_str(), dev.name.c_str(), dev.sm_count, double(dev.l2_bytes) / 1e6, args.steps, args.warmup);
  const Ceilings ceil = measure_ceilings(dev, blas, stream, args.seed, args.warmup, args.steps);
  info.read_ceiling_TBps = ceil.read_TBps;
  info.read_ceiling_bytes = ceil.read_bytes;
  info.dense_ceiling_TFLOPs = ceil.dense_TFLOPs;
  info.dense_ceiling_dim = ceil.gemm_dim;
  std::printf("ceilings: streaming read %.3f TB/s (%.2f GB buffer); dense bf16 GEMM %.1f TFLOP/s (cuBLAS %lld^3)\n",
              ceil.read_TBps, double(ceil.read_bytes) / 1e9, ceil.dense_TFLOPs, (long long)ceil.gemm_dim);
  return info;
}

void apply_skew(GpuLayer& layer, const BenchArgs& args, cudaStream_t stream) {
  if (!args.skew) return;
  const SkewResult r = calibrate_skew(layer, args.seed, stream);
  std::printf("skew: router bias calibrated on %lld tokens: expert %d at %.2fx the mean load, others %.2fx..%.2fx "
              "(worst |log(load/target)| %.2f); the bias picks experts, weights stay unbiased\n",
              (long long)kSkewCalibTokens, r.hot_expert, r.hot_load, r.min_other, r.max_other, r.worst_log_error);
}

int run_bench(const BenchArgs& args, const std::string& command) {
  const LayerSpec spec = resolve_layer(args.layer);  // option errors first, GPU or not
  if (!require_hopper("bench", "", "On this machine, `moekit check --cpu` runs the CPU oracle.")) return kExitNoGpu;
  if (args.tokens.empty()) throw Error("--tokens: give at least one token count");
  const DeviceInfo dev = query_device();
  Stream stream;
  Cublas blas(stream.s);
  const RunInfo info = start_bench_run("moekit bench", spec, args, command, dev, blas.h, stream.s);
  GpuLayer layer(spec, args.seed, stream.s);
  apply_skew(layer, args, stream.s);

  const Context cx{args, layer, dev, info, stream.s, blas.h};
  return bench_each_token_count(args, info, [&](int64_t T, std::vector<Row>& rows) { return bench_tokens(cx, T, rows); });
}

}  // namespace moekit::cli
