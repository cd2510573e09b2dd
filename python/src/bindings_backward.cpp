// bindings_backward.cpp — the backward's host API (include/moekit/backward.hpp) in moekit._moekit:
// the BackwardPlan class, plan_backward, backward_workspace_bytes and moe_backward, on DLPack arrays
// and an explicit stream, as bindings.cpp binds the forward (boundary.hpp converts the arrays and
// names the argument; the C++ entry then checks every shape, dtype and alias against the plan).
// The options go by name: saved 'recompute' | 'h', router 'none' | 'logits' | 'gate',
// weight_grad_dtype 'bf16' | 'f32'. moekit.torch's training ops (moekit/_train.py) call these.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "arguments.hpp"
#include "boundary.hpp"
#include "moekit/backward.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace moekit::py {
namespace {

SavedActivations parse_saved(const char* fn, const std::string& s) {
  if (s == "recompute") return SavedActivations::recompute;
  if (s == "h") return SavedActivations::h;
  fail(fn, "saved", "expected 'recompute' or 'h', got '" + s + "'");
}

RouterGrad parse_router_grad(const char* fn, const std::string& s) {
  if (s == "none") return RouterGrad::none;
  if (s == "logits") return RouterGrad::logits;
  if (s == "gate") return RouterGrad::gate;
  fail(fn, "router", "expected 'none', 'logits' or 'gate', got '" + s + "'");
}

DType parse_grad_dtype(const char* fn, const std::string& s) {
  if (s == "bf16") return DType::bf16;
  if (s == "f32") return DType::f32;
  fail(fn, "weight_grad_dtype", "expected 'bf16' or 'f32', got '" + s + "'");
}

BackwardPlan plan_backward_py(const ForwardPlan& forward, nb::handle device, const std::string& saved,
                              const std::string& router, bool input_grad, bool weight_grads,
                              const std::string& weight_grad_dtype, bool accumulate_weight_grads) {
  constexpr const char* kFn = "plan_backward";
  BackwardOptions o;
  o.saved = parse_saved(kFn, saved);
  o.router = parse_router_grad(kFn, router);
  o.input_grad = input_grad;
  o.weight_grads = weight_grads;
  o.weight_grad_dtype = parse_grad_dtype(kFn, weight_grad_dtype);
  o.accumulate_weight_grads = accumulate_weight_grads;
  return plan_backward(forward, device_arg(kFn, device), o);
}

// The smallest and largest block_m of the compiled bf16 configs: the bounds of every aligned
// layout a bf16 plan of a shape can lay out (moekit/_train.py sizes the kept layout by them).
int compiled_block_m(bool largest) {
  const auto& configs = compiled_gemm_configs(Precision::bf16);
  const auto by_block_m = [](const GemmConfig& a, const GemmConfig& b) { return a.block_m < b.block_m; };
  return (largest ? *std::max_element(configs.begin(), configs.end(), by_block_m)
                  : *std::min_element(configs.begin(), configs.end(), by_block_m))
      .block_m;
}

}  // namespace

void bind_backward(nb::module_& m) {
  m.attr("MIN_BLOCK_M") = compiled_block_m(false);
  m.attr("MAX_BLOCK_M") = compiled_block_m(true);

  nb::class_<BackwardPlan>(m, "BackwardPlan",
                           "The plan of one backward pass, made from the forward's (plan_backward): every kernel "
                           "choice and the workspace size.")
      .def_prop_ro("tokens", [](const BackwardPlan& p) { return p.shape.tokens; })
      .def_prop_ro("hidden", [](const BackwardPlan& p) { return p.shape.hidden; })
      .def_prop_ro("inter", [](const BackwardPlan& p) { return p.shape.inter; })
      .def_prop_ro("experts", [](const BackwardPlan& p) { return p.shape.experts; })
      .def_prop_ro("topk", [](const BackwardPlan& p) { return p.shape.topk; })
      .def_ro("block_m", &BackwardPlan::block_m, "rows per block of the forward's aligned layout, which it replays")
      .def_prop_ro("saved", [](const BackwardPlan& p) { return std::string(saved_activations_name(p.options.saved)); },
                   "'recompute' (h = x·W13ᵀ again) or 'h' (the forward kept h)")
      .def_prop_ro("router", [](const BackwardPlan& p) { return std::string(router_grad_name(p.options.router)); },
                   "'none', 'logits' or 'gate': the router gradient it computes")
      .def_prop_ro("input_grad", [](const BackwardPlan& p) { return p.options.input_grad; })
      .def_prop_ro("weight_grads", [](const BackwardPlan& p) { return p.options.weight_grads; })
      .def_prop_ro("weight_grad_dtype",
                   [](const BackwardPlan& p) { return std::string(dtype_name(p.options.weight_grad_dtype)); })
      .def_prop_ro("accumulate_weight_grads", [](const BackwardPlan& p) { return p.options.accumulate_weight_grads; })
      .def_prop_ro("max_rows", &BackwardPlan::max_rows)
      .def_prop_ro("max_blocks", &BackwardPlan::max_blocks)
      .def_ro("dx_splits", &BackwardPlan::dx_splits)
      .def_ro("dw_splits", &BackwardPlan::dw_splits)
      .def_ro("gate_splits", &BackwardPlan::gate_splits)
      .def_ro("tile_rows", &BackwardPlan::tile_rows)
      .def_ro("h_wgmma", &BackwardPlan::h_wgmma)
      .def_ro("d_wgmma", &BackwardPlan::d_wgmma)
      .def_ro("dx_wgmma", &BackwardPlan::dx_wgmma)
      .def_ro("dw_wgmma", &BackwardPlan::dw_wgmma)
      .def_prop_ro("up", [](const BackwardPlan& p) { return p.up.str(); })
      .def_prop_ro("d", [](const BackwardPlan& p) { return p.d.str(); })
      .def_prop_ro("dx", [](const BackwardPlan& p) { return p.dx.str(); })
      .def_ro("source", &BackwardPlan::source)
      .def_prop_ro("workspace_bytes", [](const BackwardPlan& p) { return backward_workspace_bytes(p); })
      .def("str", &BackwardPlan::str)
      .def("__str__", &BackwardPlan::str)
      .def("__repr__", [](const BackwardPlan& p) { return "moekit.BackwardPlan(" + p.str() + ")"; });

  m.def("plan_backward", &plan_backward_py, "forward"_a, nb::kw_only(), "device"_a = nb::none(),
        "saved"_a = "recompute", "router"_a = "none", "input_grad"_a = true, "weight_grads"_a = true,
        "weight_grad_dtype"_a = "bf16", "accumulate_weight_grads"_a = false,
        "The backward of a forward planned as `forward` (a bf16 moekit.Plan; the backward replays its layout). "
        "device: None (the current GPU), a device index, or a moekit.DeviceInfo (plans without a GPU). saved: "
        "'recompute' or 'h'; router: 'none' (the routing was given: d_topk_weights), 'logits' (d_router_logits) "
        "or 'gate' (d_w_gate, and dx gains the router's part); input_grad: dx; weight_grads: dw13 and dw2, of "
        "weight_grad_dtype 'bf16' or 'f32' (accumulate_weight_grads: += into f32 ones).");

  m.def("backward_workspace_bytes", [](const BackwardPlan& plan) { return backward_workspace_bytes(plan); }, "plan"_a,
        "Bytes of the backward's workspace (plan.workspace_bytes).");

  m.def(
      "moe_backward",
      [](const BackwardPlan& plan, nb::handle x, nb::handle w13, nb::handle w2, nb::handle topk_ids,
         nb::handle topk_weights, nb::handle sorted_ids, nb::handle block_expert, nb::handle num_rows_padded,
         nb::handle expert_counts, nb::handle dy, nb::handle workspace, nb::handle w_gate, nb::handle router_logits,
         nb::handle h, nb::handle d_logits_aux, nb::handle dx, nb::handle dw13, nb::handle dw2,
         nb::handle d_topk_weights, nb::handle d_router_logits, nb::handle d_w_gate, const std::string& scoring,
         bool renormalize, int64_t n_group, int64_t topk_group, double routed_scaling_factor, uintptr_t stream) {
        Call c("moe_backward");
        BackwardInputs in;
        in.x = c.in("x", x);
        in.w13 = c.in("w13", w13);
        in.w2 = c.in("w2", w2);
        in.w_gate = c.in_opt("w_gate", w_gate);
        in.router_logits = c.in_opt("router_logits", router_logits);
        in.topk_ids = c.in("topk_ids", topk_ids);
        in.topk_weights = c.in("topk_weights", topk_weights);
        in.sorted_ids = c.in("sorted_ids", sorted_ids);
        in.block_expert = c.in("block_expert", block_expert);
        in.num_rows_padded = c.in("num_rows_padded", num_rows_padded);
        in.expert_counts = c.in("expert_counts", expert_counts);
        in.h = c.in_opt("h", h);
        in.dy = c.in("dy", dy);
        in.d_logits_aux = c.in_opt("d_logits_aux", d_logits_aux);
        BackwardGrads g;
        g.dx = c.out_opt("dx", dx);
        g.dw13 = c.out_opt("dw13", dw13);
        g.dw2 = c.out_opt("dw2", dw2);
        g.d_topk_weights = c.out_opt("d_topk_weights", d_topk_weights);
        g.d_router_logits = c.out_opt("d_router_logits", d_router_logits);
        g.d_w_gate = c.out_opt("d_w_gate", d_w_gate);
        const Call::Buffer ws = c.buffer("workspace", workspace, backward_workspace_bytes(plan));
        const RouterOptions o =
            router_options("moe_backward", scoring, renormalize, n_group, topk_group, routed_scaling_factor);
        launch_on_device(c, [&] { moekit::moe_backward(plan, in, o, g, ws.base, ws.bytes, as_stream(stream)); });
      },
      "plan"_a, "x"_a.none(), "w13"_a.none(), "w2"_a.none(), "topk_ids"_a.none(), "topk_weights"_a.none(),
      "sorted_ids"_a.none(), "block_expert"_a.none(), "num_rows_padded"_a.none(), "expert_counts"_a.none(),
      "dy"_a.none(), "workspace"_a.none(), nb::kw_only(), "w_gate"_a.none() = nb::none(),
      "router_logits"_a.none() = nb::none(), "h"_a.none() = nb::none(), "d_logits_aux"_a.none() = nb::none(),
      "dx"_a.none() = nb::none(), "dw13"_a.none() = nb::none(), "dw2"_a.none() = nb::none(),
      "d_topk_weights"_a.none() = nb::none(), "d_router_logits"_a.none() = nb::none(),
      "d_w_gate"_a.none() = nb::none(), "scoring"_a = "softmax", "renormalize"_a = false, "n_group"_a = 0,
      "topk_group"_a = 0, "routed_scaling_factor"_a = 1.0, "stream"_a = 0,
      "The backward of the layer the forward ran: x [T,H] bf16, w13 [E,2F,H], w2 [E,H,F] bf16, the forward's "
      "routing (topk_ids [T,k] i32, topk_weights [T,k] f32) and aligned layout (its workspace's sorted_ids "
      "[max_rows], block_expert [max_blocks], num_rows_padded [1], expert_counts [E] i32: views, or copies), dy "
      "[T,H] bf16 and a workspace of plan.workspace_bytes (not the forward's). router 'gate': w_gate [E,H] and "
      "the forward's router_logits [T,E] f32 (+ d_logits_aux [T,E] f32, optional); 'logits': router_logits. "
      "Writes what the plan computes and refuses the rest: dx [T,H] bf16 (input_grad), dw13, dw2 "
      "(weight_grads), d_topk_weights [T,k] f32 (required with router 'none'), d_router_logits [T,E] f32 "
      "('logits'), d_w_gate [E,H] of w_gate's dtype ('gate'). The router options are the forward's. "
      "Deterministic, no allocation or sync: CUDA-graph capturable.");
}

}  // namespace moekit::py
