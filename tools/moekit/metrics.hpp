// metrics.hpp — what one benchmark row counts: the bytes and FLOPs of a stage, from the shape
// and the routing actually produced (touched experts, padded rows). Pure host code.
//
// NOTES: bytes are the compulsory traffic of the stage as a unit: the weights it must read
// (only experts with >= 1 assignment; an untouched expert costs nothing; the backward writes every
// expert's weight gradient) plus its activations
// read once and written once. Intermediates that the pipeline passes through memory by design
// (act, y_rows) count at every stage that reads or writes them, so `experts` = up + down and
// `layer` = the sum of the five stages. Re-reads of x rows by several experts, padding rows and
// L2 traffic are implementation costs, not counted. Baseline rows use the same bytes and FLOPs
// as moekit's `experts` row, so their TB/s and TFLOP/s compare the same work.
#pragma once

#include <cstdint>
#include <string>

#include "moekit/moe.hpp"

namespace moekit::cli {

struct Routed {
  int64_t touched_experts = 0;  // experts with >= 1 assignment
  int64_t rows_padded = 0;      // num_rows_padded from align
  int64_t block_m = 0;
};

struct StageCost {
  int64_t weight_bytes = 0;  // weights the stage must read (what read_time_ms streams)
  int64_t act_bytes = 0;     // activations read + written
  double flops = 0;          // useful FLOPs (no padding rows)
  int64_t bytes() const { return weight_bytes + act_bytes; }
};

// The stages (rows) a benchmark reports, in order (fp8 runs add "quantize" after the router).
inline const char* const kStages[] = {"router", "align", "up", "down", "combine", "experts", "layer", "layer-graph"};
// `moekit bench --backward`'s rows: moe_backward eager, the same from a CUDA graph, and the layer's
// forward followed by its backward in one graph (bench_backward.cu); then the training forward that
// keeps h (ForwardPlan::save_h) and the backward that reads it (SavedActivations::h): that
// backward from a graph, and both in one graph.
inline const char* const kBackwardStages[] = {"backward", "backward-graph", "forward+backward", "backward-saved-h",
                                              "forward+backward-saved-h"};

// FP8 (Precision::fp8): e4m3 weights plus their FP32 block scales, e4m3 x_q and act plus their
// per-row scales; the quantize stage reads x (bf16) and writes x_q and x_scale.
inline StageCost stage_cost(const std::string& stage, const MoeShape& s, const Routed& r,
                            Precision p = Precision::bf16) {
  const int64_t T = s.tokens, H = s.hidden, F = s.inter, E = s.experts, A = s.tokens * s.topk;
  const bool fp8 = p == Precision::fp8;
  const int64_t kbH = fp8_blocks(H), kbF = fp8_blocks(F);
  StageCost c;
  if (fp8 && stage == "quantize") {
    c.act_bytes = T * H * 2 + T * H + T * kbH * 4;
  } else if (fp8 && stage == "up") {
    c.weight_bytes = r.touched_experts * (2 * H * F + w13_scale_rows(F) * kbH * 4);
    c.act_bytes = T * H + T * kbH * 4 + A * F + A * kbF * 4;  // x_q and its scales in; act and its scales out
    c.flops = 2.0 * double(A) * 2.0 * double(H) * double(F);
  } else if (fp8 && stage == "down") {
    c.weight_bytes = r.touched_experts * (H * F + kbH * kbF * 4);
    c.act_bytes = A * F + A * kbF * 4 + A * 4 + A * H * 2;
    c.flops = 2.0 * double(A) * double(H) * double(F);
  } else if (stage == "router") {
    c.weight_bytes = E * H * 2;          // w_gate bf16
    c.act_bytes = T * H * 2 + A * 8;     // x in; topk ids (i32) and weights (f32) out
    c.flops = 2.0 * double(T) * double(H) * double(E);
  } else if (stage == "align") {
    const int64_t blocks = r.block_m > 0 ? r.rows_padded / r.block_m : 0;
    // topk ids in; sorted_ids, block_expert, expert_counts, num_rows_padded out
    c.act_bytes = A * 4 + r.rows_padded * 4 + blocks * 4 + E * 4 + 4;
  } else if (stage == "up") {
    c.weight_bytes = r.touched_experts * 2 * H * F * 2;  // gate and up rows of w13
    c.act_bytes = T * H * 2 + A * F * 2;                // x in (each row once); act out
    c.flops = 2.0 * double(A) * 2.0 * double(H) * double(F);
  } else if (stage == "down") {
    c.weight_bytes = r.touched_experts * H * F * 2;     // w2
    c.act_bytes = A * F * 2 + A * 4 + A * H * 2;        // act and routing weights in; y_rows out
    c.flops = 2.0 * double(A) * double(H) * double(F);
  } else if (stage == "combine") {
    c.act_bytes = A * H * 2 + T * H * 2;  // y_rows in; y out
    c.flops = double(A) * double(H);      // one FP32 add per row element
  } else if (stage == "experts") {
    const StageCost up = stage_cost("up", s, r, p), down = stage_cost("down", s, r, p);
    c.weight_bytes = up.weight_bytes + down.weight_bytes;
    c.act_bytes = up.act_bytes + down.act_bytes;
    c.flops = 2.0 * double(A) * 3.0 * double(H) * double(F);
  } else if (stage == "layer" || stage == "layer-graph") {
    for (const char* part : {"router", "quantize", "align", "up", "down", "combine"}) {
      if (!fp8 && std::string(part) == "quantize") continue;
      const StageCost q = stage_cost(part, s, r, p);
      c.weight_bytes += q.weight_bytes;
      c.act_bytes += q.act_bytes;
    }
    // The layer's FLOPs are the experts' (docs/design.md, "What the benchmarks report"); the router's 2·T·H·E is < 1%.
    c.flops = 2.0 * double(A) * 3.0 * double(H) * double(F);
  } else if (!fp8 && (stage == "backward" || stage == "backward-graph")) {
    // moe_backward as `moekit bench --backward` runs it (h recomputed, RouterGrad::gate, dx and
    // bf16 dW). Weights: the touched experts' w13 and w2 read; dW13 and dW2 written, all E experts'
    // (the output is [E, ...] and an untouched expert's gradient is exact zeros, which must reach
    // memory like any other value: at T = 1 they are most of the bytes, DeepSeek-V3 21.8 of 23.2
    // GB); w_gate read and d_w_gate written. (Accumulating into an f32 main_grad, which the bench
    // does not time, the untouched experts are neither read nor written.)
    const int64_t read_bytes = r.touched_experts * 3 * H * F * 2, written_bytes = E * 3 * H * F * 2;
    c.weight_bytes = read_bytes + written_bytes + 2 * E * H * 2;
    // x and dy in, dx out; the routing and the logits in; and, through memory by design, h
    // (written, read), dh (written, read by the dx and dW13 GEMMs), act_w and dx_rows (written,
    // read). (The router's part of dx stays on chip: dx_router_combine_kernel adds it.)
    c.act_bytes = 3 * T * H * 2 + A * 8 + T * E * 4 + 2 * A * 2 * F * 2 + 3 * A * 2 * F * 2 + 2 * A * F * 2 +
                  2 * A * H * 2;
    // Useful FLOPs: D, dx, dW2 and dW13, twice the forward's (docs/design.md, "Backward"); the
    // recomputed h (4·T·k·H·F more) is the price of keeping no activation, and the router's
    // 4·T·E·H are < 1%.
    c.flops = 12.0 * double(A) * double(H) * double(F);
  } else if (!fp8 && stage == "backward-saved-h") {
    // The same work with h given: read once by the D GEMM, never written.
    c = stage_cost("backward", s, r, p);
    c.act_bytes -= A * 2 * F * 2;
  } else if (!fp8 && (stage == "forward+backward" || stage == "forward+backward-saved-h")) {
    const bool saved = stage == "forward+backward-saved-h";
    const StageCost fwd = stage_cost("layer", s, r, p), bwd = stage_cost(saved ? "backward-saved-h" : "backward", s, r, p);
    c.weight_bytes = fwd.weight_bytes + bwd.weight_bytes;
    c.act_bytes = fwd.act_bytes + bwd.act_bytes + (saved ? A * 2 * F * 2 : 0);  // saved: the forward writes h
    c.flops = fwd.flops + bwd.flops;
  } else {
    throw Error("stage_cost: unknown stage '" + stage + "'");
  }
  return c;
}

}  // namespace moekit::cli
