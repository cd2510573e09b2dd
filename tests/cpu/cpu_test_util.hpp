// cpu_test_util.hpp — helpers shared by the CPU tests (tests/cpu/*.cpp): per-test random seeds,
// fake device pointers for validation tests, "throws moekit::Error naming X", ulp distances.
//
// Build and run: cmake --build build --target moekit_cpu_tests && ./build/tests/moekit_cpu_tests
// These tests never need a GPU: public entries are only called with arguments that fail
// validation, which throws before anything touches the device.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "../errors.hpp"
#include "moekit/moe.hpp"

namespace moekit::testing {

// ---- seeds ----------------------------------------------------------------------------------
// Every run draws fresh inputs: one base seed per process (MOEKIT_TEST_SEED fixes it), mixed
// with the test's name so tests draw different streams. A failing test prints the base seed.
inline uint64_t base_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("MOEKIT_TEST_SEED")) return uint64_t(std::strtoull(s, nullptr, 0));
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
  }();
  return seed;
}

class Seeded : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string name = std::string(info->test_suite_name()) + "." + info->name();
    rng.seed(base_seed() ^ std::hash<std::string>{}(name));
  }
  void TearDown() override {
    if (HasFailure())
      std::fprintf(stderr, "  (random inputs: rerun with MOEKIT_TEST_SEED=%llu)\n",
                   static_cast<unsigned long long>(base_seed()));
  }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }
  int64_t uniform_int(int64_t lo, int64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  }
  std::mt19937_64 rng;
};

// An H200 as query_device() would describe it (the config chooser's input); no GPU is read.
inline const DeviceInfo kH200{"H200", 132, 9, 0, 232448, 60 * 1024 * 1024};
// An H100 SXM as query_device() reads it (no table in configs/ names it).
inline const DeviceInfo kH100{"H100", 132, 9, 0, 232448, 50 * 1024 * 1024};

// The benchmark's model layers (docs/design.md), for the planner's tests.
struct Preset {
  const char* name;
  int64_t H, F, E, k;
};
inline constexpr Preset kPresets[] = {{"mixtral-8x7b", 4096, 14336, 8, 2},
                                      {"qwen3-30b-a3b", 2048, 768, 128, 8},
                                      {"deepseek-v3", 7168, 2048, 256, 8}};
inline MoeShape shape_of(const Preset& p, int64_t T) { return MoeShape{T, p.H, p.F, p.E, p.k}; }

// ---- fake device pointers -------------------------------------------------------------------
// Distinct, 256-byte aligned, non-null, never dereferenced: validation throws first.
inline void* fake_ptr(int slot) {
  return reinterpret_cast<void*>(uintptr_t(0x10000000) + uintptr_t(slot) * uintptr_t(0x1000000));
}
inline Tensor with_dtype(Tensor t, DType d) { t.dtype = d; return t; }

// Every argument of a small bf16 layer (T 8, H 256, F 128, E 16, k 4) on fake pointers (slots
// 1-10), with a workspace of exactly the planned size: what the entries' validation tests mutate.
struct FakeLayerArgs {
  static constexpr int64_t kT = 8, kE = 16, kK = 4, kH = 256, kF = 128;
  ForwardPlan plan = plan_forward(MoeShape{kT, kH, kF, kE, kK}, kH200);
  MoeInputs in{Tensor(fake_ptr(1), DType::bf16, {kT, kH}),          // x
               Tensor(fake_ptr(2), DType::bf16, {kE, kH}),          // w_gate
               Tensor{},                                            // router_logits
               Tensor(fake_ptr(3), DType::f32, {kE}),               // score_bias
               Tensor(fake_ptr(4), DType::bf16, {kE, 2 * kF, kH}),  // w13
               Tensor(fake_ptr(5), DType::bf16, {kE, kH, kF})};     // w2
  Tensor topk_ids{fake_ptr(6), DType::i32, {kT, kK}};
  Tensor topk_weights{fake_ptr(7), DType::f32, {kT, kK}};
  Tensor y{fake_ptr(9), DType::bf16, {kT, kH}};
  RouterOptions opt{};
  void* workspace = fake_ptr(10);
  size_t bytes = workspace_bytes(plan);
};
inline Tensor with_shape(Tensor t, std::initializer_list<int64_t> dims) {
  return Tensor(t.data, t.dtype, dims);
}
inline Tensor with_null_data(Tensor t) { t.data = nullptr; return t; }
// 8-byte aligned (fine for an f32 or i32 element) but not 16-byte aligned (a kernel vector).
inline Tensor misaligned(Tensor t) { t.data = static_cast<char*>(t.data) + 8; return t; }

// ---- workspace views ------------------------------------------------------------------------
struct View {
  const char* name;
  Tensor t;
};
// Every given view of a workspace carved at `base` starts 256-byte aligned and lies inside
// [base, base + bytes), and no two overlap (absent views, Tensor{}, are skipped).
inline void expect_views_in_buffer(const std::vector<View>& views, const void* base_ptr, size_t bytes) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(base_ptr);
  for (const View& v : views) {
    if (!v.t.given()) continue;
    const uintptr_t at = reinterpret_cast<uintptr_t>(v.t.data);
    EXPECT_EQ(at % 256, 0u) << v.name;
    EXPECT_GE(at, base) << v.name;
    EXPECT_LE(at + uintptr_t(v.t.bytes()), base + bytes) << v.name;
  }
  for (size_t i = 0; i < views.size(); ++i)
    for (size_t j = i + 1; j < views.size(); ++j) {
      const Tensor &a = views[i].t, &b = views[j].t;
      if (a.bytes() == 0 || b.bytes() == 0) continue;
      const uintptr_t a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
      EXPECT_TRUE(a0 + uintptr_t(a.bytes()) <= b0 || b0 + uintptr_t(b.bytes()) <= a0)
          << views[i].name << " overlaps " << views[j].name;
    }
}

// ---- errors ---------------------------------------------------------------------------------
using test_errors::throws_naming;

// One invalid call of a validation table: what is wrong, the call, the argument it must name.
struct BadCall {
  std::string what;
  std::function<void()> call;
  std::string arg;
};
inline void expect_all_rejected(const std::vector<BadCall>& cases) {
  for (const BadCall& c : cases) EXPECT_TRUE(throws_naming(c.call, c.arg)) << "case: " << c.what;
}

// ---- floating point -------------------------------------------------------------------------
inline uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float float_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
// Floats mapped to integers in value order, so that |a - b| counts the floats between them.
inline int64_t ordered(float f) {
  const uint32_t u = bits_of(f);
  return (u & 0x80000000u) ? -int64_t(u & 0x7fffffffu) : int64_t(u);
}
inline float from_ordered(int64_t o) {
  return o < 0 ? float_of(uint32_t(-o) | 0x80000000u) : float_of(uint32_t(o));
}
inline int64_t ulp_distance(float a, float b) {
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

// The worst-case padded row count a plan reserves: T*k + E*(block_m - 1), rounded up to block_m.
inline int64_t worst_case_rows(int64_t tokens, int64_t topk, int64_t experts, int64_t block_m) {
  const int64_t rows = tokens * topk + experts * (block_m - 1);
  return (rows + block_m - 1) / block_m * block_m;
}

}  // namespace moekit::testing
