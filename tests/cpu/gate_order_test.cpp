// gate_order_test.cpp — the router logits' summation order (router/gate/order.cuh, params.hpp) on
// the host: every block of H belongs to exactly one role of one slice, a role's blocks ascend, the
// non-empty roles of a slice are its first ones (the gate kernels' warp split relies on it), and a
// slice's x tile row holds its blocks. The bitwise agreement of the kernels that follow this
// order is the GPU tests' (RouterTest, GateQuantizeTest).
#include <gtest/gtest.h>

#include <vector>

#include "router/params.hpp"

namespace moekit {
namespace {

namespace kr = kernels::router;

TEST(GateOrder, EveryBlockInOneRoleInAscendingOrder) {
  for (int64_t H = 8; H <= 20000; H += (H < 1100 ? 8 : 136)) {
    const int64_t blocks = kr::gate_blocks(H);
    ASSERT_EQ(blocks, (H + 127) / 128) << H;
    std::vector<int> seen(size_t(blocks), 0);
    int64_t in_slices = 0;
    for (int r = 0; r < kr::kGateSlices; ++r) {
      int64_t in_roles = 0;
      bool empty_seen = false;
      for (int w = 0; w < kr::kGateWarps; ++w) {
        const int64_t n = kr::gate_role_blocks(H, r, w);
        if (n == 0) empty_seen = true;
        else ASSERT_FALSE(empty_seen) << "a non-empty role after an empty one: H=" << H << " r=" << r << " w=" << w;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t b = r + int64_t(kr::kGateSlices) * w + int64_t(kr::kGateSlices) * kr::kGateWarps * j;
          ASSERT_LT(b, blocks) << H;
          ASSERT_EQ(b % kr::kGateSlices, r);
          ++seen[size_t(b)];
        }
        in_roles += n;
      }
      ASSERT_EQ(in_roles, kr::gate_slice_blocks(H, r)) << H << " " << r;
      ASSERT_LE(kr::gate_slice_blocks(H, r), kr::gate_slice_blocks(H, 0));  // slice 0's row is the widest
      in_slices += in_roles;
    }
    ASSERT_EQ(in_slices, blocks) << H;
    for (int64_t b = 0; b < blocks; ++b) ASSERT_EQ(seen[size_t(b)], 1) << "H=" << H << " block " << b;
    // The quantizing clusters' x tile: a row of slice 0's blocks plus 16 bytes of padding.
    EXPECT_EQ(kr::gate_x_row_bytes(H), kr::gate_slice_blocks(H, 0) * 256 + 16);
  }
}

TEST(GateOrder, TheModelShapes) {
  // Qwen3 (H = 2048): 16 blocks, two roles a slice; DeepSeek-V3 (7168): 56, seven; Mixtral (4096):
  // 32, four; H = 9000: 71, roles (0, 0) .. (6, 0) of two blocks (b and b + 64).
  EXPECT_EQ(kr::gate_role_blocks(2048, 3, 1), 1);
  EXPECT_EQ(kr::gate_role_blocks(2048, 3, 2), 0);
  EXPECT_EQ(kr::gate_role_blocks(7168, 7, 6), 1);
  EXPECT_EQ(kr::gate_role_blocks(7168, 0, 7), 0);
  EXPECT_EQ(kr::gate_role_blocks(4096, 5, 3), 1);
  EXPECT_EQ(kr::gate_role_blocks(4096, 5, 4), 0);
  EXPECT_EQ(kr::gate_role_blocks(9000, 6, 0), 2);
  EXPECT_EQ(kr::gate_role_blocks(9000, 7, 0), 1);
  EXPECT_EQ(kr::gate_blocks(72), 1);
  EXPECT_EQ(kr::gate_slice_blocks(72, 1), 0);
}

}  // namespace
}  // namespace moekit
