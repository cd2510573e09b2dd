// backward_baseline.cu — the backward's GEMMs through cuBLAS, timed in the same run as moekit's
// `backward` rows (docs/design.md, "What the benchmarks report"). For every touched expert e with
// m_e rows — its assignments' x and dy rows gathered into expert order once, untimed, as
// baselines.cu gathers x for the forward — five cublasGemmEx (bf16 operands and outputs, FP32
// accumulation), the backward's GEMMs as moekit's row runs them (h recomputed):
//   h = x_e·W13_eᵀ [m, 2F];  D = dy_e·W2_e [m, F];  dx_rows = dh·W13_e [m, H];
//   dW2_e = dy_eᵀ·act_w [H, F]  (act_w = w·act, so this is (w·dy)ᵀ·act);  dW13_e = dhᵀ·x_e [2F, H].
// The elementwise parts are not timed: SwiGLU's backward (dh and act_w from h, D and w: a kernel
// here runs it once in setup, so the timed GEMMs read the values a backward would), d_topk_weights,
// the router's gradient and dx's sum over the k slots. So the row is a lower bound of a per-expert
// library backward. It is checked (first and last gathered rows, and two rows of each of the first
// expert's dW) before it is timed, with the expert counts read on the host (allowed for a
// baseline: moekit itself never syncs).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "baseline_kernels.cuh"
#include "bench_backward.hpp"
#include "moekit/reference.hpp"
#include "tool_util.hpp"

namespace moekit::cli {

namespace {

using ref::bf16;

// Each value the check compares is one bf16 rounding of an FP32 sum of exact products of the same
// bf16 operands the double reference reads (≈ 0.43u RMS relative); 4u, the GPU tests' bound of
// the backward's outputs (bench_backward.hpp), leaves ~9x.
constexpr double kBaselineTol = 4 * kBwdUnitRoundoff;

// SwiGLU's backward of the gathered rows: from h = g|u [rows, 2F], D [rows, F] and the routing
// weight w of each row, dh = (w·D·u·silu'(g)) | (w·D·silu(g)) [rows, 2F] and act_w = w·silu(g)·u.
__global__ void swiglu_backward_kernel(const __nv_bfloat16* __restrict__ h, const __nv_bfloat16* __restrict__ d,
                                       const float* __restrict__ w, __nv_bfloat16* __restrict__ dh,
                                       __nv_bfloat16* __restrict__ act_w, int64_t rows, int64_t F) {
  const int64_t n = rows * F, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / F, f = i % F;
    const float g = __bfloat162float(h[r * 2 * F + f]), u = __bfloat162float(h[r * 2 * F + F + f]);
    const float sig = 1.0f / (1.0f + expf(-g)), silu = g * sig, dact = w[r] * __bfloat162float(d[i]);
    dh[r * 2 * F + f] = __float2bfloat16_rn(dact * u * sig * (1.0f + g * (1.0f - sig)));
    dh[r * 2 * F + F + f] = __float2bfloat16_rn(dact * silu);
    act_w[i] = __float2bfloat16_rn(w[r] * silu * u);
  }
}

// The routed rows in expert order, and the baseline's buffers.
struct Problem {
  MoeShape s;
  std::vector<int32_t> expert, rows;  // touched experts (ascending) and their row counts m_e
  std::vector<int64_t> offset;        // first gathered row of each
  DeviceBuffer xs, dys, h, d, dh, act_w, dx_rows;  // [A, H], [A, H], [A, 2F], [A, F], [A, 2F], [A, F], [A, H] bf16
  DeviceBuffer weight;                             // [A] f32: the routing weight of each gathered row
};

Problem make_problem(const BackwardBaselineRequest& q) {
  Problem p;
  p.s = q.layer->spec().shape;
  p.s.tokens = q.tokens;
  const int64_t A = p.s.assignments(), H = p.s.hidden, F = p.s.inter, k = p.s.topk;
  std::vector<std::vector<int32_t>> by_expert(size_t(p.s.experts));  // assignments of each expert, ascending
  for (int64_t a = 0; a < A; ++a) by_expert[size_t((*q.topk_ids)[size_t(a)])].push_back(int32_t(a));
  std::vector<int32_t> src_token;
  std::vector<float> weight;
  for (int64_t e = 0; e < p.s.experts; ++e) {
    if (by_expert[size_t(e)].empty()) continue;
    p.expert.push_back(int32_t(e));
    p.rows.push_back(int32_t(by_expert[size_t(e)].size()));
    p.offset.push_back(int64_t(src_token.size()));
    for (int32_t a : by_expert[size_t(e)]) {
      src_token.push_back(int32_t(a / k));
      weight.push_back((*q.topk_weights)[size_t(a)]);
    }
  }
  DeviceBuffer src(A * 4);
  MK_CUDA_CHECK(cudaMemcpy(src.get(), src_token.data(), size_t(A) * 4, cudaMemcpyHostToDevice));
  p.weight = DeviceBuffer(A * 4);
  MK_CUDA_CHECK(cudaMemcpy(p.weight.get(), weight.data(), size_t(A) * 4, cudaMemcpyHostToDevice));
  p.xs = DeviceBuffer(A * H * 2);
  p.dys = DeviceBuffer(A * H * 2);
  p.h = DeviceBuffer(A * 2 * F * 2);
  p.d = DeviceBuffer(A * F * 2);
  p.dh = DeviceBuffer(A * 2 * F * 2);
  p.act_w = DeviceBuffer(A * F * 2);
  p.dx_rows = DeviceBuffer(A * H * 2);
  for (const auto& [from, to] : {std::pair{&q.x, &p.xs}, std::pair{&q.dy, &p.dys}}) {
    gather_rows_kernel<<<blocks_for(A * H / 8), kThreads, 0, q.stream>>>(
        from->as<const uint4>(), src.as<const int32_t>(), to->as<uint4>(), A, H / 8);
    MK_LAUNCH_CHECK("gather_rows_kernel");
  }
  MK_CUDA_CHECK(cudaStreamSynchronize(q.stream));  // `src` is freed when we return
  return p;
}

template <class T> T* row(const DeviceBuffer& b, int64_t r, int64_t width) { return b.as<T>() + r * width; }
const bf16* w13_of(const BackwardBaselineRequest& q, const MoeShape& s, int copy, int64_t e) {
  return q.layer->w13(copy).as<const bf16>() + e * 2 * s.inter * s.hidden;
}
const bf16* w2_of(const BackwardBaselineRequest& q, const MoeShape& s, int copy, int64_t e) {
  return q.layer->w2(copy).as<const bf16>() + e * s.hidden * s.inter;
}

// C (column-major [m, n], ldc) = op(A)·op(B), bf16 in and out, FP32 accumulation.
void gemm(cublasHandle_t blas, cublasOperation_t op_a, cublasOperation_t op_b, int64_t m, int64_t n, int64_t k,
          const void* a, int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc) {
  const float one = 1.0f, zero = 0.0f;
  MK_CUBLAS_CHECK(cublasGemmEx(blas, op_a, op_b, int(m), int(n), int(k), &one, a, CUDA_R_16BF, int(lda), b,
                               CUDA_R_16BF, int(ldb), &zero, c, CUDA_R_16BF, int(ldc), CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
}

// Column-major views (cuBLAS) of row-major tensors: a row-major [r, c] matrix is a column-major
// [c, r] one, its transpose. So each GEMM below computes the transpose of its row-major result.
// h and D of expert i: hᵀ [2F, m] = W13_e [2F, H] (col-major [H, 2F]: OP_T) · x_eᵀ [H, m];
// Dᵀ [F, m] = W2_eᵀ [F, H] (row-major [H, F] is col-major [F, H]: OP_N) · dy_eᵀ [H, m].
void h_and_d(const BackwardBaselineRequest& q, const Problem& p, int copy, size_t i) {
  const int64_t H = p.s.hidden, F = p.s.inter, m = p.rows[i], r0 = p.offset[i], e = p.expert[i];
  gemm(q.blas, CUBLAS_OP_T, CUBLAS_OP_N, 2 * F, m, H, w13_of(q, p.s, copy, e), H, row<bf16>(p.xs, r0, H), H,
       row<bf16>(p.h, r0, 2 * F), 2 * F);
  gemm(q.blas, CUBLAS_OP_N, CUBLAS_OP_N, F, m, H, w2_of(q, p.s, copy, e), F, row<bf16>(p.dys, r0, H), H,
       row<bf16>(p.d, r0, F), F);
}

// The gradients' GEMMs of expert i: dx_rowsᵀ [H, m] = W13_eᵀ [H, 2F] · dhᵀ [2F, m];
// dW2ᵀ [F, H] = act_wᵀ [F, m] · dy_e [m, H]; dW13ᵀ [H, 2F] = x_eᵀ [H, m] · dh [m, 2F].
void grad_gemms(const BackwardBaselineRequest& q, const Problem& p, int copy, size_t i) {
  const int64_t H = p.s.hidden, F = p.s.inter, m = p.rows[i], r0 = p.offset[i], e = p.expert[i];
  gemm(q.blas, CUBLAS_OP_N, CUBLAS_OP_N, H, m, 2 * F, w13_of(q, p.s, copy, e), H, row<bf16>(p.dh, r0, 2 * F), 2 * F,
       row<bf16>(p.dx_rows, r0, H), H);
  gemm(q.blas, CUBLAS_OP_N, CUBLAS_OP_T, F, H, m, row<bf16>(p.act_w, r0, F), F, row<bf16>(p.dys, r0, H), H,
       q.dw2.as<bf16>() + e * H * F, F);
  gemm(q.blas, CUBLAS_OP_N, CUBLAS_OP_T, H, 2 * F, m, row<bf16>(p.xs, r0, H), H, row<bf16>(p.dh, r0, 2 * F), 2 * F,
       q.dw13.as<bf16>() + e * 2 * F * H, H);
}

std::vector<double> as_double(const std::vector<bf16>& v) {
  std::vector<double> d(v.size());
  for (size_t j = 0; j < v.size(); ++j) d[j] = ref::to_float(v[j]);
  return d;
}

// The worst relative norm error of: h, D, dh, act_w and dx_rows of the first and last gathered
// rows, against double sums over the baseline's own bf16 operands (dh and act_w from its h and D),
// and rows 0 and last of the first expert's dW13 and dW2 (sums over its m rows).
double check_baseline(const BackwardBaselineRequest& q, const Problem& p) {
  MK_CUDA_CHECK(cudaStreamSynchronize(q.stream));
  const int64_t H = p.s.hidden, F = p.s.inter, A = p.s.assignments();
  double worst = 0;
  auto note = [&](const std::vector<bf16>& got, const std::vector<double>& want) {
    const double err = ref::rel_norm_error(as_double(got), want);
    worst = std::max(worst, std::isnan(err) ? INFINITY : err);
  };
  const std::pair<size_t, int64_t> checked[] = {{0, 0}, {p.expert.size() - 1, A - 1}};  // (expert index, row)
  for (const auto& [i, r] : checked) {
    const int64_t e = p.expert[i];
    const auto w13 = copy_to_host<bf16>(w13_of(q, p.s, 0, e), 2 * F * H);
    const auto w2 = copy_to_host<bf16>(w2_of(q, p.s, 0, e), H * F);
    const auto x = copy_to_host<bf16>(row<bf16>(p.xs, r, H), H), dy = copy_to_host<bf16>(row<bf16>(p.dys, r, H), H);
    const auto h = copy_to_host<bf16>(row<bf16>(p.h, r, 2 * F), 2 * F), d = copy_to_host<bf16>(row<bf16>(p.d, r, F), F);
    const auto dh = copy_to_host<bf16>(row<bf16>(p.dh, r, 2 * F), 2 * F);
    const auto act_w = copy_to_host<bf16>(row<bf16>(p.act_w, r, F), F);
    const auto dx = copy_to_host<bf16>(row<bf16>(p.dx_rows, r, H), H);
    const double w = copy_to_host<float>(row<float>(p.weight, r, 1), 1)[0];
    std::vector<double> h_want(size_t(2 * F), 0.0), d_want(size_t(F), 0.0), dh_want(size_t(2 * F), 0.0),
        act_want(size_t(F), 0.0), dx_want(size_t(H), 0.0);
    auto v = [](const std::vector<bf16>& b, int64_t i) { return double(ref::to_float(b[size_t(i)])); };
    for (int64_t n = 0; n < 2 * F; ++n)
      for (int64_t c = 0; c < H; ++c) h_want[size_t(n)] += v(x, c) * v(w13, n * H + c);
    for (int64_t f = 0; f < F; ++f)
      for (int64_t c = 0; c < H; ++c) d_want[size_t(f)] += v(dy, c) * v(w2, c * F + f);
    for (int64_t f = 0; f < F; ++f) {
      const double g = v(h, f), u = v(h, F + f);
      const double sig = 1.0 / (1.0 + std::exp(-g)), dact = w * v(d, f);
      dh_want[size_t(f)] = dact * u * sig * (1.0 + g * (1.0 - sig));
      dh_want[size_t(F + f)] = dact * g * sig;
      act_want[size_t(f)] = w * g * sig * u;
    }
    for (int64_t n = 0; n < 2 * F; ++n)
      for (int64_t c = 0; c < H; ++c) dx_want[size_t(c)] += v(dh, n) * v(w13, n * H + c);
    note(h, h_want), note(d, d_want), note(dh, dh_want), note(act_w, act_want), note(dx, dx_want);
  }
  // dW of the first expert: rows 0 and 2F-1 of dW13 (Σ_r dh[r, n]·x[r, :]), rows 0 and H-1 of dW2
  // (Σ_r dy[r, c]·act_w[r, :]).
  const int64_t e = p.expert[0], m = p.rows[0];
  const auto xs = copy_to_host<bf16>(p.xs.get(), m * H), dys = copy_to_host<bf16>(p.dys.get(), m * H);
  const auto dh = copy_to_host<bf16>(p.dh.get(), m * 2 * F), act_w = copy_to_host<bf16>(p.act_w.get(), m * F);
  for (int64_t n : {int64_t(0), 2 * F - 1}) {
    std::vector<double> want(size_t(H), 0.0);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < H; ++c)
        want[size_t(c)] += double(ref::to_float(dh[size_t(r * 2 * F + n)])) * ref::to_float(xs[size_t(r * H + c)]);
    note(copy_to_host<bf16>(q.dw13.as<const bf16>() + (e * 2 * F + n) * H, H), want);
  }
  for (int64_t c : {int64_t(0), H - 1}) {
    std::vector<double> want(size_t(F), 0.0);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t f = 0; f < F; ++f)
        want[size_t(f)] += double(ref::to_float(dys[size_t(r * H + c)])) * ref::to_float(act_w[size_t(r * F + f)]);
    note(copy_to_host<bf16>(q.dw2.as<const bf16>() + (e * H + c) * F, F), want);
  }
  return worst;
}

}  // namespace

int64_t backward_baseline_bytes(const MoeShape& s) {
  const int64_t A = s.assignments();
  return A * (3 * s.hidden + 6 * s.inter) * 2 + A * 8;  // the bf16 buffers of Problem, its weights and row ids
}

BaselineResult run_backward_baseline(const BackwardBaselineRequest& q) {
  BaselineResult r;
  r.impl = "cublas-loop";
  if (q.tokens == 0) {
    r.error = "cublas-loop: no tokens";
    return r;
  }
  try {
    const Problem p = make_problem(q);
    const size_t n = p.expert.size();
    r.note = "per touched expert: 5 cublasGemmEx, bf16 in and out, FP32 accumulate (h recomputed, D, dx_rows, dW2, "
             "dW13; " + std::to_string(n) + " experts, " + std::to_string(5 * n) +
             " launches); not timed: SwiGLU's backward (dh, act_w: once in setup), d_topk_weights, the router's "
             "gradient and dx's sum over slots, and the x and dy rows gathered per expert: a lower bound of a "
             "per-expert library backward";
    // Poisoned (0xffff: bf16 NaN), then the setup run: h and D, SwiGLU's backward, the gradients.
    for (const DeviceBuffer* b : {&p.h, &p.d, &p.dh, &p.act_w, &p.dx_rows})
      MK_CUDA_CHECK(cudaMemsetAsync(b->get(), 0xff, size_t(b->bytes()), q.stream));
    MK_CUDA_CHECK(cudaMemsetAsync(q.dw13.data, 0xff, size_t(q.dw13.bytes()), q.stream));
    MK_CUDA_CHECK(cudaMemsetAsync(q.dw2.data, 0xff, size_t(q.dw2.bytes()), q.stream));
    for (size_t i = 0; i < n; ++i) h_and_d(q, p, 0, i);
    const int64_t A = p.s.assignments(), F = p.s.inter;
    swiglu_backward_kernel<<<blocks_for(A * F), kThreads, 0, q.stream>>>(
        p.h.as<const __nv_bfloat16>(), p.d.as<const __nv_bfloat16>(), p.weight.as<const float>(),
        p.dh.as<__nv_bfloat16>(), p.act_w.as<__nv_bfloat16>(), A, F);
    MK_LAUNCH_CHECK("swiglu_backward_kernel");
    for (size_t i = 0; i < n; ++i) grad_gemms(q, p, 0, i);
    r.check_err = check_baseline(q, p);
    if (!(r.check_err <= kBaselineTol)) {
      char b[160];
      std::snprintf(b, sizeof b, "cublas-loop (backward) failed its check: rel err %.3e > %.2e; not timed", r.check_err,
                    kBaselineTol);
      r.error = b;
      return r;
    }
    r.ms = time_median_ms(q.stream, q.warmup, q.steps, [&](int s) {
      for (size_t i = 0; i < n; ++i) {
        h_and_d(q, p, s % q.copies, i);
        grad_gemms(q, p, s % q.copies, i);
      }
    });
    r.ok = true;
  } catch (const std::exception& e) {
    r.error = "cublas-loop (backward): " + std::string(e.what());
  }
  return r;
}

}  // namespace moekit::cli
