// sm90_layout_test.cpp — the layout arithmetic of the Hopper wgmma expert GEMM
// (src/gemm/sm90/layout.hpp) against the definitions it implements, on the CPU: the 128-byte
// swizzle (as the PTX ISA / CUDA driver and CuTe's Swizzle<3,4,3> define it), the wgmma matrix
// descriptor fields, the m64nNk16 accumulator fragment, the epilogue's quad transpose (4 lanes
// simulated by 4 threads, shuffles through a barrier) and the persistent schedule.
//
// Build and run: cmake --build build --target moekit_cpu_tests && ./build/tests/moekit_cpu_tests --gtest_filter='Sm90*'
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "gemm/sm90/layout.hpp"

namespace moekit::kernels::gemm::sm90 {
namespace {

// The configs the launcher compiles (src/gemm/sm90_expert_gemm.cu, MK_SM90_CONFIGS).
using Cfg256 = Config<256, 4>;
using Cfg128 = Config<128, 6>;
// H100/H200 opt-in shared memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin): 227 KB.
constexpr size_t kHopperSmemOptin = 232448;

TEST(Sm90Swizzle, MatchesCuteSwizzle343OnEveryBf16Element) {
  // CuTe Swizzle<B=3, M=4, S=3>: offset ^ ((offset & (7 << 7)) >> 3), on byte offsets.
  for (uint32_t byte = 0; byte < 64 * 1024; byte += 2) {
    const uint32_t cute = byte ^ ((byte & (7u << 7)) >> 3);
    ASSERT_EQ(sw128_address_bits(byte), cute) << "byte " << byte;
  }
}

TEST(Sm90Swizzle, ChunkOffsetIsTheSwizzledLinearAddressAndStaysInItsRow) {
  for (uint32_t row = 0; row < 256; ++row) {
    std::set<uint32_t> chunks;
    for (uint32_t chunk = 0; chunk < 8; ++chunk) {
      const uint32_t off = sw128_offset(row, chunk);
      ASSERT_EQ(off, sw128_address_bits(row * 128 + chunk * 16)) << "row " << row << " chunk " << chunk;
      ASSERT_EQ(off / 128, row) << "a chunk must stay in its own 128-byte row";
      ASSERT_EQ(off % 16, 0u);
      chunks.insert(off);
    }
    ASSERT_EQ(chunks.size(), 8u) << "row " << row << ": the 8 chunks must land on 8 distinct slots";
  }
  // Row 0 is not permuted; row 1 swaps neighbouring chunks; row 7 reverses the row.
  EXPECT_EQ(sw128_offset(0, 3), 3u * 16);
  EXPECT_EQ(sw128_offset(1, 0), 128u + 16);
  EXPECT_EQ(sw128_offset(7, 0), 7u * 128 + 7 * 16);
  EXPECT_EQ(sw128_offset(8, 5), 8u * 128 + 5 * 16);  // the pattern repeats every 8 rows
}

TEST(Sm90Descriptor, FieldsFollowThePtxMatrixDescriptorFormat) {
  for (uint32_t addr = 0; addr < (1u << 18); addr += 16 * 37) {
    const uint64_t d = make_desc_k_sw128(addr);
    EXPECT_EQ(d & 0x3FFF, (addr >> 4) & 0x3FFF) << "start address, bits 0-13";
    EXPECT_EQ((d >> 14) & 0x3, 0u) << "bits 14-15 reserved";
    EXPECT_EQ((d >> 16) & 0x3FFF, 1u) << "leading byte offset 16 B (unused for swizzled K-major)";
    EXPECT_EQ((d >> 30) & 0x3, 0u);
    EXPECT_EQ((d >> 32) & 0x3FFF, 1024u >> 4) << "stride byte offset: 8 rows x 128 B";
    EXPECT_EQ((d >> 46) & 0x7, 0u);
    EXPECT_EQ((d >> 49) & 0x7, 0u) << "base offset";
    EXPECT_EQ((d >> 52) & 0x3FF, 0u);
    EXPECT_EQ(d >> 62, 1u) << "swizzle mode 1 = 128B";
  }
}

// The Dx GEMM's N-major B: the descriptor's fields, and the canonical N-major layout it names (PTX
// ISA, 128B swizzle, 16-bit elements: ((8, 8, n), (8, k)) : ((1, 8, LBO), (64, SBO)) elements,
// the swizzle applied to the byte address) against where the producer's TMA boxes put each element.
TEST(Sm90Descriptor, NMajorTileIsTheCanonicalLayoutItsDescriptorNames) {
  const uint64_t d = make_desc_mn_sw128(4096);
  EXPECT_EQ(d & 0x3FFF, 4096u >> 4);
  const uint32_t lbo = uint32_t((d >> 16) & 0x3FFF) << 4, sbo = uint32_t((d >> 32) & 0x3FFF) << 4;
  EXPECT_EQ(lbo, 8192u) << "leading byte offset: from one 64-column panel to the next";
  EXPECT_EQ(sbo, 1024u) << "stride byte offset: from one 8-row K group to the next";
  EXPECT_EQ(d >> 62, 1u) << "swizzle mode 1 = 128B";
  for (uint32_t k = 0; k < uint32_t(kBlockK); ++k)
    for (uint32_t n = 0; n < 256; ++n) {
      const uint32_t canonical_elems = (n % 8) + 8 * ((n / 8) % 8) + 64 * (k % 8);  // inside one atom
      const uint32_t canonical = (n / 64) * lbo + (k / 8) * sbo + sw128_address_bits(canonical_elems * 2);
      ASSERT_EQ(mn_tile_offset(k, n), canonical) << "k " << k << " n " << n;
    }
  // The weight-gradient producer's copies: two bases and whole-row steps reproduce every offset.
  for (uint32_t step : {4u, 8u})
    for (uint32_t r0 = 0; r0 < step; ++r0)
      for (uint32_t n = 0; n < 256; n += 8)
        for (uint32_t i = 0; r0 + step * i < 64; ++i)
          ASSERT_EQ(mn_parity_base(r0, n, step, i % 2) + i * step * uint32_t(kRowBytes), mn_tile_offset(r0 + step * i, n))
              << "step " << step << " r0 " << r0 << " n " << n << " i " << i;
  // The k16 slices: 16 K rows = 2 atoms in, keeping the start on an atom (base offset 0).
  for (int kk = 0; kk < kBlockK / kWgmmaK; ++kk) {
    EXPECT_EQ(mn_k16_bytes(kk), mn_tile_offset(uint32_t(16 * kk), 0));
    EXPECT_EQ(mn_k16_bytes(kk) % kSwizzleAtomBytes, 0u);
    EXPECT_EQ(desc_advance(make_desc_mn_sw128(4096), mn_k16_bytes(kk)), make_desc_mn_sw128(4096 + mn_k16_bytes(kk)));
  }
}

// Every descriptor the consumers form: stage s, warpgroup w, k16 slice kk. The start must stay in
// the 14-bit field (no carry into the reserved bits) and keep address bits [7,10) zero, which is
// what base offset 0 asserts.
template <class Cfg>
void check_descriptor_starts(uint32_t smem_base) {
  for (uint32_t s = 0; s < uint32_t(Cfg::kStages); ++s)
    for (int w = 0; w < kConsumerWarpgroups; ++w)
      for (uint32_t kk = 0; kk < uint32_t(kBlockK / kWgmmaK); ++kk) {
        const uint32_t a_addr = smem_base + Cfg::kAOffset + s * Cfg::kABytes + uint32_t(w * kWgmmaM * kRowBytes);
        const uint32_t b_addr = smem_base + Cfg::kBOffset + s * Cfg::kBBytes;
        for (uint32_t addr : {a_addr, b_addr}) {
          const uint64_t d = desc_advance(make_desc_k_sw128(addr), kk * kWgmmaK * 2);
          EXPECT_EQ(d, make_desc_k_sw128(addr + kk * kWgmmaK * 2)) << "advance must equal a fresh descriptor";
          EXPECT_EQ(((addr + kk * 32) >> 7) & 7, 0u) << "stage " << s << " wg " << w << " kk " << kk;
          EXPECT_EQ(addr % kSwizzleAtomBytes, 0u) << "tiles start on 1024-byte atoms";
        }
      }
}

TEST(Sm90Descriptor, EveryStartTheKernelFormsIsValid) {
  // The dynamic-smem window starts at 0 or higher; the kernel rounds the base up to 1024.
  for (uint32_t base : {0u, 1024u, 4096u, 31u * 1024u}) {
    check_descriptor_starts<Cfg256>(base);
    check_descriptor_starts<Cfg128>(base);
  }
}

TEST(Sm90Config, SharedMemoryAndRegistersFitAHopperSm) {
  EXPECT_LE(Cfg256::kSmemBytes, kHopperSmemOptin);
  EXPECT_LE(Cfg128::kSmemBytes, kHopperSmemOptin);
  EXPECT_EQ(Cfg256::kBarOffset % 8, 0u);
  EXPECT_EQ(Cfg128::kBarOffset % 8, 0u);
  // 384 threads x 168 registers at launch; setmaxnreg redistributes them.
  EXPECT_LE(Cfg256::kProducerRegs * kProducerThreads + Cfg256::kConsumerRegs * kConsumerThreads, 168 * kThreads);
  EXPECT_EQ(Cfg256::kABytes, 128u * 64 * 2);
  EXPECT_EQ(Cfg256::kBBytes, 256u * 64 * 2);
  EXPECT_EQ(cols_per_tile(Mode::Up, Cfg256::kBlockN), 128);
  EXPECT_EQ(cols_per_tile(Mode::Down, Cfg256::kBlockN), 256);
}

TEST(Sm90Accumulator, FragmentCoversTheTileOnceAndMatchesThePtxFigure) {
  for (int n : {128, 256}) {
    std::vector<int> seen(size_t(64 * n), 0);
    for (int warp = 0; warp < 4; ++warp)
      for (int lane = 0; lane < 32; ++lane)
        for (int v = 0; v < n / 2; ++v) {
          const int r = acc_row(warp, lane, v), c = acc_col(lane, v);
          ASSERT_TRUE(r >= 0 && r < 64 && c >= 0 && c < n);
          ++seen[size_t(r * n + c)];
        }
    for (int i = 0; i < 64 * n; ++i) ASSERT_EQ(seen[size_t(i)], 1) << "n " << n << " element " << i;
  }
  // PTX ISA figure "WGMMA .m64nNk16 register fragment layout for accumulator matrix D".
  EXPECT_EQ(acc_row(0, 0, 0), 0); EXPECT_EQ(acc_col(0, 0), 0);
  EXPECT_EQ(acc_row(0, 0, 1), 0); EXPECT_EQ(acc_col(0, 1), 1);
  EXPECT_EQ(acc_row(0, 0, 2), 8); EXPECT_EQ(acc_col(0, 2), 0);
  EXPECT_EQ(acc_row(0, 0, 4), 0); EXPECT_EQ(acc_col(0, 4), 8);
  EXPECT_EQ(acc_row(0, 5, 0), 1); EXPECT_EQ(acc_col(5, 0), 2);
  EXPECT_EQ(acc_row(1, 0, 0), 16);
  EXPECT_EQ(acc_row(3, 31, 3), 63); EXPECT_EQ(acc_col(31, 3), 7);
}

// Four lanes of a quad, each a thread; shfl_xor goes through a shared slot between two barrier
// phases, as __shfl_xor_sync exchanges values among the lanes executing it together.
struct QuadSim {
  std::barrier<> sync{4};
  uint32_t slot[4] = {};
  template <class Body>
  void run(Body body) {
    std::vector<std::thread> lanes;
    for (int q = 0; q < 4; ++q)
      lanes.emplace_back([&, q] {
        auto shfl = [&](uint32_t v, int m) {
          slot[q] = v;
          sync.arrive_and_wait();
          const uint32_t got = slot[q ^ m];
          sync.arrive_and_wait();
          return got;
        };
        body(q, shfl);
      });
    for (auto& t : lanes) t.join();
  }
};

TEST(Sm90QuadTranspose, LaneQEndsWithBlockQ) {
  QuadSim sim;
  uint32_t out[4][4] = {};
  sim.run([&](int q, auto& shfl) {
    uint32_t x[4];
    for (int i = 0; i < 4; ++i) x[i] = uint32_t(i * 16 + q);  // (block i, pair q)
    quad_transpose(x, q, shfl);
    for (int c = 0; c < 4; ++c) out[q][c] = x[c];
  });
  for (int q = 0; q < 4; ++q)
    for (int c = 0; c < 4; ++c) EXPECT_EQ(out[q][c], uint32_t(q * 16 + c)) << "lane " << q << " element " << c;
}

// The whole epilogue mapping for one warp: pack accumulator pairs by epi_acc, transpose, store at
// epi_store_col. Tag every accumulator with its (row, col) from the fragment layout and check that
// each stored 16-byte vector holds 8 consecutive columns of one row, in order, at the right place.
TEST(Sm90Epilogue, StoredVectorsHoldTheirOwnRowAndColumns) {
  for (int n : {128, 256})
    for (bool up : {false, true}) {
      const int out_cols = up ? n / 2 : n;
      for (int warp = 0; warp < 4; ++warp) {
        std::vector<int> written(size_t(16 * out_cols), 0);
        for (int quad = 0; quad < 8; ++quad) {
          std::vector<int> stored[4];  // column offsets lane q stored, merged after the lanes join
          QuadSim sim;
          sim.run([&](int q, auto& shfl) {
            const int lane = quad * 4 + q;
            for (int h = 0; h < 2; ++h)
              for (int g = 0; g < out_cols / 32; ++g) {
                uint32_t x[4];
                for (int i = 0; i < 4; ++i) {
                  const int v = epi_acc(g, i, h);
                  // Up: the gate accumulator v pairs with up accumulator v + 4·(n/16): same column.
                  if (up) {
                    EXPECT_EQ(acc_col(lane, v + 4 * (n / 16)), acc_col(lane, v) + n / 2);
                    EXPECT_EQ(acc_row(warp, lane, v + 4 * (n / 16)), acc_row(warp, lane, v));
                  }
                  EXPECT_EQ(acc_col(lane, v + 1), acc_col(lane, v) + 1);
                  x[i] = uint32_t(acc_row(warp, lane, v) << 16 | acc_col(lane, v));
                }
                quad_transpose(x, q, shfl);
                const int col0 = epi_store_col(g, q), row = acc_row(warp, lane, 2 * h);
                for (int c = 0; c < 4; ++c) {
                  EXPECT_EQ(int(x[c] >> 16), row) << "lane " << lane << " g " << g << " h " << h;
                  EXPECT_EQ(int(x[c] & 0xffff), col0 + 2 * c) << "lane " << lane << " g " << g << " h " << h;
                }
                const int local_row = row - 16 * warp;
                for (int c = 0; c < 8; ++c) stored[q].push_back(local_row * out_cols + col0 + c);
              }
          });
          for (const auto& lane_stores : stored)
            for (int i : lane_stores) ++written[size_t(i)];
        }
        for (int i = 0; i < 16 * out_cols; ++i)
          ASSERT_EQ(written[size_t(i)], 1) << "n " << n << " up " << up << " warp " << warp << " element " << i;
      }
    }
}

// Split-K's FP32 partial rows (epilogue.cuh, store_partial_row): the even columns' and the odd
// columns' accumulators transposed apart, then interleaved into two 16-byte stores, put lane q's
// 8 consecutive columns of the group in order, as store_row_groups' bf16 pairs.
TEST(Sm90Epilogue, PartialRowsStoreEightConsecutiveColumns) {
  for (int lane0 = 0; lane0 < 32; lane0 += 4) {
    QuadSim sim;
    std::vector<int> stored[4];
    sim.run([&](int q, auto& shfl) {
      const int lane = lane0 + q;
      for (int g = 0; g < 2; ++g) {
        uint32_t even[4], odd[4];
        for (int i = 0; i < 4; ++i) {
          const int v = epi_acc(g, i, 0);
          even[i] = uint32_t(acc_col(lane, v)), odd[i] = uint32_t(acc_col(lane, v + 1));
        }
        quad_transpose(even, q, shfl);
        quad_transpose(odd, q, shfl);
        const uint32_t vec[8] = {even[0], odd[0], even[1], odd[1], even[2], odd[2], even[3], odd[3]};
        for (int c = 0; c < 8; ++c) {
          EXPECT_EQ(int(vec[c]), epi_store_col(g, q) + c) << "lane " << lane << " g " << g << " element " << c;
          stored[q].push_back(int(vec[c]));
        }
      }
    });
    std::vector<int> all;
    for (const auto& v : stored) all.insert(all.end(), v.begin(), v.end());
    std::sort(all.begin(), all.end());
    for (int c = 0; c < 64; ++c) ASSERT_EQ(all[size_t(c)], c) << "each of the 2 groups' 32 columns stored once";
  }
}

// Split-K (k_slice): the column index n_tile · splits + split gives each output column tile
// every one of its K-tiles exactly once over its slices, in slices of at most per_split; a slice
// past K has none; one slice is the whole K.
TEST(Sm90Schedule, KSlicesCoverEveryColumnTilesKOnce) {
  for (int32_t splits : {1, 2, 3, 4})
    for (int32_t k_tiles : {1, 2, 3, 5, 9, 16, 224})
      for (int32_t n_tiles : {1, 16}) {
        const int32_t per_split = (k_tiles + splits - 1) / splits;
        std::vector<std::vector<int>> hits(size_t(n_tiles), std::vector<int>(size_t(k_tiles), 0));
        for (int32_t column = 0; column < n_tiles * splits; ++column) {
          const KSlice ks = k_slice(column, splits, per_split, k_tiles);
          ASSERT_TRUE(ks.n_tile >= 0 && ks.n_tile < n_tiles && ks.split == column % splits);
          ASSERT_TRUE(ks.count >= 0 && ks.count <= per_split && ks.kt0 == ks.split * per_split);
          if (splits == 1) ASSERT_TRUE(ks.kt0 == 0 && ks.count == k_tiles);
          for (int32_t kt = ks.kt0; kt < ks.kt0 + ks.count; ++kt) {
            ASSERT_LT(kt, k_tiles);
            ++hits[size_t(ks.n_tile)][size_t(kt)];
          }
        }
        for (const auto& tile : hits)
          for (int h : tile) ASSERT_EQ(h, 1) << "splits " << splits << " k_tiles " << k_tiles;
      }
}

TEST(Sm90Schedule, ItemsMapOntoEveryTileOnceInTheFixedGroupOrder) {
  for (int32_t blocks : {1, 7, 8, 9, 17, 64, 133})
    for (int32_t n_tiles : {1, 3, 8, 28}) {
      std::set<std::pair<int32_t, int32_t>> seen;
      for (int32_t item = 0; item < blocks * n_tiles; ++item) {
        const TileCoord t = gemm::grouped_tile<int32_t>(item, blocks, n_tiles);
        ASSERT_TRUE(t.block >= 0 && t.block < blocks && t.n_tile >= 0 && t.n_tile < n_tiles);
        seen.insert({t.block, t.n_tile});
        // The order written out in 64 bits, and the mma.sync kernel's 64-bit instance of it.
        const int64_t group = item / (8 * int64_t(n_tiles)), first = group * 8;
        const int64_t in_group = std::min<int64_t>(8, blocks - first), j = item - group * 8 * n_tiles;
        ASSERT_EQ(t.block, first + j % in_group);
        ASSERT_EQ(t.n_tile, j / in_group);
        const gemm::GroupedTile<int64_t> t64 = gemm::grouped_tile<int64_t>(item, blocks, n_tiles);
        ASSERT_EQ(t64.block, t.block);
        ASSERT_EQ(t64.n_tile, t.n_tile);
      }
      ASSERT_EQ(int64_t(seen.size()), int64_t(blocks) * n_tiles);
    }
}

// The publishing warp's mask (scheduler.cuh), built the long way: bit l when block
// b - kGroupBlocks + l exists and has b's expert.
uint32_t same_expert_mask(const std::vector<int32_t>& block_expert, int32_t b) {
  uint32_t same = 0;
  for (int l = 0; l < kChunkWindow; ++l) {
    const int32_t q = b - kGroupBlocks + l;
    if (q >= 0 && q < int32_t(block_expert.size()) && block_expert[size_t(q)] == block_expert[size_t(b)]) same |= 1u << l;
  }
  return same;
}

// Layouts of expert runs (block_expert of the used blocks): runs of 0 .. 40 blocks (0: an expert
// with no rows), and the adversarial ones: one expert for every block, runs of exactly
// kGroupBlocks and kGroupBlocks + 1, all runs of 1.
std::vector<std::vector<int32_t>> chunk_layouts() {
  std::vector<std::vector<int32_t>> out;
  std::mt19937 rng(20261206);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<int32_t> be;
    const int max_run = trial < 10 ? 3 : trial < 20 ? 10 : 40;
    for (int32_t e = 0; be.size() < 300 && e < 200; ++e)
      for (int r = int(rng() % uint32_t(max_run + 1)); r > 0; --r) be.push_back(e);
    if (!be.empty()) out.push_back(be);
  }
  out.push_back(std::vector<int32_t>(133, 5));
  for (int run : {kGroupBlocks, kGroupBlocks + 1, 1}) {
    std::vector<int32_t> be;
    for (int32_t e = 0; be.size() < 100; ++e)
      for (int r = 0; r < run; ++r) be.push_back(e);
    out.push_back(be);
  }
  out.push_back({3});
  return out;
}

TEST(Sm90Schedule, ExpertChunksPartitionTheBlocksAndKeepShortRunsWhole) {
  for (const std::vector<int32_t>& be : chunk_layouts()) {
    const int32_t blocks = int32_t(be.size());
    for (int32_t b = 0; b < blocks; ++b) {
      const gemm::BlockChunk c = gemm::expert_chunk(same_expert_mask(be, b), b);
      // b's chunk holds b, one expert's blocks, at most kGroupBlocks of them.
      ASSERT_TRUE(c.first <= b && b < c.first + c.count && c.count >= 1 && c.count <= kGroupBlocks) << "block " << b;
      for (int32_t q = c.first; q < c.first + c.count; ++q) ASSERT_EQ(be[size_t(q)], be[size_t(b)]) << "block " << b;
      // Every block of the chunk finds the same chunk (so any of its items, claimed first, does).
      for (int32_t q = c.first; q < c.first + c.count; ++q) {
        const gemm::BlockChunk d = gemm::expert_chunk(same_expert_mask(be, q), q);
        ASSERT_TRUE(d.first == c.first && d.count == c.count) << "block " << b << " and " << q;
      }
      // The run of b's expert around b, whole if it has at most kGroupBlocks blocks, else cut
      // only at kGroupBlocks-aligned windows.
      int32_t rs = b, re = b + 1;
      while (rs > 0 && be[size_t(rs - 1)] == be[size_t(b)]) --rs;
      while (re < blocks && be[size_t(re)] == be[size_t(b)]) ++re;
      if (re - rs <= kGroupBlocks) {
        ASSERT_TRUE(c.first == rs && c.count == re - rs) << "block " << b;
      } else {
        const int32_t w = b / kGroupBlocks * kGroupBlocks;
        ASSERT_EQ(c.first, std::max(w, rs)) << "block " << b;
        ASSERT_EQ(c.first + c.count, std::min(w + kGroupBlocks, re)) << "block " << b;
      }
    }
  }
}

TEST(Sm90Schedule, ItemsMapOntoEveryTileOnceInChunkOrder) {
  for (const std::vector<int32_t>& be : chunk_layouts())
    for (int32_t n_tiles : {1, 3, 16, 28}) {
      const int32_t blocks = int32_t(be.size());
      std::set<std::pair<int32_t, int32_t>> seen;
      for (int32_t item = 0; item < blocks * n_tiles; ++item) {
        const int32_t b = item / n_tiles;
        const gemm::BlockChunk c = gemm::expert_chunk(same_expert_mask(be, b), b);
        const TileCoord t = gemm::chunk_tile(item, c, n_tiles);
        ASSERT_TRUE(t.block >= c.first && t.block < c.first + c.count && t.n_tile >= 0 && t.n_tile < n_tiles);
        // Column tiles outermost: the chunk's blocks at one column tile are consecutive items.
        ASSERT_EQ(t.n_tile, (item - c.first * n_tiles) / c.count);
        const TileCoord back = tile_of(tile_code(t, n_tiles), n_tiles);
        ASSERT_TRUE(back.block == t.block && back.n_tile == t.n_tile);
        seen.insert({t.block, t.n_tile});
      }
      ASSERT_EQ(int64_t(seen.size()), int64_t(blocks) * n_tiles);
    }
}

// The ping-pong consumers (pingpong.cuh): a warpgroup multiplies the items of its parity and
// skips the others' K-tiles at once; it must wait on exactly the (stage, phase) sequence the
// producer filled for its items, whatever the ring depth and K (k_tiles = 0 included).
template <int STAGES>
void check_pingpong_positions() {
  for (int32_t k_tiles : {0, 1, 2, STAGES - 1, STAGES, STAGES + 1, 12, 64, 1001}) {
    std::vector<std::pair<uint32_t, uint32_t>> filled;  // the producer's (stage, phase), in order
    Pipe<STAGES> producer;
    const int items = 7;
    for (int it = 0; it < items; ++it)
      for (int32_t kt = 0; kt < k_tiles; ++kt, producer.advance()) filled.push_back({producer.stage, producer.phase});
    for (int wg = 0; wg < 2; ++wg) {
      Pipe<STAGES> pipe;
      for (int it = 0; it < items; ++it) {
        if (it % 2 != wg) {
          pipe.skip(k_tiles);
          continue;
        }
        for (int32_t kt = 0; kt < k_tiles; ++kt, pipe.advance()) {
          const auto want = filled[size_t(it) * size_t(k_tiles) + size_t(kt)];
          ASSERT_EQ(pipe.stage, want.first) << "item " << it << " k-tile " << kt << " K " << k_tiles;
          ASSERT_EQ(pipe.phase, want.second) << "item " << it << " k-tile " << kt << " K " << k_tiles;
        }
      }
      ASSERT_EQ(pipe.stage, producer.stage) << "K " << k_tiles;
      ASSERT_EQ(pipe.phase, producer.phase) << "K " << k_tiles;
    }
  }
}

TEST(Sm90Schedule, PingPongWarpgroupsWaitOnTheProducersStages) {
  check_pingpong_positions<3>();
  check_pingpong_positions<4>();
  check_pingpong_positions<6>();
}

}  // namespace
}  // namespace moekit::kernels::gemm::sm90
