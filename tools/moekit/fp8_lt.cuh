// fp8_lt.cuh — the cuBLASLt side of fp8_blas.hpp: one FP8 GEMM configuration (descriptor,
// layouts, the heuristic's algorithms) with every status checked, CublasLt, and the FP8 ceiling.
// Included by fp8_blas.cu only (as layer.cuh by bench.cu), so each symbol is defined once.
#pragma once

#include <cublasLt.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fp8_blas.hpp"
#include "rng.hpp"
#include "tool_util.hpp"

namespace moekit::cli {

namespace {

constexpr int kLtThreads = 256;
unsigned lt_blocks(int64_t n) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((n + kLtThreads - 1) / kLtThreads, 65535)));
}

// Throws CudaError naming the call and what it was for.
void lt_check(cublasStatus_t st, const std::string& what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw CudaError(std::string("cuBLASLt ") + what + ": " + cublasGetStatusName(st) + " (" + cublasGetStatusString(st) +
                    ")");
}

// The largest power of two (up to 256) dividing the address: what the heuristic may assume.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return a == 0 ? 256u : uint32_t(std::min<uintptr_t>(256, a & (~a + 1)));
}

const char* scale_mode_name(int32_t mode) {
  switch (mode) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: return "SCALAR_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: return "VEC128_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: return "BLK128x128_32F";
    default: return "another scale mode";
  }
}

// D [m, n] (column-major, leading dimension ldd) = op(A) · B with op(A) = Aᵀ: A e4m3 column-major
// [k, m] (lda = k), B e4m3 column-major [k, n] (ldb = k), D bf16; FP32 compute, alpha 1, beta 0.
// The scale pointers are set on the descriptor at each run() (they differ per expert).
class Fp8Gemm {
 public:
  struct Shape {
    int64_t m = 0, n = 0, k = 0, ldd = 0;
    int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    bool fast_accum = false;
    uint32_t align_a = 16, align_b = 16, align_d = 16;  // the least alignment of any pointer passed
  };

  // Queries the heuristic for up to max_algos algorithms that fit the workspace; algos() == 0 and
  // why() says so when it has none. a_scale/b_scale: representative pointers (the heuristic does
  // not read them).
  Fp8Gemm(const CublasLt& lt, const Shape& s, const float* a_scale, const float* b_scale, int max_algos) : s_(s) {
    const std::string dims = "m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                             ", scales A " + scale_mode_name(s.a_mode) + " B " + scale_mode_name(s.b_mode);
    lt_check(cublasLtMatmulDescCreate(&h_.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    set(CUBLASLT_MATMUL_DESC_TRANSA, op_t, "TRANSA");
    set(CUBLASLT_MATMUL_DESC_TRANSB, op_n, "TRANSB");
    set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, s.a_mode, "A_SCALE_MODE");
    set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, s.b_mode, "B_SCALE_MODE");
    const int8_t fast = s.fast_accum ? 1 : 0;
    set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast, "FAST_ACCUM");
    set_scales(a_scale, b_scale);
    lt_check(cublasLtMatrixLayoutCreate(&h_.a, CUDA_R_8F_E4M3, uint64_t(s.k), uint64_t(s.m), s.k), "layout A (" + dims + ")");
    lt_check(cublasLtMatrixLayoutCreate(&h_.b, CUDA_R_8F_E4M3, uint64_t(s.k), uint64_t(s.n), s.k), "layout B (" + dims + ")");
    lt_check(cublasLtMatrixLayoutCreate(&h_.d, CUDA_R_16BF, uint64_t(s.m), uint64_t(s.n), s.ldd), "layout D (" + dims + ")");

    cublasLtMatmulPreference_t pref = nullptr;
    lt_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    struct Destroy {
      cublasLtMatmulPreference_t p;
      ~Destroy() { cublasLtMatmulPreferenceDestroy(p); }
    } destroy{pref};
    const uint64_t ws = lt.workspace_bytes();
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
             "preference MAX_WORKSPACE_BYTES");
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const uint32_t align[4] = {s.align_a, s.align_b, s.align_d, s.align_d};  // C is D (beta = 0)
    for (int i = 0; i < 4; ++i)
      lt_check(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &align[i], sizeof align[i]),
               "preference MIN_ALIGNMENT");

    // A plain array: nvcc 13's front end fails on std::vector of cuBLASLt's anonymous structs.
    const int want = std::max(max_algos, 1);
    const std::unique_ptr<cublasLtMatmulHeuristicResult_t[]> res(new cublasLtMatmulHeuristicResult_t[size_t(want)]());
    int got = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt.get(), h_.desc, h_.a, h_.b, h_.d, h_.d, pref, want, res.get(), &got);
    if (st != CUBLAS_STATUS_SUCCESS) {  // NOT_SUPPORTED: no algorithm for this configuration
      why_ = "cublasLtMatmulAlgoGetHeuristic (" + dims + "): " + cublasGetStatusName(st) + " (" +
             cublasGetStatusString(st) + ")";
      return;
    }
    for (int i = 0; i < got; ++i)
      if (res[size_t(i)].state == CUBLAS_STATUS_SUCCESS && res[size_t(i)].workspaceSize <= ws)
        algos_.push_back(Algo{res[size_t(i)].algo});
    if (algos_.empty())
      why_ = "cuBLASLt has no algorithm for " + dims + ": the heuristic returned " + std::to_string(got) +
             " results, none usable";
  }
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;

  int algos() const { return int(algos_.size()); }
  const std::string& why() const { return why_; }
  const Shape& shape() const { return s_; }
  void choose(int i) { chosen_ = i; }

  void run(const CublasLt& lt, const void* a, const float* a_scale, const void* b, const float* b_scale, void* d,
           cudaStream_t stream) const {
    set_scales(a_scale, b_scale);
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t st = cublasLtMatmul(lt.get(), h_.desc, &alpha, a, h_.a, b, h_.b, &beta, d, h_.d, d, h_.d,
                                             &algos_.at(size_t(chosen_)).algo, lt.workspace(), lt.workspace_bytes(),
                                             stream);
    if (st != CUBLAS_STATUS_SUCCESS)  // the message is built only on failure: run() is on the timed path
      lt_check(st, "cublasLtMatmul (m=" + std::to_string(s_.m) + " n=" + std::to_string(s_.n) + " k=" +
                       std::to_string(s_.k) + ", algorithm #" + std::to_string(chosen_) + ")");
  }

 private:
  template <class T> void set(cublasLtMatmulDescAttributes_t attr, const T& v, const char* name) const {
    const cublasStatus_t st = cublasLtMatmulDescSetAttribute(h_.desc, attr, &v, sizeof v);
    if (st != CUBLAS_STATUS_SUCCESS) lt_check(st, std::string("descriptor attribute ") + name);
  }
  void set_scales(const float* a_scale, const float* b_scale) const {
    const void* a = a_scale;
    const void* b = b_scale;
    set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a, "A_SCALE_POINTER");
    set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b, "B_SCALE_POINTER");
  }

  // Destroyed also when the constructor throws part-way (a member, not the object, owns them).
  struct Handles {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    ~Handles() {
      if (a) cublasLtMatrixLayoutDestroy(a);
      if (b) cublasLtMatrixLayoutDestroy(b);
      if (d) cublasLtMatrixLayoutDestroy(d);
      if (desc) cublasLtMatmulDescDestroy(desc);
    }
  };
  Shape s_;
  Handles h_;
  struct Algo {  // named: see the heuristic's results above
    cublasLtMatmulAlgo_t algo;
  };
  std::vector<Algo> algos_;
  int chosen_ = 0;
  std::string why_;
};

}  // namespace

CublasLt::CublasLt() {
  MK_CUBLAS_CHECK(cublasLtCreate(&h_));
  ws_ = DeviceBuffer(kWorkspaceBytes);  // cudaMalloc: 256-byte aligned, as cublasLtMatmul needs
}
CublasLt::~CublasLt() {
  if (h_) cublasLtDestroy(h_);
}

namespace {

__global__ void fill_e4m3_kernel(uint8_t* __restrict__ out, int64_t n, uint64_t seed, uint64_t stream) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __nv_cvt_float_to_fp8(hash_normal(seed, stream, uint64_t(i)), __NV_SATFINITE, __NV_E4M3);
}

}  // namespace

Fp8Ceiling measure_fp8_gemm(const CublasLt& lt, int64_t m, int64_t n, int64_t k, cudaStream_t stream, int warmup,
                            int steps, uint64_t seed, bool fast_accum) {
  Fp8Ceiling c;
  c.m = m;
  c.n = n;
  c.k = k;
  c.fast_accum = fast_accum;
  try {
    if (m <= 0 || n <= 0 || k <= 0 || m % 16 || n % 16 || k % 16)
      throw Error("measure_fp8_gemm: m, n and k must be positive multiples of 16, got " + std::to_string(m) + ", " +
                  std::to_string(n) + ", " + std::to_string(k));
    DeviceBuffer a(m * k), b(n * k), out(m * n * 2), scales(16);
    fill_e4m3_kernel<<<lt_blocks(m * k), kLtThreads, 0, stream>>>(a.as<uint8_t>(), m * k, seed, kStreamCeiling + 200);
    MK_LAUNCH_CHECK("fill_e4m3_kernel");
    fill_e4m3_kernel<<<lt_blocks(n * k), kLtThreads, 0, stream>>>(b.as<uint8_t>(), n * k, seed, kStreamCeiling + 201);
    MK_LAUNCH_CHECK("fill_e4m3_kernel");
    const float ones[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    MK_CUDA_CHECK(cudaMemcpyAsync(scales.get(), ones, sizeof ones, cudaMemcpyHostToDevice, stream));
    const float* one = scales.as<const float>();
    // cuBLASLt's m is our n (b holds the output features, A = b); its n is our m.
    Fp8Gemm::Shape sh;
    sh.m = n;
    sh.n = m;
    sh.k = k;
    sh.ldd = n;
    sh.a_mode = sh.b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    sh.fast_accum = fast_accum;
    sh.align_a = sh.align_b = sh.align_d = 256;  // whole cudaMalloc'ed buffers
    Fp8Gemm g(lt, sh, one, one, kFp8CeilingAlgos);
    if (g.algos() == 0) {
      c.error = "FP8 ceiling " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + ": " + g.why();
      return c;
    }
    auto call = [&] { g.run(lt, b.get(), one, a.get(), one, out.get(), stream); };
    int best = 0;
    double best_ms = INFINITY;
    std::string skipped;
    bool warm = false;
    for (int i = 0; i < g.algos(); ++i) {
      g.choose(i);
      try {
        if (!warm) {  // clocks ramp on the first algorithm that runs, before any is compared
          for (int r = 0; r < std::max(warmup, kFp8CeilingWarmup); ++r) call();
          warm = true;
        }
        const double ms = time_median_ms(stream, 3, 10, [&](int) { call(); });
        if (ms < best_ms) best_ms = ms, best = i;
      } catch (const CudaError& e) {  // a cuBLASLt status: this algorithm is out, the others stay
        skipped += std::string(skipped.empty() ? "" : "; ") + "#" + std::to_string(i) + ": " + e.what();
      }
    }
    if (!std::isfinite(best_ms)) {
      c.error = "FP8 ceiling: every algorithm failed: " + skipped;
      return c;
    }
    g.choose(best);
    c.ms = time_median_ms(stream, 3, steps, [&](int) { call(); });
    c.TFLOPs = 2.0 * double(m) * double(n) * double(k) / (c.ms * 1e-3) / 1e12;
    c.note = "cuBLASLt e4m3 x e4m3 -> bf16, per-tensor FP32 scales, CUBLAS_COMPUTE_32F, TN" +
             std::string(fast_accum ? ", fast accumulation" : "") + "; fastest of the heuristic's first " +
             std::to_string(g.algos()) + " algorithms (#" + std::to_string(best) + ")" +
             (skipped.empty() ? "" : "; failed: " + skipped);
    c.ok = true;
  } catch (const std::exception& e) {
    c.error = std::string("FP8 ceiling: ") + e.what();
  }
  return c;
}

Fp8Ceiling measure_fp8_ceiling(const CublasLt& lt, cudaStream_t stream, int warmup, int steps, uint64_t seed) {
  return measure_fp8_gemm(lt, kFp8CeilingDim, kFp8CeilingDim, kFp8CeilingDim, stream, warmup, steps, seed);
}

}  // namespace moekit::cli
