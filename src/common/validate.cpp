// validate.cpp — the argument checks every public entry runs before it touches the GPU.
#include "common/validate.hpp"

#include <cstdint>
#include <limits>

#include "tuning/planner.hpp"

namespace moekit::detail {

void fail(const char* entry, const char* arg, const std::string& what) {
  throw Error(std::string("moekit::") + entry + ": argument '" + arg + "': " + what);
}

int64_t checked_mul(const char* entry, const char* arg, const char* what, int64_t a, int64_t b) {
  int64_t p = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &p))
    fail(entry, arg, std::string(what) + " = " + std::to_string(a) + " * " + std::to_string(b) +
                         " does not fit a 64-bit size (at most 2^63 - 1)");
  return p;
}

int64_t checked_add(const char* entry, const char* arg, const char* what, int64_t a, int64_t b) {
  int64_t p = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &p))
    fail(entry, arg, std::string(what) + " = " + std::to_string(a) + " + " + std::to_string(b) +
                         " does not fit a 64-bit size (at most 2^63 - 1)");
  return p;
}

int64_t checked_bytes(const char* entry, const char* arg, const Tensor& t) {
  if (t.rank < 0 || t.rank > Tensor::kMaxRank)
    fail(entry, arg, "rank must be in [0, " + std::to_string(Tensor::kMaxRank) + "], got " + std::to_string(t.rank));
  int64_t n = t.rank == 0 ? 0 : 1;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] < 0) fail(entry, arg, "dimensions must be >= 0, got " + t.shape_str());
    if (__builtin_mul_overflow(n, t.shape[i], &n))
      fail(entry, arg, "shape " + t.shape_str() + " has more elements than a 64-bit size holds (2^63 - 1)");
  }
  if (__builtin_mul_overflow(n, dtype_bytes(t.dtype), &n))
    fail(entry, arg, "shape " + t.shape_str() + " of " + dtype_name(t.dtype) +
                         " has more bytes than a 64-bit size holds (2^63 - 1)");
  return n;
}

static std::string shape_of(std::initializer_list<int64_t> shape) {
  std::string s = "[";
  int i = 0;
  for (int64_t d : shape) s += (i++ ? ", " : "") + std::to_string(d);
  return s + "]";
}

void expect_tensor(const char* entry, const char* arg, const Tensor& t, DType dtype,
                   std::initializer_list<int64_t> shape) {
  if (!t.given()) fail(entry, arg, "is required but was not given");
  if (t.dtype != dtype)
    fail(entry, arg, std::string("expected dtype ") + dtype_name(dtype) + ", got " + dtype_name(t.dtype));
  bool same = t.rank == int(shape.size());
  int i = 0;
  for (int64_t d : shape) same = same && t.shape[i++] == d;
  if (!same) fail(entry, arg, "expected shape " + shape_of(shape) + ", got " + t.shape_str());
  if (checked_bytes(entry, arg, t) > 0 && t.data == nullptr) fail(entry, arg, "data pointer is null");
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    fail(entry, arg, "data pointer must be 16-byte aligned");
}

bool expect_optional(const char* entry, const char* arg, const Tensor& t, DType dtype,
                     std::initializer_list<int64_t> shape) {
  if (!t.given()) return false;
  expect_tensor(entry, arg, t, dtype, shape);
  return true;
}

void expect_shape(const MoeShape& s, const char* entry) {
  // Each value is bounded before any product of them is formed, so none of the products below (or
  // the workspace's, or the stages') can wrap.
  if (s.tokens < 0 || s.tokens > kMaxLayoutRows)
    fail(entry, "shape.tokens", "must be in [0, " + std::to_string(kMaxLayoutRows) +
                                    "] (T·k indexes 32-bit sorted_ids), got " + std::to_string(s.tokens));
  if (s.hidden <= 0 || s.hidden % 8 != 0 || s.hidden > kMaxHidden)
    fail(entry, "shape.hidden", "must be a positive multiple of 8 (16-byte rows) and at most " +
                                    std::to_string(kMaxHidden) + " (2^20, moekit's bound), got " + std::to_string(s.hidden));
  if (s.inter <= 0 || s.inter % 8 != 0 || s.inter > kMaxInter)
    fail(entry, "shape.inter", "must be a positive multiple of 8 (16-byte rows) and at most " +
                                   std::to_string(kMaxInter) + " (2^20, moekit's bound), got " + std::to_string(s.inter));
  if (s.experts <= 0 || s.experts > kMaxExperts)
    fail(entry, "shape.experts", "must be in [1, " + std::to_string(kMaxExperts) + "], got " + std::to_string(s.experts));
  if (s.topk <= 0 || s.topk > kMaxTopk)
    fail(entry, "shape.topk", "must be in [1, " + std::to_string(kMaxTopk) + "], got " + std::to_string(s.topk));
  if (s.topk > s.experts)
    fail(entry, "shape.topk", "k = " + std::to_string(s.topk) + " exceeds the number of experts " + std::to_string(s.experts));
  // sorted_ids are int32 and hold the sentinel T·k: the worst-case layout of the largest block_m,
  // T·k + E·(block_m − 1) rounded up to whole blocks, must stay within kMaxLayoutRows.
  const int64_t tk = checked_mul(entry, "shape.tokens", "T·k", s.tokens, s.topk);  // < 2^35: bounded above
  const int64_t rows = worst_case_rows(s, tuning::kLargestBlockM);
  if (rows > kMaxLayoutRows) {
    const int64_t bm = tuning::kLargestBlockM;
    const int64_t max_tk = kMaxLayoutRows / bm * bm - s.experts * (bm - 1);
    fail(entry, "shape.tokens",
         "T·k = " + std::to_string(tk) + " assignments need a worst-case layout of " + std::to_string(rows) +
             " rows (T·k + E·(" + std::to_string(bm) + " − 1), whole " + std::to_string(bm) +
             "-row blocks), above the 32-bit sorted_ids' limit of " + std::to_string(kMaxLayoutRows) +
             " rows: at most T = " + std::to_string(max_tk / s.topk) + " tokens for E = " + std::to_string(s.experts) +
             ", k = " + std::to_string(s.topk));
  }
}

void expect_shape_precision(const MoeShape& s, Precision precision, const char* entry) {
  if (precision != Precision::fp8) return;
  if (s.hidden % 16 != 0)
    fail(entry, "shape.hidden", "must be a multiple of 16 for fp8 (16-byte rows of e4m3), got " + std::to_string(s.hidden));
  if (s.inter % 16 != 0)
    fail(entry, "shape.inter", "must be a multiple of 16 for fp8 (16-byte rows of e4m3), got " + std::to_string(s.inter));
}

void expect_plan(const ForwardPlan& plan, const char* entry) {
  expect_shape(plan.shape, entry);
  if (plan.up.precision != plan.down.precision)
    fail(entry, "plan", "its up and down configs disagree on precision: make plans with plan_forward");
  expect_shape_precision(plan.shape, plan.precision(), entry);
  const MoeShape& s = plan.shape;
  if (plan.down_splits < 1 || plan.down_splits > kMaxDownSplits)
    fail(entry, "plan", "down_splits " + std::to_string(plan.down_splits) + " is outside [1, " + std::to_string(kMaxDownSplits) + "]");
  if (plan.up.block_m <= 0 || plan.up.block_m != plan.down.block_m)
    fail(entry, "plan", "its up and down configs disagree on block_m (" + std::to_string(plan.up.block_m) + ", " +
                            std::to_string(plan.down.block_m) + "): make plans with plan_forward");
  if (!tuning::align_kernel_fits(plan.align, s.tokens * s.topk))
    fail(entry, "plan", "align kernel '" + tuning::to_string(plan.align) + "' cannot take T*k = " +
                            std::to_string(s.tokens * s.topk) + " assignments: the shape changed after plan_forward; plan again");
  if (plan.save_h && plan.precision() != Precision::bf16)
    fail(entry, "plan", "save_h keeps h for the bf16 backward: an fp8 plan has none (set save_h only on bf16 plans)");
  if (!tuning::select_kernel_fits(plan.router.select, s.experts))
    fail(entry, "plan", "selection kernel '" + tuning::to_string(plan.router.select) + "' cannot take " +
                            std::to_string(s.experts) + " experts: the shape changed after plan_forward; plan again");
}

void expect_plan_sizes(const ForwardPlan& plan, const char* entry) {
  expect_shape(plan.shape, entry);
  if (plan.up.block_m < 1 || plan.down.block_m < 1)
    fail(entry, "plan", "block_m must be >= 1, got up " + std::to_string(plan.up.block_m) + ", down " +
                            std::to_string(plan.down.block_m) + ": make plans with plan_forward");
  if (plan.down_splits < 1)
    fail(entry, "plan", "down_splits must be >= 1, got " + std::to_string(plan.down_splits) + ": make plans with plan_forward");
}

void expect_hopper(const DeviceInfo& device, const char* entry) {
  if (device.cc_major != 9)
    fail(entry, "device", "moekit's kernels are built for sm_90a (Hopper); got compute capability " +
                              std::to_string(device.cc_major) + "." + std::to_string(device.cc_minor));
}

void expect_expert_weights(const char* entry, const ForwardPlan& plan, const char* w_arg, const Tensor& w,
                           const char* scale_arg, const Tensor& scale, int64_t rows, int64_t cols, int64_t scale_rows) {
  const MoeShape& s = plan.shape;
  if (plan.precision() != Precision::fp8) {
    expect_tensor(entry, w_arg, w, DType::bf16, {s.experts, rows, cols});
    if (scale.given()) fail(entry, scale_arg, "a bf16 plan takes no weight scales (plan_forward(..., Precision::fp8) for fp8)");
    return;
  }
  expect_tensor(entry, w_arg, w, DType::e4m3, {s.experts, rows, cols});
  if (!scale.given()) fail(entry, scale_arg, "an fp8 plan needs the weights' block scales");
  expect_tensor(entry, scale_arg, scale, DType::f32, {s.experts, scale_rows, fp8_blocks(cols)});
}

void expect_workspace(const ForwardPlan& plan, const Workspace& ws, const char* entry) {
  const MoeShape& s = plan.shape;
  expect_tensor(entry, "ws.sorted_ids", ws.sorted_ids, DType::i32, {plan.max_rows()});
  expect_tensor(entry, "ws.block_expert", ws.block_expert, DType::i32, {plan.max_blocks()});
  expect_tensor(entry, "ws.num_rows_padded", ws.num_rows_padded, DType::i32, {1});
  expect_tensor(entry, "ws.expert_counts", ws.expert_counts, DType::i32, {s.experts});
  const bool fp8 = plan.precision() == Precision::fp8;
  expect_tensor(entry, "ws.act", ws.act, fp8 ? DType::e4m3 : DType::bf16, {plan.max_rows(), s.inter});
  if (fp8) {
    expect_tensor(entry, "ws.act_scale", ws.act_scale, DType::f32, {plan.max_rows(), fp8_blocks(s.inter)});
    expect_tensor(entry, "ws.x_q", ws.x_q, DType::e4m3, {s.tokens, s.hidden});
    expect_tensor(entry, "ws.x_scale", ws.x_scale, DType::f32, {s.tokens, fp8_blocks(s.hidden)});
  }
  expect_tensor(entry, "ws.y_rows", ws.y_rows, DType::bf16, {s.tokens * s.topk, s.hidden});
  if (plan.down_splits > 1)
    expect_tensor(entry, "ws.y_partials", ws.y_partials, DType::f32, {plan.down_splits, s.tokens * s.topk, s.hidden});
  expect_tensor(entry, "ws.status", ws.status, DType::i32, {1});
  expect_tensor(entry, "ws.gemm_counter", ws.gemm_counter, DType::i32, {1});
  if (plan.align == AlignKernel::grid)
    expect_tensor(entry, "ws.align_scratch", ws.align_scratch, DType::i32, {int64_t(kAlignMaxCtas), s.experts + 1});
}

Span span_of(const char* name, const Tensor& t) {
  if (!t.given() || t.data == nullptr || t.numel() <= 0) return {name, 0, 0};
  return span_of(name, t.data, size_t(t.bytes()));
}

Span span_of(const char* name, const void* base, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(base);
  return base == nullptr ? Span{name, 0, 0} : Span{name, begin, begin + uintptr_t(bytes)};
}

bool overlap(const Span& a, const Span& b) {
  return a.begin < a.end && b.begin < b.end && a.begin < b.end && b.begin < a.end;
}

bool expect_expert_load(const char* entry, const Tensor& expert_load, int64_t experts,
                        const std::vector<Span>& others) {
  constexpr const char* arg = "expert_load";
  if (!expert_load.given()) return false;
  if (expert_load.dtype != DType::i64)
    fail(entry, arg, std::string("expected dtype i64 (64-bit counts), got ") + dtype_name(expert_load.dtype));
  if (expert_load.rank != 1 || expert_load.shape[0] != experts)
    fail(entry, arg, "expected shape [" + std::to_string(experts) + "] (one count per expert), got " +
                         expert_load.shape_str());
  if (expert_load.data == nullptr) fail(entry, arg, "data pointer is null");
  if (reinterpret_cast<uintptr_t>(expert_load.data) % 8 != 0)
    fail(entry, arg, "data pointer must be 8-byte aligned (64-bit counts)");
  const Span mine = span_of(arg, expert_load);
  for (const Span& other : others)
    if (overlap(mine, other))
      fail(entry, arg, std::string("overlaps '") + other.name +
                           "' in memory: the counter is added to while the layer uses it; give it a buffer of its own");
  return true;
}

void expect_saved_h(const char* entry, const ForwardPlan& plan, const Tensor& h, const std::vector<Span>& others) {
  if (!plan.save_h) {
    if (h.given()) fail(entry, "h", "given, but plan.save_h is false: set it to keep h for the backward, or pass no h");
    return;
  }
  expect_tensor(entry, "h", h, DType::bf16, {plan.max_rows(), 2 * plan.shape.inter});
  const Span mine = span_of("h", h);
  for (const Span& other : others)
    if (overlap(mine, other))
      fail(entry, "h", std::string("overlaps '") + other.name + "' in memory: give h a buffer of its own");
}

}  // namespace moekit::detail
