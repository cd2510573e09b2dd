// bench_backward.cu — `moekit bench --backward`: the layer's bf16 backward pass as a training
// step runs it (moe_backward with h recomputed, RouterGrad::gate, dx and bf16 dW). For each T: one
// forward, checked as bench.cu checks it, keeps the routing, the logits and the aligned layout; dy
// is drawn; one backward is checked against the CPU oracle on sampled tokens (backward_check.cpp);
// then the backward is timed eager and replayed from a CUDA graph, the forward and the backward
// together from one graph; the same two with h kept by the forward (ForwardPlan::save_h,
// SavedActivations::h: checked too, nothing recomputed); and a cuBLAS loop of the backward's GEMMs (backward_baseline.cu), with
// the streaming read of the same weight bytes and the dense ceiling measured in the same run
// (docs/design.md, "What the benchmarks report").
//
//   build/moekit bench --backward --preset qwen3-30b-a3b --tokens 1,64,1024,4096 --json qwen-bwd.json
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench_backward.hpp"
#include "ceilings.cuh"
#include "metrics.hpp"
#include "report.hpp"
#include "skew.hpp"
#include "timing.hpp"

namespace moekit::cli {

namespace {

// What a training step with moekit's router asks of the backward: nothing kept but the layout and
// the routing (h recomputed), the gate's gradient, dx for the layer below, bf16 dW.
BackwardOptions bench_options() {
  BackwardOptions o;
  o.saved = SavedActivations::recompute;
  o.router = RouterGrad::gate;
  o.input_grad = true;
  o.weight_grads = true;
  o.weight_grad_dtype = DType::bf16;
  return o;
}

struct Context {
  const BenchArgs& args;
  GpuLayer& layer;
  const DeviceInfo& dev;
  const RunInfo& info;
  cudaStream_t stream;
  cublasHandle_t blas;
  Tensor dw13, dw2;  // [E, 2F, H], [E, H, F] bf16: the weight gradients, one pair for every T
};

// Byte ranges of what moe_backward must read and write in weight copy c — the touched experts'
// w13 and w2 and w_gate read, every expert's dW13 and dW2 (an untouched one's zeros too) and
// d_w_gate written — streamed as reads for its read time (the bytes of StageCost::weight_bytes).
// The gradients are one buffer for all copies: the weights rotate past L2 between two steps, and
// dW of all E experts is larger than L2 in every preset, so a step's gradient writes do not find
// the last step's lines either.
std::vector<std::pair<const void*, int64_t>> backward_ranges(const GpuLayer& layer, int c,
                                                             const std::vector<int32_t>& touched, const Tensor& dw13,
                                                             const Tensor& dw2, const Tensor& d_w_gate) {
  const MoeShape& s = layer.spec().shape;
  const int64_t w13_e = 2 * s.inter * s.hidden * 2, w2_e = s.hidden * s.inter * 2, gate = s.experts * s.hidden * 2;
  std::vector<std::pair<const void*, int64_t>> r = weight_ranges("experts", layer, c, touched);
  r.emplace_back(layer.w_gate(c).data, gate);
  r.emplace_back(d_w_gate.data, gate);
  r.emplace_back(dw13.data, s.experts * w13_e);
  r.emplace_back(dw2.data, s.experts * w2_e);
  return r;
}

// Checks, times and reports one token count; `rows` gets every row that was measured. A failed
// check times nothing; a failure after timing (determinism, the baseline) keeps the rows.
Outcome bench_tokens(const Context& cx, int64_t T, std::vector<Row>& rows) {
  const BenchArgs& args = cx.args;
  GpuLayer& layer = cx.layer;
  const LayerSpec& spec = layer.spec();
  const cudaStream_t s = cx.stream;
  MoeShape shape = spec.shape;
  shape.tokens = T;
  const int64_t H = shape.hidden, F = shape.inter, E = shape.experts, A = shape.assignments();
  const ForwardPlan fplan = plan_forward(shape, cx.dev);
  BackwardPlan bplan = plan_backward(fplan, cx.dev, bench_options());
  if (args.backward_mma_sync) use_wgmma_gemms(bplan, false, false, false, false);  // the A/B of the wgmma GEMMs
  const DeviceBuffer x = random_activations(T, H, args.seed, kStreamX, s);
  const DeviceBuffer dy = random_activations(T, H, args.seed, kStreamDy, s);  // N(0, 1), as the GPU tests' dy
  const DeviceBuffer y(T * H * 2), dx(T * H * 2), d_w_gate(E * H * 2);
  const DeviceBuffer fwd_buf(int64_t(workspace_bytes(fplan))), bwd_buf(int64_t(backward_workspace_bytes(bplan)));
  const Tensor xt(x.get(), DType::bf16, {T, H}), yt(y.get(), DType::bf16, {T, H});
  const Tensor dyt(dy.get(), DType::bf16, {T, H}), dxt(dx.get(), DType::bf16, {T, H});
  const Tensor d_w_gate_t(d_w_gate.get(), DType::bf16, {E, H});
  void* const fwd_ws = fwd_buf.get();
  const size_t fwd_bytes = size_t(fwd_buf.bytes()), bwd_bytes = size_t(bwd_buf.bytes());
  const Workspace ws = carve_workspace(fplan, fwd_ws, fwd_bytes);
  const BackwardWorkspace bws = carve_backward_workspace(bplan, bwd_buf.get(), bwd_bytes);

  // ---- check before timing: the forward (check.cpp), whose routing and layout the backward
  // reads from its workspace, then one backward on poisoned outputs against the oracle.
  const ForwardCheck fchk = checked_forward(layer, fplan, xt, yt, fwd_ws, fwd_bytes, args.check_tokens, args.seed, s);
  std::printf("\n%s\n", fchk.summary.c_str());
  if (!fchk.ok) return Outcome::check_failed;
  // What the backward reads from forward workspace w (and h, when the forward kept it).
  auto inputs = [&](int c, const Workspace& w, const Tensor& h = Tensor()) {
    BackwardInputs in;
    in.x = xt;
    in.w13 = layer.w13(c), in.w2 = layer.w2(c), in.w_gate = layer.w_gate(c);
    in.router_logits = w.router_logits;
    in.topk_ids = w.topk_ids, in.topk_weights = w.topk_weights;
    in.sorted_ids = w.sorted_ids, in.block_expert = w.block_expert;
    in.num_rows_padded = w.num_rows_padded, in.expert_counts = w.expert_counts;
    in.h = h;
    in.dy = dyt;
    return in;
  };
  BackwardGrads grads;  // d_topk_weights stays in the workspace (the router reads it there)
  grads.dx = dxt, grads.dw13 = cx.dw13, grads.dw2 = cx.dw2, grads.d_w_gate = d_w_gate_t;
  auto forward = [&](int c) { moe_forward(fplan, layer.inputs(c, xt), spec.router, yt, fwd_ws, fwd_bytes, s); };
  auto backward = [&](int c) { moe_backward(bplan, inputs(c, ws), spec.router, grads, bwd_buf.get(), bwd_bytes, s); };
  // The training forward that keeps h (save_h) and the backward that reads it (SavedActivations::h),
  // on a workspace of their own.
  ForwardPlan fplan_h = fplan;
  fplan_h.save_h = true;
  BackwardOptions saved_h = bench_options();
  saved_h.saved = SavedActivations::h;
  BackwardPlan bplan_h = plan_backward(fplan_h, cx.dev, saved_h);
  if (args.backward_mma_sync) use_wgmma_gemms(bplan_h, false, false, false, false);
  const DeviceBuffer fwd_h_buf(int64_t(workspace_bytes(fplan_h))), bwd_h_buf(int64_t(backward_workspace_bytes(bplan_h)));
  const DeviceBuffer h_buf(fplan_h.max_rows() * 2 * F * 2);
  const Tensor ht(h_buf.get(), DType::bf16, {fplan_h.max_rows(), 2 * F});
  const size_t fwd_h_bytes = size_t(fwd_h_buf.bytes()), bwd_h_bytes = size_t(bwd_h_buf.bytes());
  const Workspace ws_h = carve_workspace(fplan_h, fwd_h_buf.get(), fwd_h_bytes);
  const BackwardWorkspace bws_h = carve_backward_workspace(bplan_h, bwd_h_buf.get(), bwd_h_bytes);
  auto forward_h = [&](int c) {
    moe_forward(fplan_h, layer.inputs(c, xt), spec.router, yt, fwd_h_buf.get(), fwd_h_bytes, s, Tensor(), ht);
  };
  auto backward_h = [&](int c) {
    moe_backward(bplan_h, inputs(c, ws_h, ht), spec.router, grads, bwd_h_buf.get(), bwd_h_bytes, s);
  };
  // 0xff bytes: NaN in bf16 and f32, so a value the backward fails to write cannot pass.
  for (const Tensor* t : {&dxt, &d_w_gate_t, &cx.dw13, &cx.dw2})
    MK_CUDA_CHECK(cudaMemsetAsync(t->data, 0xff, size_t(t->bytes()), s));
  MK_CUDA_CHECK(cudaMemsetAsync(bwd_buf.get(), 0xff, bwd_bytes, s));
  backward(0);  // also the one eager call a capture needs first
  const BackwardOutputs out{dxt, bws.d_topk_weights};
  const BackwardCheck bchk = check_backward(layer, shape, ws, xt, dyt, out, args.check_tokens, args.seed, s);
  std::printf("%s\n", bchk.summary.c_str());
  if (!bchk.ok) return Outcome::check_failed;
  const std::vector<uint16_t> y_checked = copy_to_host<uint16_t>(y.get(), T * H);
  const std::vector<uint16_t> dx_checked = copy_to_host<uint16_t>(dx.get(), T * H);
  // The saved-h pair on poisoned outputs: checked against the oracle as above, and compared bitwise
  // with the recomputing path (equal where the forward's up GEMM and the recomputation are one
  // kernel family: the wgmma kernel at block_m 128).
  for (const Tensor* t : {&dxt, &yt}) MK_CUDA_CHECK(cudaMemsetAsync(t->data, 0xff, size_t(t->bytes()), s));
  MK_CUDA_CHECK(cudaMemsetAsync(bwd_h_buf.get(), 0xff, bwd_h_bytes, s));
  forward_h(0);
  backward_h(0);
  const BackwardCheck hchk =
      check_backward(layer, shape, ws_h, xt, dyt, BackwardOutputs{dxt, bws_h.d_topk_weights}, args.check_tokens, args.seed, s);
  std::printf("saved h: %s\n", hchk.summary.c_str());
  if (!hchk.ok) return Outcome::check_failed;
  const bool y_same = copy_to_host<uint16_t>(y.get(), T * H) == y_checked;
  const bool dx_same = copy_to_host<uint16_t>(dx.get(), T * H) == dx_checked;
  std::printf("saved h: y %s the forward's without save_h; dx %s the recomputing backward's\n",
              y_same ? "bitwise" : "DIFFERS FROM", dx_same ? "bitwise" : "not bitwise");
  if (!y_same) return Outcome::check_failed;  // save_h must not change the forward
  forward(0);
  backward(0);  // the recomputing pair's outputs again, for the timed runs' determinism check

  // ---- weight copies for L2 rotation, sized by the experts this routing touches.
  std::vector<int32_t> touched;
  for (int64_t e = 0; e < E; ++e)
    if (fchk.expert_counts[size_t(e)] > 0) touched.push_back(int32_t(e));
  const int64_t baseline_bytes = args.no_baselines ? 0 : backward_baseline_bytes(shape);
  const WeightRotation rot = rotate_weights(layer, touched, cx.dev.l2_bytes, baseline_bytes, s);  // timing.hpp
  const int copies = rot.copies, warmup = args.warmup, steps = args.steps;

  // ---- time: eager (host launch cost included), and one graph per weight copy in rotation.
  StageTimes ms;  // timing.hpp: each stage's time and clocks
  ms["backward"] = time_median_ms(s, warmup, steps, [&](int i) { backward(i % copies); });
  LayerGraphs backward_graphs, step_graphs;
  for (int c = 0; c < copies; ++c) backward_graphs.capture([&] { backward(c); }, s);
  ms["backward-graph"] = time_rotated_ms(backward_graphs, copies, warmup, steps, s);
  for (int c = 0; c < copies; ++c)
    step_graphs.capture([&] {
      forward(c);
      backward(c);
    }, s);
  ms["forward+backward"] = time_rotated_ms(step_graphs, copies, warmup, steps, s);
  // The same two with h kept: the backward and the training step, each a graph per weight copy.
  // The recomputing pair runs last again, so the determinism check below reads its outputs.
  LayerGraphs backward_h_graphs, step_h_graphs;
  for (int c = 0; c < copies; ++c) backward_h_graphs.capture([&] { backward_h(c); }, s);
  for (int c = 0; c < copies; ++c)
    step_h_graphs.capture([&] {
      forward_h(c);
      backward_h(c);
    }, s);
  ms["backward-saved-h"] = time_rotated_ms(backward_h_graphs, copies, warmup, steps, s);
  ms["forward+backward-saved-h"] = time_rotated_ms(step_h_graphs, copies, warmup, steps, s);
  step_graphs.launch(0, s);

  // ---- read time: the same bytes streamed with the same rotation.
  std::map<std::string, double> read_ms;
  {
    std::vector<StreamReader> backward_readers, step_readers;
    for (int c = 0; c < copies; ++c) {
      const auto b = backward_ranges(layer, c, touched, cx.dw13, cx.dw2, d_w_gate_t);
      auto f = weight_ranges("layer", layer, c, touched);
      f.insert(f.end(), b.begin(), b.end());
      backward_readers.emplace_back(b);
      step_readers.emplace_back(f);
    }
    read_ms["backward"] = read_ms["backward-graph"] = read_ms["backward-saved-h"] =
        rotated_read_ms(backward_readers, s, warmup, steps);
    read_ms["forward+backward"] = read_ms["forward+backward-saved-h"] = rotated_read_ms(step_readers, s, warmup, steps);
  }

  // ---- after timing: every replay left the checked dx and y, bitwise (determinism).
  MK_CUDA_CHECK(cudaStreamSynchronize(s));
  bool ok = true;
  if (copy_to_host<uint16_t>(dx.get(), T * H) != dx_checked || copy_to_host<uint16_t>(y.get(), T * H) != y_checked) {
    std::printf("DETERMINISM FAILED: dx or y after the timed runs differs from the checked one (T=%lld)\n",
                (long long)T);
    ok = false;
  }

  std::vector<BaselineResult> baselines;
  if (!args.no_baselines) {
    const std::vector<float> topk_weights = copy_to_host<float>(ws.topk_weights.data, A);
    BackwardBaselineRequest q;
    q.layer = &layer;
    q.tokens = T;
    q.x = xt, q.dy = dyt;
    q.topk_ids = &fchk.topk_ids;
    q.topk_weights = &topk_weights;
    q.dw13 = cx.dw13, q.dw2 = cx.dw2;  // moekit's rows are done with them
    q.copies = copies;
    q.warmup = warmup, q.steps = steps;
    q.stream = s, q.blas = cx.blas;
    baselines.push_back(run_backward_baseline(q));
  }

  Routed routed{int64_t(touched.size()), fchk.rows_padded, fplan.block_m()};
  int32_t max_count = 0;
  for (int32_t c : fchk.expert_counts) max_count = std::max(max_count, c);
  const double tpe = A > 0 ? double(max_count) / (double(A) / double(E)) : 0;
  auto make_row = [&](const std::string& stage, const std::string& impl, double t_ms, const std::string& config,
                      const std::string& note) {
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
    r.tokens_per_expert = fchk.expert_counts;
    r.config = config;
    r.note = note;
    r.weight_copies = copies;
    r.skew = args.skew;
    if (impl == "moekit") r.clocks = ms.clocks(stage);
    return r;
  };
  // moe_backward writes dW of all E experts, exact zeros for the untouched ones: work the API asks
  // for, counted in weight_bytes (metrics.hpp) and named here.
  const int64_t zero_dw_bytes = (E - routed.touched_experts) * 3 * H * F * 2;
  char zeros[160];
  std::snprintf(zeros, sizeof zeros,
                "; dW of the %lld untouched experts written as zeros (%.1f MB, in weight_bytes)",
                (long long)(E - routed.touched_experts), double(zero_dw_bytes) / 1e6);
  const std::string options = "saved=recompute (its 4·T·k·H·F FLOPs not counted), router=gate (d_w_gate; dx with the "
                              "router's part), dx and bf16 dW" +
                              std::string(zeros) + (rot.note.empty() ? "" : "; " + rot.note);
  std::printf("plan: %s; %lld experts touched (%.1f MB of expert weights)%s%s\n", bplan.str().c_str(),
              (long long)routed.touched_experts, double(routed.touched_experts * 3 * H * F * 2) / 1e6, zeros,
              ok ? "; dx and y bitwise unchanged by the timed runs" : "");
  print_table_header();
  const std::string step_config = fplan.str() + " | " + bplan.str();
  rows.push_back(make_row("backward", "moekit", ms["backward"], bplan.str(), "moe_backward eager: " + options));
  print_row(rows.back(), cx.info);
  rows.push_back(make_row("backward-graph", "moekit", ms["backward-graph"], bplan.str(),
                          "moe_backward captured once per weight copy (global capture mode) and replayed: " + options));
  print_row(rows.back(), cx.info);
  rows.push_back(make_row("forward+backward", "moekit", ms["forward+backward"], step_config,
                          "moe_forward (router from w_gate) then moe_backward, captured once per weight copy and "
                          "replayed: " + options));
  print_row(rows.back(), cx.info);
  const std::string saved_note = "h kept by the forward (ForwardPlan::save_h) and read by the backward "
                                 "(SavedActivations::h), nothing recomputed; router=gate, dx and bf16 dW" +
                                 std::string(zeros) + (rot.note.empty() ? "" : "; " + rot.note);
  rows.push_back(make_row("backward-saved-h", "moekit", ms["backward-saved-h"], bplan_h.str(),
                          "moe_backward captured once per weight copy and replayed: " + saved_note));
  print_row(rows.back(), cx.info);
  rows.push_back(make_row("forward+backward-saved-h", "moekit", ms["forward+backward-saved-h"],
                          fplan_h.str() + " | " + bplan_h.str(),
                          "moe_forward (save_h) then moe_backward, captured once per weight copy and replayed: " +
                              saved_note));
  print_row(rows.back(), cx.info);
  for (const BaselineResult& b : baselines) {
    if (!b.ok) {
      std::printf("BASELINE FAILED: %s (row omitted)\n", b.error.c_str());
      ok = false;
      continue;
    }
    char err[48];
    std::snprintf(err, sizeof err, "; checked rel err %.2e", b.check_err);
    const std::string note = b.note + err + (rot.note.empty() ? "" : "; " + rot.note);
    rows.push_back(make_row("backward", b.impl, b.ms, bplan.str(), note));
    print_row(rows.back(), cx.info);
  }
  return ok ? Outcome::ok : Outcome::verify_failed;
}

}  // namespace

int run_bench_backward(const BenchArgs& args, const std::string& command) {
  const LayerSpec spec = resolve_layer(args.layer);  // option errors first, GPU or not
  if (!require_hopper("bench --backward", "", "On this machine, `moekit check --cpu` runs the CPU oracle."))
    return kExitNoGpu;
  if (args.tokens.empty()) throw Error("--tokens: give at least one token count");
  const DeviceInfo dev = query_device();
  Stream stream;
  Cublas blas(stream.s);

  const RunInfo info = start_bench_run("moekit bench --backward", spec, args, command, dev, blas.h, stream.s);
  GpuLayer layer(spec, args.seed, stream.s);
  apply_skew(layer, args, stream.s);
  // The weight gradients, the size of one weight copy: allocated before the rotation's copies, so
  // those leave room for them.
  const MoeShape& s = spec.shape;
  const DeviceBuffer dw13(s.experts * 2 * s.inter * s.hidden * 2), dw2(s.experts * s.hidden * s.inter * 2);
  const Tensor dw13_t(dw13.get(), DType::bf16, {s.experts, 2 * s.inter, s.hidden});
  const Tensor dw2_t(dw2.get(), DType::bf16, {s.experts, s.hidden, s.inter});
  const Context cx{args, layer, dev, info, stream.s, blas.h, dw13_t, dw2_t};
  return bench_each_token_count(args, info, [&](int64_t T, std::vector<Row>& rows) { return bench_tokens(cx, T, rows); });
}

}  // namespace moekit::cli
