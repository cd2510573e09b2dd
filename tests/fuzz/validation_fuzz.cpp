// validation_fuzz.cpp — libFuzzer target over moekit's host-side planning and validation: a shape,
// a device description, GEMM configs and split-K drawn from the input go through plan_forward,
// plan_forward_heuristic, plan_forward_with, workspace_bytes and carve_workspace (also of plans
// edited after planning), the stage validators (detail::expect_*, the load counter's too: the
// public stage entries call CUDA right after them), the backward's planner and workspace, and — for
// accepted small shapes —
// the CPU align oracle (ref::align) with ids drawn from the input. The contract: every rejection is
// a moekit::Error naming an argument; nothing crashes or trips ASan/UBSan; accepted plans have
// sane sizes; ref::align's layout keeps its invariants.
//
// Build and run (scripts/fuzz; clang with -fsanitize=fuzzer,address,undefined, cmake/fuzz.cmake):
//   scripts/fuzz                 # 60 s
//   FUZZ_SECONDS=600 scripts/fuzz
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/validate.hpp"
#include "moekit/backward.hpp"
#include "moekit/moe.hpp"
#include "moekit/reference.hpp"

namespace {

using namespace moekit;

// The input, read as a stream of values; past its end every read is 0.
struct Bytes {
  const uint8_t* p;
  size_t n;
  uint64_t u64() {
    uint64_t v = 0;
    const size_t take = n < 8 ? n : 8;
    std::memcpy(&v, p, take);
    p += take, n -= take;
    return v;
  }
  uint8_t u8() { return uint8_t(u64_small(1)); }
  uint64_t u64_small(size_t bytes) {
    uint64_t v = 0;
    const size_t take = n < bytes ? n : bytes;
    std::memcpy(&v, p, take);
    p += take, n -= take;
    return v;
  }
  // A dimension: mostly near the edges that matter (0, 1, multiples of 8/16/128, the limits, 2^k,
  // INT64 extremes), sometimes any 64-bit value.
  int64_t dim() {
    const uint8_t mode = u8();
    const int64_t small = int64_t(u64_small(2));
    switch (mode % 8) {
      case 0: return small % 64;
      case 1: return (small % 512) * 8;
      case 2: return int64_t(1) << (u8() % 63);
      case 3: return (int64_t(1) << (u8() % 63)) - int64_t(u8() % 3);
      case 4: return INT64_MAX - int64_t(u8() % 4);
      case 5: return (u8() & 1) ? INT64_MIN + int64_t(u8() % 3) : -int64_t(u8() % 3) - 1;
      case 6: return kMaxLayoutRows - int64_t(u64_small(2) % 70000);
      default: return int64_t(u64());
    }
  }
};

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "validation_fuzz: %s\n", what);
  std::abort();
}

// Every moekit::Error must name an argument the way detail::fail writes it.
template <class F>
bool accepted(F&& call) {
  try {
    call();
    return true;
  } catch (const Error& e) {
    if (std::strstr(e.what(), "argument '") == nullptr) {
      std::fprintf(stderr, "unnamed rejection: %s\n", e.what());
      bug("a moekit::Error names no argument");
    }
    return false;
  }
}

// Sizes an accepted plan must have: positive, whole blocks, T·k and E·(block_m-1) covered.
void check_plan(const ForwardPlan& p) {
  const MoeShape& s = p.shape;
  if (p.block_m() < 1) bug("accepted plan has block_m < 1");
  if (p.max_rows() < s.tokens * s.topk || p.max_rows() > kMaxLayoutRows || p.max_rows() % p.block_m() != 0)
    bug("accepted plan has a bad max_rows");
  if (p.max_blocks() < 1 && s.tokens * s.topk > 0) bug("accepted plan has no blocks");
}

void fuzz_align_oracle(const ForwardPlan& p, Bytes& in) {
  const MoeShape& s = p.shape;
  const int64_t A = s.tokens * s.topk;
  if (A > 4096) return;  // the oracle is a plain loop: keep each run fast
  std::vector<int32_t> ids(static_cast<size_t>(A));
  for (int32_t& id : ids) {
    const uint8_t b = in.u8();
    id = b == 255 ? -1 : b == 254 ? int32_t(s.experts) : int32_t(b % s.experts);  // some ids out of range
  }
  const ref::Aligned al = ref::align(ids.data(), s.tokens, s.topk, s.experts, p.block_m(), p.max_blocks());
  if (al.num_rows_padded < 0 || al.num_rows_padded > p.max_rows() || al.num_rows_padded % p.block_m() != 0)
    bug("ref::align: num_rows_padded outside [0, max_rows] or not whole blocks");
  if (int64_t(al.block_expert.size()) != p.max_blocks()) bug("ref::align: block_expert is not max_blocks long");
  int64_t counted = 0;
  for (int32_t c : al.expert_counts) counted += c;
  int64_t valid = 0;
  for (int32_t id : ids) valid += id >= 0 && id < s.experts;
  if (counted != valid) bug("ref::align: expert_counts do not count the valid ids");
  if ((valid != A) != (al.status != 0)) bug("ref::align: status does not report the out-of-range ids");
  for (int32_t a : al.sorted_ids)
    if (a < 0 || a > A) bug("ref::align: a sorted id outside [0, T*k]");
}

void fuzz_backward(const ForwardPlan& fwd, const DeviceInfo& dev, Bytes& in) {
  BackwardOptions o;
  const uint8_t b = in.u8();
  o.saved = SavedActivations(b % 3);
  o.router = RouterGrad((b >> 2) % 4);
  o.input_grad = b & 16;
  o.weight_grads = b & 32;
  o.accumulate_weight_grads = b & 64;
  o.weight_grad_dtype = (b & 128) ? DType::f32 : DType(in.u8() % 5);
  BackwardPlan bp;
  if (!accepted([&] { bp = plan_backward(fwd, dev, o); })) return;
  size_t bytes = 0;
  if (!accepted([&] { bytes = backward_workspace_bytes(bp); })) bug("backward_workspace_bytes refused plan_backward's plan");
  accepted([&] { carve_backward_workspace(bp, reinterpret_cast<void*>(uintptr_t(1) << 32), bytes); });
  // Edited after planning: must be refused or sized without overflow.
  BackwardPlan edited = bp;
  edited.shape.tokens = in.dim(), edited.shape.hidden = in.dim();
  edited.dx_splits = int(in.u8()) - 8;
  accepted([&] { backward_workspace_bytes(edited); });
}

// The stage validators the public entries run before any CUDA call.
void fuzz_stage_validators(const ForwardPlan& p, Bytes& in) {
  void* base = reinterpret_cast<void*>(uintptr_t(1) << 32);  // never dereferenced: validation only
  size_t bytes = 0;
  if (!accepted([&] { bytes = workspace_bytes(p); })) bug("workspace_bytes refused an accepted plan");
  Workspace ws;
  if (!accepted([&] { ws = carve_workspace(p, base, bytes); })) bug("carve_workspace refused its own size");
  accepted([&] { detail::expect_workspace(p, ws, "fuzz"); });
  accepted([&] { detail::expect_plan(p, "fuzz"); });
  accepted([&] { detail::expect_plan_sizes(p, "fuzz"); });
  // A tensor with fuzzed dims against a fuzzed expected shape.
  const int64_t d0 = in.dim(), d1 = in.dim();
  const Tensor t(base, DType(in.u8() % 5), {d0, d1});
  accepted([&] { detail::expect_tensor("fuzz", "t", t, t.dtype, {d0, d1}); });
  accepted([&] { detail::expect_optional("fuzz", "t", t, DType::bf16, {in.dim(), d1}); });
  const MoeShape& s = p.shape;
  accepted([&] {
    detail::expect_expert_weights("fuzz", p, "w13", Tensor(base, DType::bf16, {s.experts, 2 * s.inter, s.hidden}),
                                  "w13_scale", Tensor(), 2 * s.inter, s.hidden, w13_scale_rows(s.inter));
  });
  // The load counter: a fuzzed dtype, length and alignment, over the workspace or beside it.
  const Tensor load(static_cast<char*>(base) + (in.u8() % 4) * 4 + (in.u8() & 1) * bytes, DType(in.u8() % 5),
                    {in.dim()});
  accepted([&] {
    detail::expect_expert_load("fuzz", load, s.experts,
                               {detail::span_of("ws.expert_counts", ws.expert_counts),
                                detail::span_of("workspace", base, bytes)});
  });
  accepted([&] { detail::checked_mul("fuzz", "a", "a*b", in.dim(), in.dim()); });
  accepted([&] { detail::checked_add("fuzz", "a", "a+b", in.dim(), in.dim()); });
  // Wrong sizes or pointers are refused by name.
  accepted([&] { carve_workspace(p, base, bytes - (in.u8() & 1)); });
  accepted([&] { carve_workspace(p, static_cast<char*>(base) + (in.u8() & 1) * 16, bytes); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in{data, size};
  MoeShape s;
  s.tokens = in.dim(), s.hidden = in.dim(), s.inter = in.dim(), s.experts = in.dim(), s.topk = in.dim();
  DeviceInfo dev{"NVIDIA H200", int(in.u64_small(2) % 400), int(in.u8() % 12), 0,
                 int64_t(in.u64_small(4)), int64_t(in.u64_small(4))};
  const uint8_t which = in.u8();
  const Precision precision = (which & 1) ? Precision::fp8 : Precision::bf16;

  ForwardPlan plan;
  bool ok = false;
  switch ((which >> 1) % 3) {
    case 0: ok = accepted([&] { plan = plan_forward(s, dev, precision); }); break;
    case 1: ok = accepted([&] { plan = plan_forward_heuristic(s, dev, precision); }); break;
    default: {
      const auto& configs = compiled_gemm_configs(precision);
      const GemmConfig& up = configs[in.u8() % configs.size()];
      const GemmConfig& down = configs[in.u8() % configs.size()];
      ok = accepted([&] { plan = plan_forward_with(s, up, down, int(in.u8() % 12) - 1); });
    }
  }
  if (!ok) return 0;
  check_plan(plan);
  fuzz_stage_validators(plan, in);
  fuzz_align_oracle(plan, in);
  fuzz_backward(plan, DeviceInfo{"NVIDIA H200", 132, 9, 0, 232448, 60 << 20}, in);

  // The accepted plan edited after planning (the H = F = 2^60 case): refused or sized.
  ForwardPlan edited = plan;
  switch (in.u8() % 5) {
    case 0: edited.shape.tokens = in.dim(); break;
    case 1: edited.shape.hidden = edited.shape.inter = in.dim(); break;
    case 2: edited.shape.experts = in.dim(); break;
    case 3: edited.down_splits = int(in.u64_small(4)); break;
    default: edited.up.block_m = edited.down.block_m = int(in.u64_small(4));
  }
  size_t bytes = 0;
  if (accepted([&] { bytes = workspace_bytes(edited); })) {
    if (bytes == 0) bug("workspace_bytes of an accepted plan is 0");
    accepted([&] { carve_workspace(edited, reinterpret_cast<void*>(uintptr_t(1) << 32), bytes); });
  }
  return 0;
}
