// ep_runtime_test.cpp — the host plumbing of the NCCL path that runs without a GPU: a rank's
// environment (spawn_ranks' children) and the message when NCCL cannot be loaded.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "cpu_test_util.hpp"
#include "moekit/ep_nccl.hpp"

namespace moekit::testing {
namespace {

// Sets the three variables for one test and removes them after.
struct RankVars {
  RankVars(const char* rank, const char* ranks, const char* id) {
    set("MOEKIT_EP_RANK", rank);
    set("MOEKIT_EP_RANKS", ranks);
    set("MOEKIT_EP_NCCL_ID", id);
  }
  ~RankVars() {
    unsetenv("MOEKIT_EP_RANK");
    unsetenv("MOEKIT_EP_RANKS");
    unsetenv("MOEKIT_EP_NCCL_ID");
  }
  static void set(const char* name, const char* v) {
    if (v) setenv(name, v, 1);
    else unsetenv(name);
  }
};

std::string hex_id(char fill) { return std::string(256, fill); }

TEST(EpRankEnv, AbsentMeansNotSpawned) {
  const RankVars vars(nullptr, nullptr, nullptr);
  EXPECT_FALSE(ep::rank_from_env().has_value());
}

TEST(EpRankEnv, ParsesRankRanksAndTheId) {
  std::string id = hex_id('0');
  id[0] = 'a', id[1] = '5', id[254] = 'f', id[255] = 'f';
  const RankVars vars("1", "2", id.c_str());
  const std::optional<ep::RankEnv> env = ep::rank_from_env();
  ASSERT_TRUE(env.has_value());
  EXPECT_EQ(env->rank, 1);
  EXPECT_EQ(env->ranks, 2);
  EXPECT_EQ(static_cast<unsigned char>(env->id.bytes[0]), 0xa5);
  EXPECT_EQ(static_cast<unsigned char>(env->id.bytes[127]), 0xff);
  EXPECT_EQ(env->id.bytes[1], 0);
}

TEST(EpRankEnv, MalformedValuesAreNamed) {
  const std::string good = hex_id('1');
  struct Case {
    const char *rank, *ranks;
    std::string id;
    const char* names;
  } cases[] = {
      {"0", nullptr, good, "MOEKIT_EP_RANKS"},        // rank without the others
      {"x", "2", good, "MOEKIT_EP_RANK"},             // not a number
      {"2", "2", good, "MOEKIT_EP_RANK"},             // rank past the ranks
      {"0", "2", "abc", "MOEKIT_EP_NCCL_ID"},         // wrong length
      {"0", "2", hex_id('g'), "MOEKIT_EP_NCCL_ID"},   // not hex
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string("rank=") + c.rank + " ranks=" + (c.ranks ? c.ranks : "(unset)") + " id=" + c.id.substr(0, 8));
    const RankVars vars(c.rank, c.ranks, c.id.c_str());
    EXPECT_TRUE(throws_naming([] { ep::rank_from_env(); }, c.names));
  }
}

// Checked before NCCL is loaded or a GPU is touched.
TEST(EpRankEnv, BadRankCountsAreNamed) {
  EXPECT_TRUE(throws_naming([] { ep::spawn_ranks(0, {}); }, "ranks"));
  EXPECT_TRUE(throws_naming([] { ep::Communicator c(ep::NcclId{}, 0, 0); }, "ranks"));
  EXPECT_TRUE(throws_naming([] { ep::Communicator c(ep::NcclId{}, 2, 2); }, "rank"));
  EXPECT_TRUE(throws_naming([] { ep::Communicator c(ep::NcclId{}, -1, 2); }, "rank"));
}

// Run in a process of its own by ctest (gtest_discover_tests): the loader is tried once per
// process, and this test points it at a file that does not exist.
TEST(EpNccl, AMissingLibrarySaysWhatWasTriedAndWhatToDo) {
  setenv("MOEKIT_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  try {
    ep::nccl_version();
    ADD_FAILURE() << "no error for a missing NCCL";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/nonexistent/libnccl.so.2"), std::string::npos) << what;
    EXPECT_NE(what.find("MOEKIT_NCCL_LIBRARY"), std::string::npos) << what;
  }
  EXPECT_THROW(ep::nccl_unique_id(), Error);  // every later call reports it too
  unsetenv("MOEKIT_NCCL_LIBRARY");
}

}  // namespace
}  // namespace moekit::testing

namespace moekit::testing {
namespace {

// Validation throws before any copy: fake device pointers are never touched.
TEST(EpCopyLocalExperts, BadArgumentsAreNamed) {
  const ep::Placement p = ep::plan_placement({.experts = 8, .ranks = 2});  // S = 4
  const Tensor w13(fake_ptr(0), DType::bf16, {8, 64, 32}), w2(fake_ptr(1), DType::bf16, {8, 32, 32});
  const Tensor l13(fake_ptr(2), DType::bf16, {4, 64, 32}), l2(fake_ptr(3), DType::bf16, {4, 32, 32});
  ep::Placement broken = p;
  broken.replica_slots[0] = 5;  // expert 0 claimed by a slot that holds another
  expect_all_rejected({
      {"rank past R", [&] { ep::copy_local_experts(p, 2, w13, w2, l13, l2, nullptr); }, "rank"},
      {"inconsistent placement", [&] { ep::copy_local_experts(broken, 0, w13, w2, l13, l2, nullptr); }, "placement"},
      {"w13 of other experts", [&] { ep::copy_local_experts(p, 0, with_shape(w13, {7, 64, 32}), w2, l13, l2, nullptr); }, "w13"},
      {"w2 not [E, H, F]", [&] { ep::copy_local_experts(p, 0, w13, with_shape(w2, {8, 32, 64}), l13, l2, nullptr); }, "w2"},
      {"w13_local not S slots", [&] { ep::copy_local_experts(p, 0, w13, w2, with_shape(l13, {3, 64, 32}), l2, nullptr); }, "w13_local"},
      {"w2_local f32", [&] { ep::copy_local_experts(p, 0, w13, w2, l13, with_dtype(l2, DType::f32), nullptr); }, "w2_local"},
  });
}

}  // namespace
}  // namespace moekit::testing
