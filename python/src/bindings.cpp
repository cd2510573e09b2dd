// bindings.cpp — moekit._moekit: the public host API of include/moekit/moe.hpp for Python (the
// backward's, include/moekit/backward.hpp, is bound in bindings_backward.cpp).
//
// Tensors arrive through DLPack (nb::ndarray): a torch/CuPy/JAX array or a DLPack capsule,
// zero-copy. Every entry converts its arrays at the boundary (boundary.hpp: dtype, rank,
// row-major contiguity, CUDA device, one device for all) and names the argument when one is wrong
// (moekit::Error -> moekit.Error, a ValueError); the C++ entry then checks shapes and dtypes
// against the plan as it does for C++ callers. Kernels are enqueued on the stream the caller
// passes (an integer cudaStream_t; moekit.torch passes the current torch stream), with the GIL
// released; nothing here allocates device memory or synchronises (check_status excepted).
// A plan's precision goes by name, 'bf16' or 'fp8' (DeepSeek-V3's e4m3 weights with FP32 128x128
// block scales, which the fp8 entries take as w13_scale / w2_scale; docs/design.md, "FP8"); the
// other arguments that are not arrays are parsed in arguments.hpp.
//
// Build: `pip install .` (scikit-build-core; python/CMakeLists.txt).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "boundary.hpp"
#include "moekit/moe.hpp"
#include "moekit/version.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace moekit::py {

void bind_backward(nb::module_& m);  // bindings_backward.cpp

namespace {

ForwardPlan plan_forward_py(int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t topk,
                            nb::handle device, const std::string& precision) {
  const MoeShape shape{tokens, hidden, inter, experts, topk};
  const Precision p = parse_precision("plan_forward", precision);
  return plan_forward(shape, device_arg("plan_forward", device), p);
}

// Offsets (bytes), dtypes and shapes of the workspace's tensors, for views on the Python side.
nb::dict workspace_layout(const ForwardPlan& plan) {
  constexpr uintptr_t kBase = 256;  // any 256-byte aligned address: only offsets are returned
  const Workspace ws = carve_workspace(plan, reinterpret_cast<void*>(kBase), workspace_bytes(plan));
  nb::dict d;
  auto add = [&](const char* name, const Tensor& t) {
    std::vector<int64_t> shape(t.shape, t.shape + t.rank);
    d[name] = nb::make_tuple(int64_t(reinterpret_cast<uintptr_t>(t.data) - kBase), dtype_name(t.dtype), shape);
  };
  add("router_logits", ws.router_logits);
  add("topk_ids", ws.topk_ids);
  add("topk_weights", ws.topk_weights);
  add("sorted_ids", ws.sorted_ids);
  add("block_expert", ws.block_expert);
  add("num_rows_padded", ws.num_rows_padded);
  add("expert_counts", ws.expert_counts);
  add("act", ws.act);
  if (ws.act_scale.given()) add("act_scale", ws.act_scale);  // fp8 plans: act's and x's quantization
  if (ws.x_q.given()) add("x_q", ws.x_q);
  if (ws.x_scale.given()) add("x_scale", ws.x_scale);
  add("y_rows", ws.y_rows);
  if (ws.y_partials.given()) add("y_partials", ws.y_partials);
  add("status", ws.status);
  if (ws.align_scratch.given()) add("align_scratch", ws.align_scratch);
  add("gemm_counter", ws.gemm_counter);
  return d;
}

// The plan a layer forward runs with: the caller's, or with h given (the training forward) a copy
// of it with save_h set. NOTES: a copy, because the Python side caches one Plan per shape and shares
// it (moekit._torch_util._plan): setting the flag on it would make every later call of that shape,
// inference too, demand an h. `kept` holds the copy for the call.
const ForwardPlan& plan_with_h(const char* fn, const ForwardPlan& plan, const Tensor& h,
                               std::optional<ForwardPlan>& kept) {
  if (!h.given()) return plan;
  if (plan.precision() != Precision::bf16)
    fail(fn, "h", "is kept for the bf16 backward, but this plan is " + std::string(precision_name(plan.precision())) +
                      ": pass no h, or plan with precision='bf16'");
  kept = plan;
  kept->save_h = true;
  return *kept;
}

}  // namespace
}  // namespace moekit::py

NB_MODULE(_moekit, m) {
  using namespace moekit;
  using namespace moekit::py;
  m.doc() = "moekit: the kernels of one Mixture-of-Experts layer for NVIDIA Hopper (sm_90a).";
  m.attr("__version__") = moekit::version();  // CMakeLists.txt project(VERSION)
  m.attr("MAX_EXPERTS") = kMaxExperts;
  m.attr("MAX_TOPK") = kMaxTopk;
  m.attr("FP8_BLOCK") = kFp8Block;

  nb::exception<Error>(m, "Error", PyExc_ValueError);
  nb::exception<CudaError>(m, "CudaError", PyExc_RuntimeError);

  m.def("device_count", &device_count, "Number of visible CUDA devices; 0 where there is no GPU or driver.");

  nb::class_<DeviceInfo>(m, "DeviceInfo", "What the config chooser knows of a GPU (moekit.query_device()).")
      .def("__init__",
           [](DeviceInfo* d, std::string name, int sm_count, int cc_major, int cc_minor, int64_t smem_per_block_optin,
              int64_t l2_bytes) {
             new (d) DeviceInfo{std::move(name), sm_count, cc_major, cc_minor, smem_per_block_optin, l2_bytes};
           },
           nb::kw_only(), "name"_a = "", "sm_count"_a = 0, "cc_major"_a = 0, "cc_minor"_a = 0,
           "smem_per_block_optin"_a = 0, "l2_bytes"_a = 0)
      .def_rw("name", &DeviceInfo::name)
      .def_rw("sm_count", &DeviceInfo::sm_count)
      .def_rw("cc_major", &DeviceInfo::cc_major)
      .def_rw("cc_minor", &DeviceInfo::cc_minor)
      .def_rw("smem_per_block_optin", &DeviceInfo::smem_per_block_optin)
      .def_rw("l2_bytes", &DeviceInfo::l2_bytes)
      .def("__repr__", [](const DeviceInfo& d) {
        return "moekit.DeviceInfo(name='" + d.name + "', sm_count=" + std::to_string(d.sm_count) + ", cc=" +
               std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor) +
               ", smem_per_block_optin=" + std::to_string(d.smem_per_block_optin) +
               ", l2_bytes=" + std::to_string(d.l2_bytes) + ")";
      });

  m.def("query_device", [](int device) { return device_info("query_device", device); }, "device"_a = -1,
        "Properties of a CUDA device (-1: the current one). Raises moekit.CudaError without a GPU.");

  nb::class_<ForwardPlan>(m, "Plan", "The plan of one forward pass: every kernel choice and the buffer sizes (plan_forward).")
      .def_prop_ro("tokens", [](const ForwardPlan& p) { return p.shape.tokens; })
      .def_prop_ro("hidden", [](const ForwardPlan& p) { return p.shape.hidden; })
      .def_prop_ro("inter", [](const ForwardPlan& p) { return p.shape.inter; })
      .def_prop_ro("experts", [](const ForwardPlan& p) { return p.shape.experts; })
      .def_prop_ro("topk", [](const ForwardPlan& p) { return p.shape.topk; })
      .def_prop_ro("precision", [](const ForwardPlan& p) { return std::string(precision_name(p.precision())); },
                   "'bf16' or 'fp8': the precision of the expert GEMMs")
      .def_prop_ro("block_m", &ForwardPlan::block_m)
      .def_prop_ro("max_rows", &ForwardPlan::max_rows)
      .def_prop_ro("max_blocks", &ForwardPlan::max_blocks)
      .def_ro("down_splits", &ForwardPlan::down_splits,
              "split-K of the down GEMM: > 1 writes FP32 partials (combine_partials sums them)")
      .def_prop_ro("up", [](const ForwardPlan& p) { return p.up.str(); })
      .def_prop_ro("down", [](const ForwardPlan& p) { return p.down.str(); })
      .def_prop_ro("router", [](const ForwardPlan& p) { return p.router.str(); })
      .def_prop_ro("workspace_bytes", [](const ForwardPlan& p) { return workspace_bytes(p); })
      .def("workspace_layout", &workspace_layout,
           "{name: (offset_bytes, dtype, shape)} of the tensors carved from the workspace.")
      .def("str", &ForwardPlan::str)
      .def("__str__", &ForwardPlan::str)
      .def("__repr__", [](const ForwardPlan& p) { return "moekit.Plan(" + p.str() + ")"; });

  m.def("plan_forward", &plan_forward_py, "tokens"_a, "hidden"_a, "inter"_a, "experts"_a, "topk"_a, nb::kw_only(),
        "device"_a = nb::none(), "precision"_a = "bf16",
        "Validates the shape and picks tile configs for it. device: None (the current GPU), a device index, "
        "or a moekit.DeviceInfo (plans without a GPU). precision: 'bf16', or 'fp8' (DeepSeek-V3's e4m3 "
        "weights with 128x128 block scales; H and F multiples of 16).");

  m.def(
      "compiled_gemm_configs",
      [](const std::string& precision) {
        std::vector<std::string> out;
        for (const GemmConfig& c : compiled_gemm_configs(parse_precision("compiled_gemm_configs", precision)))
          out.push_back(c.str());
        return out;
      },
      "precision"_a = "bf16");

  // ---- stages ---------------------------------------------------------------------------------
  m.def(
      "route",
      [](nb::handle x, nb::handle w_gate, nb::handle router_logits, nb::handle score_bias, nb::handle topk_ids,
         nb::handle topk_weights, const std::string& scoring, bool renormalize, int64_t n_group, int64_t topk_group,
         double routed_scaling_factor, nb::handle logits_scratch, uintptr_t stream) {
        Call c("route");
        const Tensor tl = c.in_opt("router_logits", router_logits);
        const Tensor tx = c.in_opt("x", x), tw = c.in_opt("w_gate", w_gate);
        if (!tl.given() && (!tx.given() || !tw.given()))
          fail("route", tx.given() ? "w_gate" : "x", "give router_logits [T, E], or x [T, H] and w_gate [E, H]");
        const Tensor tb = c.in_opt("score_bias", score_bias);
        const Tensor ids = c.out("topk_ids", topk_ids), wts = c.out("topk_weights", topk_weights);
        const Tensor scratch = logits_scratch.is_none() ? Tensor() : c.out("logits_scratch", logits_scratch);
        const RouterOptions o = router_options("route", scoring, renormalize, n_group, topk_group, routed_scaling_factor);
        launch_on_device(c, [&] { moekit::route(tx, tw, tl, tb, o, ids, wts, as_stream(stream), scratch); });
      },
      "x"_a.none(), "w_gate"_a.none(), "router_logits"_a.none(), "score_bias"_a.none(), "topk_ids"_a.none(),
      "topk_weights"_a.none(), nb::kw_only(), "scoring"_a = "softmax", "renormalize"_a = false, "n_group"_a = 0,
      "topk_group"_a = 0, "routed_scaling_factor"_a = 1.0, "logits_scratch"_a.none() = nb::none(), "stream"_a = 0,
      "Stage 1: writes topk_ids [T,k] i32 and topk_weights [T,k] f32 from router_logits [T,E] f32, or from "
      "x [T,H] bf16 and w_gate [E,H] bf16/f32. logits_scratch [T,E] f32 (optional, w_gate path): the logits "
      "are then computed over many SMs first (bf16 w_gate: on the tensor cores, deterministic and batch-invariant, "
      "within 2^-12*sum|x*w| of FP32; f32 w_gate: the same bits as without it).");

  m.def(
      "quantize_tokens",
      [](const ForwardPlan& plan, nb::handle x, nb::handle workspace, uintptr_t stream) {
        Call c("quantize_tokens");
        const Tensor tx = c.in("x", x);
        const Workspace ws = c.workspace(plan, workspace).ws;
        launch_on_device(c, [&] { moekit::quantize_tokens(plan, tx, ws, as_stream(stream)); });
      },
      "plan"_a, "x"_a.none(), "workspace"_a.none(), nb::kw_only(), "stream"_a = 0,
      "Stage 1b of fp8 plans: x [T,H] bf16 -> the workspace's x_q [T,H] e4m3 and x_scale [T,ceil(H/128)] f32, "
      "per token and 128 columns (amax / 448).");

  m.def(
      "quantize_weights",
      [](nb::handle w, nb::handle q, nb::handle scale, uintptr_t stream) {
        Call c("quantize_weights");
        const Tensor tw = c.in("w", w), tq = c.out("q", q), ts = c.out("scale", scale);
        launch_on_device(c, [&] { moekit::quantize_weights(tw, tq, ts, as_stream(stream)); });
      },
      "w"_a.none(), "q"_a.none(), "scale"_a.none(), nb::kw_only(), "stream"_a = 0,
      "bf16 weights to DeepSeek-V3's FP8 format: w [P,R,C] bf16 (w13 [E,2F,H] as [2E,F,H]) -> q [P,R,C] e4m3 "
      "and scale [P,ceil(R/128),ceil(C/128)] f32, per 128x128 block (amax / 448; scale dequantizes).");

  m.def(
      "align",
      [](const ForwardPlan& plan, nb::handle topk_ids, nb::handle workspace, nb::handle expert_load, uintptr_t stream) {
        Call c("align");
        const Tensor ids = c.in("topk_ids", topk_ids), load = c.out_opt("expert_load", expert_load);
        const Workspace ws = c.workspace(plan, workspace).ws;
        launch_on_device(c, [&] { moekit::align(plan, ids, ws, as_stream(stream), load); });
      },
      "plan"_a, "topk_ids"_a.none(), "workspace"_a.none(), nb::kw_only(), "expert_load"_a.none() = nb::none(),
      "stream"_a = 0,
      "Stage 2: the expert-sorted, block_m-padded order of the assignments, in the workspace. expert_load [E] "
      "int64 (optional): gains this call's assignments per expert, on the device.");

  m.def(
      "expert_up",
      [](const ForwardPlan& plan, nb::handle x, nb::handle w13, nb::handle workspace, nb::handle w13_scale,
         nb::handle h, uintptr_t stream) {
        Call c("expert_up");
        const Tensor tx = c.in("x", x), tw = c.in("w13", w13);
        const Tensor ts = c.in_opt("w13_scale", w13_scale), th = c.out_opt("h", h);
        std::optional<ForwardPlan> kept;
        const ForwardPlan& p = plan_with_h("expert_up", plan, th, kept);
        const Workspace ws = c.workspace(p, workspace).ws;
        launch_on_device(c, [&] { moekit::expert_up(p, tx, tw, ws, as_stream(stream), ts, th); });
      },
      "plan"_a, "x"_a.none(), "w13"_a.none(), "workspace"_a.none(), nb::kw_only(), "w13_scale"_a.none() = nb::none(),
      "h"_a.none() = nb::none(), "stream"_a = 0,
      "Stage 3: act = silu(x·W_gateᵀ) ⊙ (x·W_upᵀ) per sorted row, in the workspace. fp8 plans: x is the "
      "workspace's x_q (quantize_tokens), w13 e4m3 with w13_scale [E,2·ceil(F/128),ceil(H/128)] f32. h "
      "[plan.max_rows,2F] bf16 (optional, bf16 plans): g|u of every sorted row too, as moe_forward's h.");

  m.def(
      "expert_down",
      [](const ForwardPlan& plan, nb::handle w2, nb::handle topk_weights, nb::handle workspace, nb::handle w2_scale,
         uintptr_t stream) {
        Call c("expert_down");
        const Tensor tw = c.in("w2", w2), wts = c.in("topk_weights", topk_weights);
        const Tensor ts = c.in_opt("w2_scale", w2_scale);
        const Workspace ws = c.workspace(plan, workspace).ws;
        launch_on_device(c, [&] { moekit::expert_down(plan, tw, wts, ws, as_stream(stream), ts); });
      },
      "plan"_a, "w2"_a.none(), "topk_weights"_a.none(), "workspace"_a.none(), nb::kw_only(),
      "w2_scale"_a.none() = nb::none(), "stream"_a = 0,
      "Stage 4: y_rows[a] = topk_weights[a] · act·W2ᵀ, in the workspace. fp8 plans: w2 e4m3 with w2_scale "
      "[E,ceil(H/128),ceil(F/128)] f32.");

  m.def(
      "combine",
      [](nb::handle y_rows, int64_t topk, nb::handle y, uintptr_t stream) {
        Call c("combine");
        const Tensor rows = c.in("y_rows", y_rows), ty = c.out("y", y);
        launch_on_device(c, [&] { moekit::combine(rows, topk, ty, as_stream(stream)); });
      },
      "y_rows"_a.none(), "topk"_a, "y"_a.none(), nb::kw_only(), "stream"_a = 0,
      "Stage 5: y[t] = Σ_j y_rows[t*k+j] in slot order (no atomics).");

  m.def(
      "combine_partials",
      [](nb::handle y_partials, int64_t topk, nb::handle y, uintptr_t stream) {
        Call c("combine_partials");
        const Tensor parts = c.in("y_partials", y_partials), ty = c.out("y", y);
        launch_on_device(c, [&] { moekit::combine_partials(parts, topk, ty, as_stream(stream)); });
      },
      "y_partials"_a.none(), "topk"_a, "y"_a.none(), nb::kw_only(), "stream"_a = 0,
      "Stage 5 after a split-K down GEMM (plan.down_splits > 1): y[t] = Σ_j Σ_s y_partials[s][t*k+j].");

  m.def(
      "moe_forward",
      [](const ForwardPlan& plan, nb::handle x, nb::handle w_gate, nb::handle router_logits, nb::handle score_bias,
         nb::handle w13, nb::handle w2, nb::handle y, nb::handle workspace, const std::string& scoring,
         bool renormalize, int64_t n_group, int64_t topk_group, double routed_scaling_factor, nb::handle w13_scale,
         nb::handle w2_scale, nb::handle expert_load, nb::handle h, uintptr_t stream) {
        Call c("moe_forward");
        MoeInputs in;
        in.x = c.in("x", x);
        in.router_logits = c.in_opt("router_logits", router_logits);
        in.w_gate = c.in_opt("w_gate", w_gate);
        in.score_bias = c.in_opt("score_bias", score_bias);
        in.w13 = c.in("w13", w13);
        in.w2 = c.in("w2", w2);
        in.w13_scale = c.in_opt("w13_scale", w13_scale);
        in.w2_scale = c.in_opt("w2_scale", w2_scale);
        const Tensor ty = c.out("y", y), load = c.out_opt("expert_load", expert_load), th = c.out_opt("h", h);
        std::optional<ForwardPlan> kept;
        const ForwardPlan& p = plan_with_h("moe_forward", plan, th, kept);
        const Call::WorkspaceArg w = c.workspace(p, workspace);
        const RouterOptions o =
            router_options("moe_forward", scoring, renormalize, n_group, topk_group, routed_scaling_factor);
        launch_on_device(c, [&] { moekit::moe_forward(p, in, o, ty, w.base, w.bytes, as_stream(stream), load, th); });
      },
      "plan"_a, "x"_a.none(), "w_gate"_a.none(), "router_logits"_a.none(), "score_bias"_a.none(), "w13"_a.none(), "w2"_a.none(), "y"_a.none(),
      "workspace"_a.none(), nb::kw_only(), "scoring"_a = "softmax", "renormalize"_a = false, "n_group"_a = 0,
      "topk_group"_a = 0, "routed_scaling_factor"_a = 1.0, "w13_scale"_a.none() = nb::none(),
      "w2_scale"_a.none() = nb::none(), "expert_load"_a.none() = nb::none(), "h"_a.none() = nb::none(),
      "stream"_a = 0,
      "The whole layer: route -> align -> up -> down -> combine into y [T,H] bf16. fp8 plans: w13/w2 e4m3 with "
      "their block scales w13_scale/w2_scale f32 (x is quantized on the device). expert_load [E] int64 (optional): "
      "gains this call's assignments per expert, on the device (never read or cleared by moekit). h "
      "[plan.max_rows,2F] bf16 (optional, bf16 plans: the training forward): the up GEMM also writes g|u, its gate "
      "and up values before SwiGLU, of every sorted row (the workspace's sorted_ids order; padding rows are not "
      "written) for moe_backward(..., h=h) with a plan_backward(..., saved='h'); it shares no memory with another "
      "argument. y is the same with or without h; the plan given is not changed.");

  m.def(
      "experts_forward",
      [](const ForwardPlan& plan, nb::handle x, nb::handle w13, nb::handle w2, nb::handle topk_ids,
         nb::handle topk_weights, nb::handle y, nb::handle workspace, nb::handle w13_scale, nb::handle w2_scale,
         nb::handle expert_load, nb::handle h, uintptr_t stream) {
        Call c("experts_forward");
        const Tensor tx = c.in("x", x), t13 = c.in("w13", w13), t2 = c.in("w2", w2);
        const Tensor s13 = c.in_opt("w13_scale", w13_scale), s2 = c.in_opt("w2_scale", w2_scale);
        const Tensor ids = c.in("topk_ids", topk_ids), wts = c.in("topk_weights", topk_weights);
        const Tensor ty = c.out("y", y), load = c.out_opt("expert_load", expert_load), th = c.out_opt("h", h);
        std::optional<ForwardPlan> kept;
        const ForwardPlan& p = plan_with_h("experts_forward", plan, th, kept);
        const Call::WorkspaceArg w = c.workspace(p, workspace);
        launch_on_device(c, [&] {
          moekit::experts_forward(p, tx, ExpertWeights{t13, t2, s13, s2}, ids, wts, ty, w.base, w.bytes,
                                  as_stream(stream), load, th);
        });
      },
      "plan"_a, "x"_a.none(), "w13"_a.none(), "w2"_a.none(), "topk_ids"_a.none(), "topk_weights"_a.none(), "y"_a.none(), "workspace"_a.none(), nb::kw_only(),
      "w13_scale"_a.none() = nb::none(), "w2_scale"_a.none() = nb::none(), "expert_load"_a.none() = nb::none(),
      "h"_a.none() = nb::none(), "stream"_a = 0,
      "Stages 2-5 with the routing given (topk_ids [T,k] i32, topk_weights [T,k] f32); fp8 plans: the weights' "
      "block scales, and expert_load and h (the training forward's g|u, bf16 plans), as in moe_forward.");

  m.def(
      "check_status",
      [](const ForwardPlan& plan, nb::handle workspace, uintptr_t stream) {
        Call c("check_status");
        const Workspace ws = c.workspace(plan, workspace).ws;
        launch_on_device(c, [&] { moekit::check_status(ws, as_stream(stream)); });
      },
      "plan"_a, "workspace"_a.none(), nb::kw_only(), "stream"_a = 0,
      "Synchronises the stream and raises moekit.Error if a kernel flagged bad input (an expert id outside "
      "[0, E)). Not for hot loops.");

  bind_backward(m);
}
