// combine_test.cu — stage 5 on the GPU against the CPU oracle, bitwise.
#include "gpu_util.hpp"

namespace moekit::test {
namespace {

class CombineTest : public GpuTest {};

TEST_F(CombineTest, BitwiseEqualsOracle) {
  std::mt19937_64 rng(fresh_seed());
  for (int64_t k : {1, 2, 8, 16})
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

TEST_F(CombineTest, EmptyInput) {
  combine(Tensor(nullptr, DType::bf16, {0, 64}), 2, Tensor(nullptr, DType::bf16, {0, 64}), stream);
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace
}  // namespace moekit::test
