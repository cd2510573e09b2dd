// baselines.cu — the expert FFN through cuBLAS, timed in the same run as moekit's `experts` row
// (docs/design.md, "What the benchmarks report"). Both baselines compute, for every expert e with m_e > 0 rows,
//   gate_up = X_e · W13_eᵀ [m_e, 2F];  act = silu(gate) ⊙ up [m_e, F];  out = act · W2_eᵀ [m_e, H]
// on x rows gathered per expert into one contiguous buffer *outside* the timed region, with the
// per-expert row counts read on the host before timing (allowed for a baseline: moekit itself
// never syncs). Neither applies routing weights or combines: they time the expert GEMMs only.
//   cublas-loop:    per expert, cublasGemmEx (up) + a SwiGLU kernel + cublasGemmEx (down).
//   cublas-grouped: cublasGemmGroupedBatchedEx for all up GEMMs, one SwiGLU kernel over all rows,
//                   cublasGemmGroupedBatchedEx for all down GEMMs. cuBLAS 12.5+ documents this
//                   API for bf16 A/B/C with CUBLAS_COMPUTE_32F and fp32 alpha/beta (the CUDA 13
//                   toolkit here ships cuBLAS 13.1), so no cublasLt/equal-size-batch fallback is
//                   needed. A cuBLAS "group" is a set of problems of one shape, so experts with
//                   equal m_e share a group.
// Each baseline is checked against the oracle (first and last gathered row) before it is timed.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "baseline_kernels.cuh"
#include "bench.hpp"
#include "moekit/reference.hpp"
#include "tool_util.hpp"

namespace moekit::cli {

namespace {

// act[r, f] = silu(gate_up[r, f]) * gate_up[r, F + f]: w13 holds gate rows, then up rows.
__global__ void swiglu_kernel(const __nv_bfloat16* __restrict__ gate_up, __nv_bfloat16* __restrict__ act,
                              int64_t rows, int64_t F) {
  const int64_t n = rows * F, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / F, f = i % F;
    const float g = __bfloat162float(gate_up[r * 2 * F + f]), u = __bfloat162float(gate_up[r * 2 * F + F + f]);
    act[i] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
  }
}

// The routed rows in expert order, and the buffers both baselines share.
struct Problem {
  MoeShape s;
  std::vector<int32_t> expert, rows;  // touched experts (ascending) and their row counts m_e
  std::vector<int64_t> offset;        // first gathered row of each
  std::vector<int32_t> src_token;     // token of each gathered row
  DeviceBuffer xs, gate_up, act, out;  // [A, H], [A, 2F], [A, F], [A, H] bf16
};

Problem make_problem(const BaselineRequest& q) {
  Problem p;
  p.s = q.layer->spec().shape;
  p.s.tokens = q.tokens;
  const int64_t A = p.s.assignments(), H = p.s.hidden, F = p.s.inter, k = p.s.topk;
  std::vector<std::vector<int32_t>> by_expert(size_t(p.s.experts));
  for (int64_t a = 0; a < A; ++a) by_expert[size_t((*q.topk_ids)[size_t(a)])].push_back(int32_t(a / k));
  for (int64_t e = 0; e < p.s.experts; ++e) {
    if (by_expert[size_t(e)].empty()) continue;
    p.expert.push_back(int32_t(e));
    p.rows.push_back(int32_t(by_expert[size_t(e)].size()));
    p.offset.push_back(int64_t(p.src_token.size()));
    p.src_token.insert(p.src_token.end(), by_expert[size_t(e)].begin(), by_expert[size_t(e)].end());
  }
  DeviceBuffer src(A * 4);
  MK_CUDA_CHECK(cudaMemcpy(src.get(), p.src_token.data(), size_t(A) * 4, cudaMemcpyHostToDevice));
  p.xs = DeviceBuffer(A * H * 2);
  p.gate_up = DeviceBuffer(A * 2 * F * 2);
  p.act = DeviceBuffer(A * F * 2);
  p.out = DeviceBuffer(A * H * 2);
  gather_rows_kernel<<<blocks_for(A * H / 8), kThreads, 0, q.stream>>>(q.x.as<const uint4>(), src.as<const int32_t>(),
                                                                      p.xs.as<uint4>(), A, H / 8);
  MK_LAUNCH_CHECK("gather_rows_kernel");
  MK_CUDA_CHECK(cudaStreamSynchronize(q.stream));  // `src` is freed when we return
  return p;
}

const __nv_bfloat16* w13_of(const BaselineRequest& q, const Problem& p, int copy, int64_t e) {
  return q.layer->w13(copy).as<const __nv_bfloat16>() + e * 2 * p.s.inter * p.s.hidden;
}
const __nv_bfloat16* w2_of(const BaselineRequest& q, const Problem& p, int copy, int64_t e) {
  return q.layer->w2(copy).as<const __nv_bfloat16>() + e * p.s.hidden * p.s.inter;
}
template <class T> T* row(const DeviceBuffer& b, int64_t r, int64_t width) { return b.as<T>() + r * width; }

// Column-major view (cuBLAS): gate_up_eᵀ [2F, m] = W13_e [2F, H] (row-major = [H, 2F] col-major,
// hence OP_T) · X_eᵀ [H, m] (row-major X_e [m, H] is that, OP_N). Likewise for the down GEMM.
void loop_step(const BaselineRequest& q, const Problem& p, int copy) {
  const int64_t H = p.s.hidden, F = p.s.inter;
  const float one = 1.0f, zero = 0.0f;
  for (size_t i = 0; i < p.expert.size(); ++i) {
    const int m = p.rows[i];
    const int64_t r0 = p.offset[i];
    MK_CUBLAS_CHECK(cublasGemmEx(q.blas, CUBLAS_OP_T, CUBLAS_OP_N, int(2 * F), m, int(H), &one, w13_of(q, p, copy, p.expert[i]),
                                 CUDA_R_16BF, int(H), row<__nv_bfloat16>(p.xs, r0, H), CUDA_R_16BF, int(H), &zero,
                                 row<__nv_bfloat16>(p.gate_up, r0, 2 * F), CUDA_R_16BF, int(2 * F), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
    swiglu_kernel<<<blocks_for(m * F), kThreads, 0, q.stream>>>(row<const __nv_bfloat16>(p.gate_up, r0, 2 * F),
                                                                row<__nv_bfloat16>(p.act, r0, F), m, F);
    MK_LAUNCH_CHECK("swiglu_kernel");
    MK_CUBLAS_CHECK(cublasGemmEx(q.blas, CUBLAS_OP_T, CUBLAS_OP_N, int(H), m, int(F), &one, w2_of(q, p, copy, p.expert[i]),
                                 CUDA_R_16BF, int(F), row<__nv_bfloat16>(p.act, r0, F), CUDA_R_16BF, int(F), &zero,
                                 row<__nv_bfloat16>(p.out, r0, H), CUDA_R_16BF, int(H), CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
  }
}

// Host-side arguments of the grouped calls; the pointer arrays live on the device (per copy).
struct Grouped {
  std::vector<int> m_up, m_down, n, k_up, k_down, size;  // one entry per group (= distinct m_e)
  std::vector<cublasOperation_t> op_t, op_n;
  std::vector<float> alpha, beta;
  std::vector<DeviceBuffer> up_ptrs, down_ptrs;  // per copy: [A..., B..., C...] x problems
  int problems = 0;
};

Grouped make_grouped(const BaselineRequest& q, const Problem& p) {
  const int64_t H = p.s.hidden, F = p.s.inter;
  std::map<int, std::vector<size_t>> by_rows;  // m_e -> experts (indices into p.expert)
  for (size_t i = 0; i < p.expert.size(); ++i) by_rows[p.rows[i]].push_back(i);
  Grouped g;
  g.problems = int(p.expert.size());
  std::vector<size_t> order;
  for (const auto& [m, members] : by_rows) {
    g.n.push_back(m);
    g.size.push_back(int(members.size()));
    order.insert(order.end(), members.begin(), members.end());
  }
  const size_t G = g.n.size();
  g.m_up.assign(G, int(2 * F));
  g.k_up.assign(G, int(H));
  g.m_down.assign(G, int(H));
  g.k_down.assign(G, int(F));
  g.op_t.assign(G, CUBLAS_OP_T);
  g.op_n.assign(G, CUBLAS_OP_N);
  g.alpha.assign(G, 1.0f);  // host arrays: the handle keeps CUBLAS_POINTER_MODE_HOST
  g.beta.assign(G, 0.0f);
  for (int c = 0; c < q.copies; ++c) {
    std::vector<const void*> up(3 * order.size()), down(3 * order.size());
    for (size_t j = 0; j < order.size(); ++j) {
      const size_t i = order[j];
      const int64_t r0 = p.offset[i];
      up[j] = w13_of(q, p, c, p.expert[i]);
      up[order.size() + j] = row<const __nv_bfloat16>(p.xs, r0, H);
      up[2 * order.size() + j] = row<const __nv_bfloat16>(p.gate_up, r0, 2 * F);
      down[j] = w2_of(q, p, c, p.expert[i]);
      down[order.size() + j] = row<const __nv_bfloat16>(p.act, r0, F);
      down[2 * order.size() + j] = row<const __nv_bfloat16>(p.out, r0, H);
    }
    g.up_ptrs.emplace_back(int64_t(up.size() * sizeof(void*)));
    g.down_ptrs.emplace_back(int64_t(down.size() * sizeof(void*)));
    MK_CUDA_CHECK(cudaMemcpy(g.up_ptrs.back().get(), up.data(), up.size() * sizeof(void*), cudaMemcpyHostToDevice));
    MK_CUDA_CHECK(cudaMemcpy(g.down_ptrs.back().get(), down.data(), down.size() * sizeof(void*), cudaMemcpyHostToDevice));
  }
  return g;
}

void grouped_step(const BaselineRequest& q, const Problem& p, const Grouped& g, int copy) {
  const int64_t A = p.s.assignments(), F = p.s.inter;
  const int P = g.problems, G = int(g.n.size());
  const void* const* up = g.up_ptrs[size_t(copy)].as<const void* const>();
  const void* const* down = g.down_ptrs[size_t(copy)].as<const void* const>();
  MK_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(q.blas, g.op_t.data(), g.op_n.data(), g.m_up.data(), g.n.data(), g.k_up.data(),
                                             g.alpha.data(), up, CUDA_R_16BF, g.k_up.data(), up + P, CUDA_R_16BF,
                                             g.k_up.data(), g.beta.data(), const_cast<void* const*>(up + 2 * P),
                                             CUDA_R_16BF, g.m_up.data(), G, g.size.data(), CUBLAS_COMPUTE_32F));
  swiglu_kernel<<<blocks_for(A * F), kThreads, 0, q.stream>>>(p.gate_up.as<const __nv_bfloat16>(),
                                                              p.act.as<__nv_bfloat16>(), A, F);
  MK_LAUNCH_CHECK("swiglu_kernel");
  MK_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(q.blas, g.op_t.data(), g.op_n.data(), g.m_down.data(), g.n.data(),
                                             g.k_down.data(), g.alpha.data(), down, CUDA_R_16BF, g.k_down.data(),
                                             down + P, CUDA_R_16BF, g.k_down.data(), g.beta.data(),
                                             const_cast<void* const*>(down + 2 * P), CUDA_R_16BF, g.m_down.data(), G,
                                             g.size.data(), CUBLAS_COMPUTE_32F));
}

// act and out of the first and last gathered rows against the oracle (ref::expert_act in double;
// ref::expert_down_row on the baseline's own bf16 act row). Returns the worst relative error.
double check_rows(const BaselineRequest& q, const Problem& p) {
  MK_CUDA_CHECK(cudaStreamSynchronize(q.stream));
  const int64_t H = p.s.hidden, F = p.s.inter, A = p.s.assignments();
  double worst = 0;
  const std::pair<size_t, int64_t> checked[] = {{0, 0}, {p.expert.size() - 1, A - 1}};  // (expert index, row)
  for (const auto& [i, r] : checked) {
    const int64_t e = p.expert[i];
    std::vector<ref::bf16> x(static_cast<size_t>(H)), w13(size_t(2 * F * H)), w2(size_t(H * F)), act(static_cast<size_t>(F)), out(static_cast<size_t>(H));
    MK_CUDA_CHECK(cudaMemcpy(x.data(), row<ref::bf16>(p.xs, r, H), size_t(H) * 2, cudaMemcpyDeviceToHost));
    MK_CUDA_CHECK(cudaMemcpy(w13.data(), w13_of(q, p, 0, e), w13.size() * 2, cudaMemcpyDeviceToHost));
    MK_CUDA_CHECK(cudaMemcpy(w2.data(), w2_of(q, p, 0, e), w2.size() * 2, cudaMemcpyDeviceToHost));
    MK_CUDA_CHECK(cudaMemcpy(act.data(), row<ref::bf16>(p.act, r, F), size_t(F) * 2, cudaMemcpyDeviceToHost));
    MK_CUDA_CHECK(cudaMemcpy(out.data(), row<ref::bf16>(p.out, r, H), size_t(H) * 2, cudaMemcpyDeviceToHost));
    auto as_double = [](const std::vector<ref::bf16>& v) {
      std::vector<double> d(v.size());
      for (size_t j = 0; j < v.size(); ++j) d[j] = ref::to_float(v[j]);
      return d;
    };
    const double e_act = ref::rel_norm_error(as_double(act), ref::expert_act(x.data(), w13.data(), H, F));
    const double e_out = ref::rel_norm_error(as_double(out), ref::expert_down_row(act.data(), w2.data(), 1.0f, H, F));
    for (double err : {e_act, e_out}) worst = std::max(worst, std::isnan(err) ? INFINITY : err);
  }
  return worst;
}

// Poison, run once, check, then time.
BaselineResult run_one(const BaselineRequest& q, const Problem& p, const std::string& impl, const std::string& note,
                       const std::function<void(int)>& step) {
  BaselineResult r;
  r.impl = impl;
  r.note = note;
  try {
    MK_CUDA_CHECK(cudaMemsetAsync(p.act.get(), 0xff, size_t(p.act.bytes()), q.stream));
    MK_CUDA_CHECK(cudaMemsetAsync(p.out.get(), 0xff, size_t(p.out.bytes()), q.stream));
    step(0);
    r.check_err = check_rows(q, p);
    if (!(r.check_err <= kYRelTolerance)) {
      char b[160];
      std::snprintf(b, sizeof b, "%s failed its check: rel err %.3e > %.0e; not timed", impl.c_str(), r.check_err,
                    kYRelTolerance);
      r.error = b;
      return r;
    }
    r.ms = time_median_ms(q.stream, q.warmup, q.steps, [&](int i) { step(i % q.copies); });
    r.ok = true;
  } catch (const std::exception& e) {
    r.error = impl + ": " + e.what();
  }
  return r;
}

}  // namespace

std::vector<BaselineResult> run_baselines(const BaselineRequest& q) {
  std::vector<BaselineResult> results;
  if (q.tokens == 0) return results;
  const Problem p = make_problem(q);
  const std::string n_experts = std::to_string(p.expert.size());
  results.push_back(run_one(q, p, "cublas-loop",
                            "per expert: cublasGemmEx up + SwiGLU kernel + cublasGemmEx down (" + n_experts +
                                " experts, " + std::to_string(3 * p.expert.size()) +
                                " launches); no routing weights or combine; x gathered per expert untimed",
                            [&](int c) { loop_step(q, p, c); }));
  const Grouped g = make_grouped(q, p);
  results.push_back(run_one(q, p, "cublas-grouped",
                            "cublasGemmGroupedBatchedEx (bf16 A/B/C, CUBLAS_COMPUTE_32F) up and down, " +
                                std::to_string(g.n.size()) + " groups (one per distinct rows-per-expert) over " +
                                n_experts + " experts, + 1 SwiGLU kernel; no routing weights or combine",
                            [&](int c) { grouped_step(q, p, g, c); }));
  return results;
}

}  // namespace moekit::cli
