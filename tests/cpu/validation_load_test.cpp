// validation_load_test.cpp — the opt-in load counter (expert_load [E] i64; moe.hpp, "Load
// statistics") at the public boundary: align, experts_forward and moe_forward refuse a wrong dtype,
// shape, null or misaligned pointer, or a counter laid over one of the call's buffers, each time
// naming 'expert_load', before anything is launched; and the i64 dtype and the span checks the
// validator is built from.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/validate.hpp"
#include "cpu_test_util.hpp"

namespace moekit::testing {
namespace {

constexpr int64_t kT = FakeLayerArgs::kT, kE = FakeLayerArgs::kE, kK = FakeLayerArgs::kK;

// Every argument of the three entries on fake pointers (FakeLayerArgs), and a valid counter of
// its own.
struct Call : FakeLayerArgs {
  Tensor expert_load{fake_ptr(12), DType::i64, {kE}};

  void align_call() const {
    align(plan, topk_ids, carve_workspace(plan, workspace, bytes), nullptr, expert_load);
  }
  void experts() const {
    experts_forward(plan, in.x, in.w13, in.w2, topk_ids, topk_weights, y, workspace, bytes, nullptr, expert_load);
  }
  void moe() const { moe_forward(plan, in, RouterOptions{}, y, workspace, bytes, nullptr, expert_load); }
};

enum class Entry { align, experts_forward, moe_forward };
const char* name(Entry e) {
  switch (e) {
    case Entry::align: return "align";
    case Entry::experts_forward: return "experts_forward";
    case Entry::moe_forward: return "moe_forward";
  }
  return "?";
}

template <class Mutate>
BadCall bad(Entry entry, std::string what, Mutate mutate) {
  Call c;
  mutate(c);
  auto run = [entry, c] {
    switch (entry) {
      case Entry::align: c.align_call(); break;
      case Entry::experts_forward: c.experts(); break;
      case Entry::moe_forward: c.moe(); break;
    }
  };
  return {std::string(name(entry)) + ": " + what, run, "expert_load"};
}

// The checks every entry runs on the counter itself.
std::vector<BadCall> bad_counters(Entry e) {
  return {
      bad(e, "i32 counts", [](Call& c) { c.expert_load.dtype = DType::i32; }),
      bad(e, "f32 counts", [](Call& c) { c.expert_load.dtype = DType::f32; }),
      bad(e, "[E + 1]", [](Call& c) { c.expert_load = with_shape(c.expert_load, {kE + 1}); }),
      bad(e, "[E - 1]", [](Call& c) { c.expert_load = with_shape(c.expert_load, {kE - 1}); }),
      bad(e, "[1, E]", [](Call& c) { c.expert_load = with_shape(c.expert_load, {1, kE}); }),
      bad(e, "rank 0 with a pointer", [](Call& c) { c.expert_load = Tensor(fake_ptr(12), DType::i64, {}); }),
      bad(e, "null", [](Call& c) { c.expert_load = with_null_data(c.expert_load); }),
      bad(e, "4-byte aligned", [](Call& c) { c.expert_load.data = static_cast<char*>(c.expert_load.data) + 4; }),
  };
}

TEST(ExpertLoadValidation, AlignNamesTheCounter) {
  expect_all_rejected(bad_counters(Entry::align));
  const Entry e = Entry::align;
  expect_all_rejected({
      bad(e, "over topk_ids", [](Call& c) { c.expert_load.data = c.topk_ids.data; }),
      bad(e, "over ws.expert_counts",
          [](Call& c) { c.expert_load.data = carve_workspace(c.plan, c.workspace, c.bytes).expert_counts.data; }),
      bad(e, "over ws.sorted_ids",
          [](Call& c) { c.expert_load.data = carve_workspace(c.plan, c.workspace, c.bytes).sorted_ids.data; }),
  });
}

TEST(ExpertLoadValidation, ExpertsForwardNamesTheCounter) {
  expect_all_rejected(bad_counters(Entry::experts_forward));
  const Entry e = Entry::experts_forward;
  expect_all_rejected({
      bad(e, "over y", [](Call& c) { c.expert_load.data = c.y.data; }),
      bad(e, "inside the workspace", [](Call& c) { c.expert_load.data = static_cast<char*>(c.workspace) + 256; }),
      bad(e, "over the last bytes of w2",
          [](Call& c) { c.expert_load.data = static_cast<char*>(c.in.w2.data) + c.in.w2.bytes() - 8; }),
      bad(e, "over topk_weights", [](Call& c) { c.expert_load.data = c.topk_weights.data; }),
  });
}

TEST(ExpertLoadValidation, MoeForwardNamesTheCounter) {
  expect_all_rejected(bad_counters(Entry::moe_forward));
  const Entry e = Entry::moe_forward;
  expect_all_rejected({
      bad(e, "over x", [](Call& c) { c.expert_load.data = c.in.x.data; }),
      bad(e, "over w_gate", [](Call& c) { c.expert_load.data = c.in.w_gate.data; }),
      bad(e, "over score_bias", [](Call& c) { c.expert_load.data = c.in.score_bias.data; }),
      bad(e, "over the workspace", [](Call& c) { c.expert_load.data = c.workspace; }),
  });
}

// A bad layer argument is still reported by its own name when a valid counter is given (the
// counter is checked after them), and an absent counter is simply not taken.
TEST(ExpertLoadValidation, OtherArgumentsKeepTheirNames) {
  Call c;
  c.y.dtype = DType::f32;
  EXPECT_TRUE(throws_naming([&] { c.moe(); }, "y"));
  Call d;
  d.topk_ids = with_shape(d.topk_ids, {kT, kK + 1});
  EXPECT_TRUE(throws_naming([&] { d.experts(); }, "topk_ids"));
  EXPECT_FALSE(detail::expect_expert_load("moe_forward", Tensor{}, kE, {}));
}

// What the validator is built from: the i64 dtype, spans, and the 8-byte (not 16) alignment rule.
TEST(ExpertLoadValidation, DtypeSpansAndAlignment) {
  EXPECT_STREQ(dtype_name(DType::i64), "i64");
  EXPECT_EQ(dtype_bytes(DType::i64), 8);
  EXPECT_EQ(Tensor(fake_ptr(1), DType::i64, {kE}).bytes(), kE * 8);
  using detail::overlap;
  using detail::span_of;
  const Tensor a(fake_ptr(1), DType::i64, {kE});  // [p, p + 128)
  const char* p = static_cast<const char*>(fake_ptr(1));
  EXPECT_TRUE(overlap(span_of("a", a), span_of("b", p + 127, 1)));
  EXPECT_FALSE(overlap(span_of("a", a), span_of("b", p + 128, 1)));  // adjacent is fine
  EXPECT_FALSE(overlap(span_of("a", a), span_of("b", Tensor{})));    // an absent tensor overlaps nothing
  EXPECT_FALSE(overlap(span_of("a", a), span_of("b", p + 8, 0)));    // nor an empty range inside
  EXPECT_FALSE(overlap(span_of("a", a), span_of("b", nullptr, 64)));
  // 8-byte aligned but not 16: accepted (its elements are added one by one).
  const Tensor eight(static_cast<char*>(fake_ptr(12)) + 8, DType::i64, {kE});
  EXPECT_TRUE(detail::expect_expert_load("align", eight, kE, {span_of("x", a)}));
}

}  // namespace
}  // namespace moekit::testing
