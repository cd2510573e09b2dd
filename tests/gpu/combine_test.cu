// combine_test.cu — stage 5 on the GPU against the CPU oracle, bitwise.
#include "gpu_util.hpp"

namespace moekit::test {
namespace {

class CombineTest : public GpuTest {};

TEST_F(CombineTest, BitwiseEqualsOracle) {
  std::mt19937_64 rng(fresh_seed());
  for (int64_t k : {1, 2, 3, 8, 9, 16})
    for (int64_t T : {1, 3, 1000})
      for (int64_t H : {8, 72, 4096}) {
        SCOPED_TRACE("T=" + std::to_string(T) + " k=" + std::to_string(k) + " H=" + std::to_string(H));
        const auto rows = random_bf16(size_t(T * k * H), rng, 3.0f);
        DeviceBuffer<ref::bf16> d_rows(rows), d_y(size_t(T * H));
        d_y.poison();
        combine(Tensor(d_rows.ptr, DType::bf16, {T * k, H}), k, Tensor(d_y.ptr, DType::bf16, {T, H}), stream);
        MK_CUDA_CHECK(cudaStreamSynchronize(stream));
        ASSERT_EQ(d_y.download(), ref::combine(rows.data(), T, k, H));
      }
}

// Split-K's combine: the (j, s) terms are loaded in groups (kTermsInFlight) but summed in the
// oracle's order; k*S from 1 to 128 covers one group, a partial last group, and many groups.
TEST_F(CombineTest, PartialsBitwiseEqualOracle) {
  std::mt19937_64 rng(fresh_seed());
  for (int64_t S : {1, 2, 3, 8})
    for (int64_t k : {1, 2, 3, 9, 16})
      for (int64_t T : {1, 3, 130})
        for (int64_t H : {8, 72, 4096}) {
          if (S * T * k * H > (int64_t(1) << 24)) continue;  // keeps the host oracle quick
          SCOPED_TRACE("S=" + std::to_string(S) + " T=" + std::to_string(T) + " k=" + std::to_string(k) +
                       " H=" + std::to_string(H));
          const auto partials = random_f32(size_t(S * T * k * H), rng, 3.0f);
          DeviceBuffer<float> d_partials(partials);
          DeviceBuffer<ref::bf16> d_y(size_t(T * H));
          d_y.poison();
          combine_partials(Tensor(d_partials.ptr, DType::f32, {S, T * k, H}), k, Tensor(d_y.ptr, DType::bf16, {T, H}),
                           stream);
          MK_CUDA_CHECK(cudaStreamSynchronize(stream));
          ASSERT_EQ(d_y.download(), ref::combine_partials(partials.data(), S, T, k, H));
        }
}

TEST_F(CombineTest, EmptyInput) {
  combine(Tensor(nullptr, DType::bf16, {0, 64}), 2, Tensor(nullptr, DType::bf16, {0, 64}), stream);
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace
}  // namespace moekit::test
