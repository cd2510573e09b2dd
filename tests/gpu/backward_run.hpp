// backward_run.hpp — the device side of the backward's GPU tests: one case's inputs, the forward's
// layout (align on the device, or the training forward keeping h), the outputs and a workspace, and
// moe_backward over them (BackwardRun); and what backward_test.cu and backward_wgmma_test.cu share:
// the forward plans of a layout, the options, a case's name and the BackwardTest fixture (one class
// for both files: gtest refuses a suite whose tests use two fixture types).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backward_util.hpp"

namespace moekit::test {

// The device side of one case: inputs, the forward's layout (align on the device), the outputs and
// a workspace, and moe_backward over them.
struct BackwardRun {
  Case c;
  ForwardPlan fwd;
  BackwardPlan plan;
  DeviceBuffer<ref::bf16> x, w13, w2, dy, h, dx, y;
  DeviceBuffer<float> weights, logits, aux, d_topk, d_router_logits;
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<unsigned char> w_gate, fwd_ws, bwd_ws, dw13, dw2, d_w_gate;
  std::vector<unsigned char> dw_init13, dw_init2;  // accumulate: the f32 main_grad before the step
  BackwardInputs in;
  BackwardGrads grads;

  template <class T>
  static DeviceBuffer<T> on_device(const std::vector<T>& host) {  // an empty vector: no buffer
    return host.empty() ? DeviceBuffer<T>() : DeviceBuffer<T>(host);
  }
  static DeviceBuffer<unsigned char> bytes_of(const void* p, size_t n) {
    DeviceBuffer<unsigned char> b(n);
    if (n) MK_CUDA_CHECK(cudaMemcpy(b.ptr, p, n, cudaMemcpyHostToDevice));
    return b;
  }

  // pass_d_topk: give grads.d_topk_weights (required with RouterGrad::none; else the workspace's is used).
  // over: kernel choices instead of the planner's, where the plan allows them (PlanOverride).
  BackwardRun(const ForwardPlan& f, const BackwardOptions& o, Case c_, cudaStream_t stream, std::mt19937_64& rng,
              bool pass_d_topk = true, PlanOverride over = {})
      : c(std::move(c_)), fwd(f), plan(plan_backward(f, query_device(), o)), x(on_device(c.x)), w13(on_device(c.w13)),
        w2(on_device(c.w2)), dy(on_device(c.dy)), weights(on_device(c.weights)), logits(on_device(c.logits)),
        aux(on_device(c.aux)), ids(on_device(c.ids)) {
    over.apply(plan);
    const MoeShape& s = c.s;
    const int64_t T = s.tokens, H = s.hidden, F = s.inter, E = s.experts, k = s.topk;
    fwd_ws = DeviceBuffer<unsigned char>(workspace_bytes(fwd));
    fwd_ws.poison();
    const Workspace ws = carve_workspace(fwd, fwd_ws.ptr, fwd_ws.count);
    align(fwd, Tensor(ids.ptr, DType::i32, {T, k}), ws, stream);
    in.x = Tensor(x.ptr, DType::bf16, {T, H});
    in.w13 = Tensor(w13.ptr, DType::bf16, {E, 2 * F, H});
    in.w2 = Tensor(w2.ptr, DType::bf16, {E, H, F});
    in.topk_ids = Tensor(ids.ptr, DType::i32, {T, k});
    in.topk_weights = Tensor(weights.ptr, DType::f32, {T, k});
    in.sorted_ids = ws.sorted_ids, in.block_expert = ws.block_expert;
    in.num_rows_padded = ws.num_rows_padded, in.expert_counts = ws.expert_counts;
    in.dy = Tensor(dy.ptr, DType::bf16, {T, H});
    if (o.saved == SavedActivations::h) {
      if (fwd.save_h)
        forward_h(stream);
      else
        upload_h(ws, stream);
    }
    if (c.router != RouterGrad::none) in.router_logits = Tensor(logits.ptr, DType::f32, {T, E});
    if (c.router == RouterGrad::gate) {
      const size_t n = size_t(E * H) * size_t(dtype_bytes(c.w_gate_dtype));
      w_gate = bytes_of(c.w_gate_ptr(), n);
      in.w_gate = Tensor(w_gate.ptr, c.w_gate_dtype, {E, H});
      if (!c.aux.empty()) in.d_logits_aux = Tensor(aux.ptr, DType::f32, {T, E});
      d_w_gate = DeviceBuffer<unsigned char>(n);
      grads.d_w_gate = Tensor(d_w_gate.ptr, c.w_gate_dtype, {E, H});
    }
    if (o.input_grad) {
      dx = DeviceBuffer<ref::bf16>(size_t(T * H));
      grads.dx = Tensor(dx.ptr, DType::bf16, {T, H});
    }
    if (o.weight_grads) {
      const DType d = o.weight_grad_dtype;
      dw13 = DeviceBuffer<unsigned char>(size_t(E * 2 * F * H * dtype_bytes(d)));
      dw2 = DeviceBuffer<unsigned char>(size_t(E * H * F * dtype_bytes(d)));
      grads.dw13 = Tensor(dw13.ptr, d, {E, 2 * F, H});
      grads.dw2 = Tensor(dw2.ptr, d, {E, H, F});
      if (o.accumulate_weight_grads) {  // main_grad of the gradients' magnitude, so its rounding stays small
        auto init = [&](size_t n) {
          // every fifth a -0: adding a +0 to it (an expert with no rows) would make it +0, bitwise new
          std::vector<float> v = random_f32(n, rng);
          for (size_t i = 0; i < n; i += 5) v[i] = -0.0f;
          std::vector<unsigned char> b(n * 4);
          std::memcpy(b.data(), v.data(), b.size());
          return b;
        };
        dw_init13 = init(size_t(E * 2 * F * H)), dw_init2 = init(size_t(E * H * F));
      }
    }
    if (pass_d_topk || c.router == RouterGrad::none) {
      d_topk = DeviceBuffer<float>(size_t(T * k));
      grads.d_topk_weights = Tensor(d_topk.ptr, DType::f32, {T, k});
    }
    if (c.router == RouterGrad::logits) {
      d_router_logits = DeviceBuffer<float>(size_t(T * E));
      grads.d_router_logits = Tensor(d_router_logits.ptr, DType::f32, {T, E});
    }
    bwd_ws = DeviceBuffer<unsigned char>(backward_workspace_bytes(plan));
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  // h as the forward's up GEMM would keep it: g | u of each sorted row in bf16 (poison elsewhere).
  void upload_h(const Workspace& ws, cudaStream_t stream) {
    const int64_t F = c.s.inter, k = c.s.topk, TK = c.s.tokens * k, rows = plan.max_rows();
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<int32_t> sorted(static_cast<size_t>(rows)), used(1);
    MK_CUDA_CHECK(cudaMemcpy(sorted.data(), ws.sorted_ids.data, size_t(rows) * 4, cudaMemcpyDeviceToHost));
    MK_CUDA_CHECK(cudaMemcpy(used.data(), ws.num_rows_padded.data, 4, cudaMemcpyDeviceToHost));
    std::vector<ref::bf16> host(size_t(rows * 2 * F), 0xffff);
    ref::parallel_for(used[0], [&](int64_t r) {
      const int64_t a = sorted[size_t(r)];
      if (a >= TK) return;
      const std::vector<double> gu = gate_up(c, a / k, c.ids[size_t(a)]);
      for (int64_t n = 0; n < 2 * F; ++n) host[size_t(r * 2 * F + n)] = ref::to_bf16(float(gu[size_t(n)]));
    });
    h = DeviceBuffer<ref::bf16>(host);
    in.h = Tensor(h.ptr, DType::bf16, {rows, 2 * F});
  }

  // h as the training forward keeps it (ForwardPlan::save_h): experts_forward over the same routing
  // (its align writes the same layout again) into a poisoned h, in.h = that h; its y is kept for
  // comparisons. A plan without save_h runs the plain forward (y only).
  void forward_h(cudaStream_t stream) {
    const int64_t T = c.s.tokens, H = c.s.hidden, F = c.s.inter;
    y = DeviceBuffer<ref::bf16>(size_t(T * H));
    y.poison();
    Tensor ht;
    if (fwd.save_h) {
      h = DeviceBuffer<ref::bf16>(size_t(fwd.max_rows() * 2 * F));
      h.poison();
      ht = Tensor(h.ptr, DType::bf16, {fwd.max_rows(), 2 * F});
    }
    experts_forward(fwd, in.x, in.w13, in.w2, in.topk_ids, in.topk_weights, Tensor(y.ptr, DType::bf16, {T, H}),
                    fwd_ws.ptr, fwd_ws.count, stream, Tensor(), ht);
    if (fwd.save_h) in.h = ht;
  }

  // Poisoned outputs and workspace (all bits set: NaN), main_grad reset when accumulating.
  void poison() {
    for (DeviceBuffer<unsigned char>* b : {&bwd_ws, &dw13, &dw2, &d_w_gate}) b->poison();
    dx.poison(), d_topk.poison(), d_router_logits.poison();
    if (!dw_init13.empty()) dw13.upload(dw_init13), dw2.upload(dw_init2);
  }
  void enqueue(cudaStream_t stream) const { moe_backward(plan, in, c.opt, grads, bwd_ws.ptr, bwd_ws.count, stream); }
  Outputs run(cudaStream_t stream) {
    poison();
    enqueue(stream);
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    return download();
  }
  Outputs download() const {
    Outputs o;
    o.dx = dx.download(), o.dw13 = dw13.download(), o.dw2 = dw2.download(), o.d_w_gate = d_w_gate.download();
    o.d_router_logits = d_router_logits.download();
    if (grads.d_topk_weights.given()) {
      o.d_topk = d_topk.download();
    } else {  // the workspace's copy, which the router read
      const BackwardWorkspace ws = carve_backward_workspace(plan, bwd_ws.ptr, bwd_ws.count);
      o.d_topk.resize(size_t(ws.d_topk_weights.numel()));
      MK_CUDA_CHECK(cudaMemcpy(o.d_topk.data(), ws.d_topk_weights.data, size_t(ws.d_topk_weights.bytes()),
                               cudaMemcpyDeviceToHost));
    }
    return o;
  }
};

inline void check_outputs(const BackwardRun& run, const Outputs& out) {
  check_outputs(run.c, run.plan, run.dw_init13, run.dw_init2, out);
}

// plan_forward's layout (block_m 0), or the first compiled mma.sync config of that block_m for both
// GEMMs: layouts of 64 and 128 rows at shapes the planner would give 16-row blocks.
inline ForwardPlan forward_plan(const MoeShape& s, int block_m = 0) {
  if (block_m == 0) return plan_forward(s, query_device());
  for (const GemmConfig& c : compiled_gemm_configs(Precision::bf16))
    if (c.block_m == block_m && c.kernel == GemmKernel::mma_sync) return plan_forward_with(s, c, c);
  ADD_FAILURE() << "no compiled mma.sync config of block_m " << block_m;
  return plan_forward(s, query_device());
}

inline BackwardOptions options(SavedActivations saved = SavedActivations::recompute, RouterGrad router = RouterGrad::none) {
  BackwardOptions o;
  o.saved = saved;
  o.router = router;
  return o;
}

inline std::string name_of(const MoeShape& s, int block_m, const BackwardOptions& o, uint64_t seed) {
  return "T=" + std::to_string(s.tokens) + " H=" + std::to_string(s.hidden) + " F=" + std::to_string(s.inter) +
         " E=" + std::to_string(s.experts) + " k=" + std::to_string(s.topk) + " block_m=" + std::to_string(block_m) +
         " saved=" + saved_activations_name(o.saved) + " router=" + router_grad_name(o.router) + " seed " +
         std::to_string(seed);
}

class BackwardTest : public GpuTest {
 protected:
  // check()'s kernel choices instead of the planner's where the plan allows them (PlanOverride;
  // the planner takes the 128-row tile only from 1024 rows an expert).
  PlanOverride over_;
  void adversarial_routings();  // backward_test.cu
  // One backward of a fresh case, checked; the run is returned for more checks.
  void check(const MoeShape& s, int block_m, const BackwardOptions& o, const RouterOptions& opt = {},
             std::vector<int32_t> ids = {}, DType w_gate_dtype = DType::bf16, bool aux = false, bool pass_d_topk = true) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(name_of(s, block_m, o, seed));
    std::mt19937_64 rng(seed);
    Case c = make_case(s, rng, o.router, opt, w_gate_dtype, std::move(ids));
    if (aux) c.aux = random_f32(size_t(s.tokens * s.experts), rng, 0.1f);
    BackwardRun run(forward_plan(s, block_m), o, std::move(c), stream, rng, pass_d_topk, over_);
    SCOPED_TRACE(run.plan.str());
    check_outputs(run, run.run(stream));
  }
};

inline RouterOptions softmax_renorm() {
  RouterOptions o;
  o.renormalize = true;
  return o;
}
inline RouterOptions sigmoid_grouped() {  // DeepSeek-V3's kind: sigmoid, 4 groups keep 2, renormalised, scaled
  RouterOptions o;
  o.scoring = Scoring::sigmoid;
  o.renormalize = true;
  o.n_group = 4;
  o.topk_group = 2;
  o.routed_scaling_factor = 2.5f;
  return o;
}

}  // namespace moekit::test
