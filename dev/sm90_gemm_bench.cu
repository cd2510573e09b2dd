// dev/sm90_gemm_bench.cu — timing ladder of the prefill expert GEMMs on one preset shape: the
// mma.sync kernel (expert_up/expert_down, block_m 128) against the wgmma kernel
// (launch_sm90_expert_gemm), with dense cuBLAS bf16 as the ceiling, all in one run. The wgmma
// kernel is checked against the mma.sync one (relative-norm error over sampled rows) before
// anything is timed; a failed check exits 1.
//
// Build: cmake --build build --target sm90_gemm_bench
// Run:   ./build/sm90_gemm_bench [preset] [tokens] [block_n] [iters]
//        preset: mixtral-8x7b | qwen3-30b-a3b | deepseek-v3 (default qwen3-30b-a3b), tokens 4096,
//        block_n 256 (or 128), iters 20. Uniform random routing; weights hashed on the device.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"
#include "gemm/expert_gemm.cuh"
#include "gemm/sm90_expert_gemm.hpp"
#include "moekit/moe.hpp"
#include "moekit/reference.hpp"

namespace {

using namespace moekit;
using kernels::gemm::Mode;
using kernels::gemm::Params;

#define BENCH_CUBLAS(expr)                                                          \
  do {                                                                              \
    if ((expr) != CUBLAS_STATUS_SUCCESS) {                                          \
      std::fprintf(stderr, "cuBLAS failure: %s at %s:%d\n", #expr, __FILE__, __LINE__); \
      std::exit(2);                                                                 \
    }                                                                               \
  } while (0)

// bf16 noise, uniform in [-scale, scale), hashed from the index: never zeros, different per buffer.
__global__ void fill_kernel(__nv_bfloat16* out, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t h = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 32;
    out[i] = __float2bfloat16_rn((float(h >> 40) / float(1 << 24) * 2.0f - 1.0f) * scale);
  }
}

struct DevBuf {
  void* ptr = nullptr;
  explicit DevBuf(size_t bytes) { MK_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(bytes, 16))); }
  ~DevBuf() { cudaFree(ptr); }
  template <class T>
  T* as() const { return static_cast<T*>(ptr); }
};

void fill(__nv_bfloat16* p, int64_t n, uint64_t seed, float scale) {
  fill_kernel<<<4096, 256>>>(p, n, seed, scale);
  MK_LAUNCH_CHECK("fill_kernel");
}

template <class F>
double median_ms(F&& run, int iters, cudaStream_t stream) {
  for (int i = 0; i < 3; ++i) run();
  cudaEvent_t t0, t1;
  MK_CUDA_CHECK(cudaEventCreate(&t0));
  MK_CUDA_CHECK(cudaEventCreate(&t1));
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    MK_CUDA_CHECK(cudaEventRecord(t0, stream));
    run();
    MK_CUDA_CHECK(cudaEventRecord(t1, stream));
    MK_CUDA_CHECK(cudaEventSynchronize(t1));
    float m = 0;
    MK_CUDA_CHECK(cudaEventElapsedTime(&m, t0, t1));
    ms.push_back(m);
  }
  cudaEventDestroy(t0), cudaEventDestroy(t1);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Relative-norm distance of two bf16 buffers over the listed rows (device -> host per row).
double rows_rel_error(const __nv_bfloat16* a, const __nv_bfloat16* b, const std::vector<int64_t>& rows, int64_t cols) {
  std::vector<ref::bf16> ha(static_cast<size_t>(cols)), hb(static_cast<size_t>(cols));
  double num = 0, den = 0;
  for (int64_t r : rows) {
    MK_CUDA_CHECK(cudaMemcpy(ha.data(), a + r * cols, size_t(cols) * 2, cudaMemcpyDeviceToHost));
    MK_CUDA_CHECK(cudaMemcpy(hb.data(), b + r * cols, size_t(cols) * 2, cudaMemcpyDeviceToHost));
    for (int64_t c = 0; c < cols; ++c) {
      const double x = ref::to_float(ha[size_t(c)]), y = ref::to_float(hb[size_t(c)]);
      num += (x - y) * (x - y), den += y * y;
    }
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string preset = argc > 1 ? argv[1] : "qwen3-30b-a3b";
  const int64_t T = argc > 2 ? std::atoll(argv[2]) : 4096;
  const int block_n = argc > 3 ? std::atoi(argv[3]) : 256;
  const int iters = argc > 4 ? std::atoi(argv[4]) : 20;
  MoeShape s{T, 2048, 768, 128, 8};
  if (preset == "mixtral-8x7b") s = {T, 4096, 14336, 8, 2};
  else if (preset == "deepseek-v3") s = {T, 7168, 2048, 256, 8};
  else if (preset != "qwen3-30b-a3b") return std::fprintf(stderr, "unknown preset %s\n", preset.c_str()), 2;

  const GemmConfig cfg{128, 128, 64, 2, 4, 3};  // the compiled mma.sync config with block_m 128
  const ForwardPlan plan = plan_forward_with(s, cfg, cfg);
  std::printf("sm90_gemm_bench: %s T=%lld (H=%lld F=%lld E=%lld k=%lld) block_n=%d iters=%d\n", preset.c_str(),
              (long long)T, (long long)s.hidden, (long long)s.inter, (long long)s.experts, (long long)s.topk, block_n,
              iters);

  cudaStream_t stream;
  MK_CUDA_CHECK(cudaStreamCreate(&stream));
  const int64_t TK = s.assignments();
  DevBuf x(size_t(T * s.hidden) * 2), w13(size_t(s.experts * 2 * s.inter * s.hidden) * 2),
      w2(size_t(s.experts * s.hidden * s.inter) * 2), ids(size_t(TK) * 4), weights(size_t(TK) * 4),
      ws_buf(workspace_bytes(plan)), act_ref(size_t(plan.max_rows * s.inter) * 2), y_ref(size_t(TK * s.hidden) * 2);
  fill(x.as<__nv_bfloat16>(), T * s.hidden, 1, 1.0f);
  fill(w13.as<__nv_bfloat16>(), s.experts * 2 * s.inter * s.hidden, 2, 1.0f / std::sqrt(float(s.hidden)));
  fill(w2.as<__nv_bfloat16>(), s.experts * s.hidden * s.inter, 3, 1.0f / std::sqrt(float(s.inter)));

  // Uniform routing: k distinct experts per token; weights in (0, 1].
  std::mt19937_64 rng(42);
  std::vector<int32_t> h_ids(static_cast<size_t>(TK));
  std::vector<float> h_w(static_cast<size_t>(TK));
  std::vector<int32_t> perm(static_cast<size_t>(s.experts));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < s.experts; ++e) perm[size_t(e)] = int32_t(e);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < s.topk; ++j) h_ids[size_t(t * s.topk + j)] = perm[size_t(j)], h_w[size_t(t * s.topk + j)] = 0.5f;
  }
  MK_CUDA_CHECK(cudaMemcpy(ids.ptr, h_ids.data(), h_ids.size() * 4, cudaMemcpyHostToDevice));
  MK_CUDA_CHECK(cudaMemcpy(weights.ptr, h_w.data(), h_w.size() * 4, cudaMemcpyHostToDevice));

  const Workspace ws = carve_workspace(plan, ws_buf.ptr, workspace_bytes(plan));
  const Tensor t_x(x.ptr, DType::bf16, {T, s.hidden}), t_w13(w13.ptr, DType::bf16, {s.experts, 2 * s.inter, s.hidden}),
      t_w2(w2.ptr, DType::bf16, {s.experts, s.hidden, s.inter}), t_w(weights.ptr, DType::f32, {T, s.topk});
  align(plan, Tensor(ids.ptr, DType::i32, {T, s.topk}), ws, stream);

  Params p{};
  p.sorted_ids = ws.sorted_ids.as<const int32_t>();
  p.block_expert = ws.block_expert.as<const int32_t>();
  p.num_rows_padded = ws.num_rows_padded.as<const int32_t>();
  p.tile_counter = ws.gemm_counter.as<int32_t>();
  p.num_assign = TK;
  p.topk = int(s.topk);
  Params up = p, down = p;
  up.a = x.as<const __nv_bfloat16>(), up.b = w13.as<const __nv_bfloat16>(), up.out = ws.act.as<__nv_bfloat16>();
  up.k_dim = s.hidden, up.n_dim = s.inter, up.b_expert_stride = 2 * s.inter * s.hidden;
  down.a = ws.act.as<const __nv_bfloat16>(), down.b = w2.as<const __nv_bfloat16>(), down.out = ws.y_rows.as<__nv_bfloat16>();
  down.topk_weights = weights.as<const float>();
  down.k_dim = s.inter, down.n_dim = s.hidden, down.b_expert_stride = s.hidden * s.inter;

  // ---- check: wgmma against mma.sync (same act input for both down GEMMs) --------------------
  expert_up(plan, t_x, t_w13, ws, stream);
  MK_CUDA_CHECK(cudaMemcpyAsync(act_ref.ptr, ws.act.data, size_t(plan.max_rows * s.inter) * 2, cudaMemcpyDeviceToDevice, stream));
  expert_down(plan, t_w2, t_w, ws, stream);
  MK_CUDA_CHECK(cudaMemcpyAsync(y_ref.ptr, ws.y_rows.data, size_t(TK * s.hidden) * 2, cudaMemcpyDeviceToDevice, stream));
  detail::launch_sm90_expert_gemm(Mode::Up, up, plan, stream, block_n);
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  const ref::Aligned al = ref::align(h_ids.data(), T, s.topk, s.experts, plan.block_m, plan.max_blocks);
  std::vector<int64_t> act_rows, y_rows;
  for (int32_t r = 0; r < al.num_rows_padded; r += std::max<int32_t>(1, al.num_rows_padded / 257))
    if (al.sorted_ids[size_t(r)] < TK) act_rows.push_back(r), y_rows.push_back(al.sorted_ids[size_t(r)]);
  const double up_err = rows_rel_error(ws.act.as<__nv_bfloat16>(), act_ref.as<__nv_bfloat16>(), act_rows, s.inter);
  MK_CUDA_CHECK(cudaMemcpy(ws.act.data, act_ref.ptr, size_t(plan.max_rows * s.inter) * 2, cudaMemcpyDeviceToDevice));
  detail::launch_sm90_expert_gemm(Mode::Down, down, plan, stream, block_n);
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  const double down_err = rows_rel_error(ws.y_rows.as<__nv_bfloat16>(), y_ref.as<__nv_bfloat16>(), y_rows, s.hidden);
  std::printf("check vs mma.sync over %zu rows: up rel err %.2e, down rel err %.2e\n", act_rows.size(), up_err, down_err);
  // Both round act/y to bf16 once from FP32 sums of different order: a few 2^-9 at most.
  if (!(up_err < 8.0 / 512 && down_err < 8.0 / 512)) {
    std::printf("CHECK FAILED: not timing\n");
    return 1;
  }

  // ---- time ------------------------------------------------------------------------------------
  const double up_flop = 2.0 * double(TK) * double(2 * s.inter) * double(s.hidden);
  const double down_flop = 2.0 * double(TK) * double(s.hidden) * double(s.inter);
  auto report = [&](const char* name, double ms, double flop) {
    std::printf("  %-22s %9.3f ms  %7.1f TFLOP/s\n", name, ms, flop / ms / 1e9);
  };
  const double mma_up = median_ms([&] { expert_up(plan, t_x, t_w13, ws, stream); }, iters, stream);
  const double mma_down = median_ms([&] { expert_down(plan, t_w2, t_w, ws, stream); }, iters, stream);
  const double wg_up = median_ms([&] { detail::launch_sm90_expert_gemm(Mode::Up, up, plan, stream, block_n); }, iters, stream);
  const double wg_down =
      median_ms([&] { detail::launch_sm90_expert_gemm(Mode::Down, down, plan, stream, block_n); }, iters, stream);

  // Dense ceiling: one large bf16 GEMM (fp32 accumulate) through cuBLAS, same run.
  const int64_t D = 8192;
  DevBuf da(size_t(D * D) * 2), db(size_t(D * D) * 2), dc(size_t(D * D) * 2);
  fill(da.as<__nv_bfloat16>(), D * D, 4, 1.0f), fill(db.as<__nv_bfloat16>(), D * D, 5, 1.0f);
  cublasHandle_t blas;
  BENCH_CUBLAS(cublasCreate(&blas));
  BENCH_CUBLAS(cublasSetStream(blas, stream));
  const float one = 1.0f, zero = 0.0f;
  const double dense = median_ms(
      [&] {
        BENCH_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(D), int(D), int(D), &one, da.ptr, CUDA_R_16BF, int(D),
                                  db.ptr, CUDA_R_16BF, int(D), &zero, dc.ptr, CUDA_R_16BF, int(D), CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
      },
      iters, stream);
  cublasDestroy(blas);
  const double dense_tflops = 2.0 * double(D) * D * D / dense / 1e9;

  std::printf("dense cuBLAS bf16 %lld^3: %.1f TFLOP/s\n", (long long)D, dense_tflops);
  report("mma.sync up", mma_up, up_flop);
  report("mma.sync down", mma_down, down_flop);
  report("wgmma up", wg_up, up_flop);
  report("wgmma down", wg_down, down_flop);
  const double mma_total = (up_flop + down_flop) / (mma_up + mma_down) / 1e9;
  const double wg_total = (up_flop + down_flop) / (wg_up + wg_down) / 1e9;
  std::printf("  up+down: mma.sync %.1f TFLOP/s (%.0f%% of dense), wgmma %.1f TFLOP/s (%.0f%% of dense)\n", mma_total,
              100 * mma_total / dense_tflops, wg_total, 100 * wg_total / dense_tflops);
  cudaStreamDestroy(stream);
  return 0;
}
