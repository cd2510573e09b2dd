// fp8_blas.cu — the cuBLASLt FP8 expert-FFN baseline and, compiled in from fp8_lt.cuh, the FP8
// ceiling (fp8_blas.hpp).
//
// What cuBLASLt offers for DeepSeek-V3's format on Hopper. The cuBLAS documentation, section 3.1.4
// ("Narrow Precision Data Types Usage"), "Scaling Mode Support Overview": "128-element 1D block
// scaling | 9.0 | CUDA_R_8F_E4M3 / CUDA_R_8F_E5M2 | CUDA_R_32F | Tensor" and "128x128-element 2D
// block scaling | 9.0 | ... | CUDA_R_32F | Tensor" (tensorwide scaling: 8.9+; the 32- and
// 16-element MX modes: 10.0+). Section 3.1.4.5, "128-element 1D and 128x128 2D Block Scaling For
// FP8 Data Types", applies block scaling "to the Hopper GPU architecture. However, here the
// scaling data type is CUDA_R_32F, and different scaling modes can be used for A and B, and the
// only supported precisions for D are CUDA_R_16F, CUDA_R_16BF, and CUDA_R_32F"; of the (A, B)
// modes, VEC128 x VEC128, VEC128 x BLK128x128 and BLK128x128 x VEC128 are "Yes", BLK128x128 x
// BLK128x128 "No". Layouts (3.1.4.5.1): "Starting addresses of scaling factors must be 16B
// aligned", "M and N must be multiples of 4"; VEC128_32F scales are "M-major for A with shape
// M x L" and "N-major for B with shape N x L" (L = ceil(K/128)); BLK128x128_32F scales "are
// K-major and the stride between the consecutive columns must be a multiple of 4", shape
// L4 x ceil(M/128) for A (L4: L rounded up to a multiple of 4). cublasLtMatmul() needs for FP8
// "A must be transposed and B non-transposed (The "TN" format) on ... Hopper (compute capability
// 9.0)", CUBLAS_COMPUTE_32F, scale type CUDA_R_32F, 16-byte aligned pointers and dimensions.
// cublasLt.h here (cuBLAS 13.1) declares CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F = 4 ("a dedicated
// CUDA_R_32F scaling factor for each 128-element block in the innermost dimension") and
// CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F = 5 ("for each 128x128-element block"). So the
// baseline runs DeepSeek-V3's scales as they are, no per-tensor requantization.
//
// The GEMMs in cuBLASLt's column-major terms, D [m, n] = op(A) [m, k] · B [k, n] (TN):
//   A = the weight matrix, row-major [m = output features, k] (= column-major [k, m], op T), its
//       scales BLK128x128: [ceil(m/128)][L4] — the checkpoint's rows with L padded to L4;
//   B = an expert's gathered token rows, row-major [n, k], scales VEC128: [L][n] (token rows
//       contiguous) — x_scale transposed per expert, n padded to a multiple of 4;
//   D = row-major [n, ldd] bf16: the token rows' outputs, as the bf16 baselines lay them out.
// When F % 128 != 0 the up projection's blocks do not start at a multiple of 128 rows (gate's
// last block is partial), so gate and up are two GEMMs into one gate_up row.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench.hpp"
#include "fp8_ffn_kernels.cuh"
#include "fp8_lt.cuh"
#include "moekit/reference.hpp"
#include "timing.hpp"

namespace moekit::cli {

// ---- the FP8 expert FFN -----------------------------------------------------------------------
namespace {

constexpr int64_t kRowPad = 4;  // block scaling: "M and N must be multiples of 4" (N: an expert's rows)
int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

struct Slot {
  int32_t expert = 0, rows = 0, rows_pad = 0;
  int64_t r0 = 0;  // first gathered row
};
// One up GEMM: W13 rows [row0, row0 + rows), their scales block rows [brow0, brow0 + brows).
struct UpPart {
  int64_t row0, rows, brow0, brows;
};
struct Gemms {
  std::vector<std::unique_ptr<Fp8Gemm>> up;  // one per UpPart
  std::unique_ptr<Fp8Gemm> down;
};

struct Problem {
  MoeShape s;
  int64_t LH = 0, LF = 0, LH4 = 0, LF4 = 0;  // scale blocks along H and F, and rounded up to 4
  std::vector<UpPart> up;                    // 2F rows at once, or gate and up when F % 128 != 0
  std::vector<Slot> slots;                   // touched experts, ascending
  std::vector<int32_t> slot_of;              // [E]: index into slots, -1 if untouched
  int64_t rows_pad = 0;                      // gathered rows, padding included
  std::vector<int32_t> pos;                  // [T·k]: gathered row of each assignment
  DeviceBuffer xs_q, xs_scale, gate_up, act_q, act_scale, out, y, d_pos, d_slot;
  std::vector<std::vector<DeviceBuffer>> up_scales;  // [copy][part]: [E, brows, LH4] f32
  std::vector<DeviceBuffer> down_scales;             // [copy]: [E, ceil(H/128), LF4] f32
  std::map<int32_t, Gemms> gemms;                    // by rows_pad
  std::string no_algo;                               // set when a GEMM has no cuBLASLt algorithm
};

void expect(const Tensor& t, const std::string& name, DType dt, const std::vector<int64_t>& dims) {
  bool ok = t.data != nullptr && t.dtype == dt && t.rank == int(dims.size());
  for (size_t i = 0; ok && i < dims.size(); ++i) ok = t.shape[i] == dims[i];
  if (ok) return;
  std::string want = std::string(dtype_name(dt)) + " [";
  for (size_t i = 0; i < dims.size(); ++i) want += (i ? ", " : "") + std::to_string(dims[i]);
  throw Error(name + ": expected " + want + "], got " +
              (t.data ? std::string(dtype_name(t.dtype)) + " " + t.shape_str() : std::string("no tensor")));
}

void validate(const Fp8BaselineRequest& q) {
  const MoeShape& s = q.shape;
  const int64_t T = s.tokens, H = s.hidden, F = s.inter, E = s.experts, k = s.topk;
  if (T < 0 || H <= 0 || F <= 0 || E <= 0 || k <= 0 || k > E) throw Error("shape: invalid MoeShape");
  if (H % 16 || F % 16)
    throw Error("shape: FP8 needs H and F multiples of 16, got H=" + std::to_string(H) + " F=" + std::to_string(F));
  const int64_t LH = fp8_blocks(H), LF = fp8_blocks(F);
  expect(q.x_q, "x_q", DType::e4m3, {T, H});
  expect(q.x_scale, "x_scale", DType::f32, {T, LH});
  expect(q.topk_weights, "topk_weights", DType::f32, {T, k});
  if (reinterpret_cast<uintptr_t>(q.x_q.data) % 16) throw Error("x_q: must be 16-byte aligned");
  if (!q.topk_ids || int64_t(q.topk_ids->size()) != T * k) throw Error("topk_ids: expected T*k host ids");
  for (int32_t id : *q.topk_ids)
    if (id < 0 || id >= E) throw Error("topk_ids: expert id " + std::to_string(id) + " out of range");
  if (q.weights.empty()) throw Error("weights: give at least one weight copy");
  for (size_t c = 0; c < q.weights.size(); ++c) {
    const std::string n = "weights[" + std::to_string(c) + "].";
    expect(q.weights[c].w13, n + "w13", DType::e4m3, {E, 2 * F, H});
    expect(q.weights[c].w13_scale, n + "w13_scale", DType::f32, {E, w13_scale_rows(F), LH});
    expect(q.weights[c].w2, n + "w2", DType::e4m3, {E, H, F});
    expect(q.weights[c].w2_scale, n + "w2_scale", DType::f32, {E, LH, LF});
  }
}

const uint8_t* bytes(const Tensor& t) { return t.as<const uint8_t>(); }

// The routed rows in expert order, the buffers, the weights' scales repacked per copy, the GEMMs.
Problem make_problem(const Fp8BaselineRequest& q, const CublasLt& lt) {
  Problem p;
  p.s = q.shape;
  const int64_t T = p.s.tokens, H = p.s.hidden, F = p.s.inter, E = p.s.experts, k = p.s.topk, A = T * k;
  p.LH = fp8_blocks(H), p.LF = fp8_blocks(F), p.LH4 = round_up(p.LH, 4), p.LF4 = round_up(p.LF, 4);
  if (F % kFp8Block == 0) p.up = {{0, 2 * F, 0, 2 * p.LF}};
  else p.up = {{0, F, 0, p.LF}, {F, F, p.LF, p.LF}};
  std::vector<std::vector<int32_t>> by_expert(static_cast<size_t>(E));
  for (int64_t a = 0; a < A; ++a) by_expert[size_t((*q.topk_ids)[size_t(a)])].push_back(int32_t(a));
  std::vector<int32_t> src;  // token of each gathered row, -1 for padding
  std::vector<int2> slot;    // (r0, rows_pad) of each gathered row's expert
  p.pos.assign(size_t(A), 0);
  p.slot_of.assign(size_t(E), -1);
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int32_t>& as = by_expert[size_t(e)];
    if (as.empty()) continue;
    Slot sl{int32_t(e), int32_t(as.size()), int32_t(round_up(int64_t(as.size()), kRowPad)), p.rows_pad};
    for (size_t i = 0; i < as.size(); ++i) {
      p.pos[size_t(as[i])] = int32_t(sl.r0 + int64_t(i));
      src.push_back(int32_t(as[i] / k));
    }
    src.resize(size_t(sl.r0 + sl.rows_pad), -1);
    slot.resize(size_t(sl.r0 + sl.rows_pad), make_int2(int(sl.r0), sl.rows_pad));
    p.rows_pad += sl.rows_pad;
    p.slot_of[size_t(e)] = int32_t(p.slots.size());
    p.slots.push_back(sl);
  }
  const int64_t R = p.rows_pad;
  p.xs_q = DeviceBuffer(R * H);
  p.xs_scale = DeviceBuffer(R * p.LH * 4);
  p.gate_up = DeviceBuffer(R * 2 * F * 2);
  p.act_q = DeviceBuffer(R * F);
  p.act_scale = DeviceBuffer(R * p.LF * 4);
  p.out = DeviceBuffer(R * H * 2);
  p.y = DeviceBuffer(T * H * 2);
  p.d_pos = DeviceBuffer(A * 4);
  p.d_slot = DeviceBuffer(R * int64_t(sizeof(int2)));
  DeviceBuffer d_src(R * 4);
  MK_CUDA_CHECK(cudaMemcpy(d_src.get(), src.data(), size_t(R) * 4, cudaMemcpyHostToDevice));
  MK_CUDA_CHECK(cudaMemcpy(p.d_slot.get(), slot.data(), size_t(R) * sizeof(int2), cudaMemcpyHostToDevice));
  MK_CUDA_CHECK(cudaMemcpy(p.d_pos.get(), p.pos.data(), size_t(A) * 4, cudaMemcpyHostToDevice));
  const cudaStream_t st = q.stream;
  gather_fp8_rows_kernel<<<lt_blocks(R * H / 16), kLtThreads, 0, st>>>(q.x_q.as<const uint4>(), d_src.as<const int32_t>(),
                                                                      p.xs_q.as<uint4>(), R, H / 16);
  MK_LAUNCH_CHECK("gather_fp8_rows_kernel");
  gather_scales_kernel<<<lt_blocks(R * p.LH), kLtThreads, 0, st>>>(q.x_scale.as<const float>(), d_src.as<const int32_t>(),
                                                                  p.d_slot.as<const int2>(), p.xs_scale.as<float>(), R,
                                                                  p.LH);
  MK_LAUNCH_CHECK("gather_scales_kernel");
  for (const ExpertWeights& w : q.weights) {  // each copy's scales, as each copy's weights, from HBM
    p.up_scales.emplace_back();
    for (const UpPart& u : p.up) {
      p.up_scales.back().emplace_back(E * u.brows * p.LH4 * 4);
      repack_block_scales_kernel<<<lt_blocks(E * u.brows * p.LH4), kLtThreads, 0, st>>>(
          w.w13_scale.as<const float>(), p.up_scales.back().back().as<float>(), E, 2 * p.LF, u.brow0, u.brows, p.LH,
          p.LH4);
      MK_LAUNCH_CHECK("repack_block_scales_kernel");
    }
    p.down_scales.emplace_back(E * p.LH * p.LF4 * 4);
    repack_block_scales_kernel<<<lt_blocks(E * p.LH * p.LF4), kLtThreads, 0, st>>>(
        w.w2_scale.as<const float>(), p.down_scales.back().as<float>(), E, p.LH, 0, p.LH, p.LF, p.LF4);
    MK_LAUNCH_CHECK("repack_block_scales_kernel");
  }
  MK_CUDA_CHECK(cudaStreamSynchronize(st));  // `d_src` is freed when we return

  // The least alignment of every pointer each GEMM role is passed: what the heuristic may assume.
  Fp8Gemm::Shape up_sh, down_sh;
  up_sh.a_mode = down_sh.a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  up_sh.b_mode = down_sh.b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  up_sh.align_a = up_sh.align_b = up_sh.align_d = down_sh.align_a = down_sh.align_b = down_sh.align_d = 256;
  for (const Slot& sl : p.slots) {
    const int64_t e = sl.expert;
    for (const ExpertWeights& w : q.weights) {
      for (const UpPart& u : p.up)
        up_sh.align_a = std::min(up_sh.align_a, alignment_of(bytes(w.w13) + (e * 2 * F + u.row0) * H));
      down_sh.align_a = std::min(down_sh.align_a, alignment_of(bytes(w.w2) + e * H * F));
    }
    up_sh.align_b = std::min(up_sh.align_b, alignment_of(p.xs_q.as<uint8_t>() + sl.r0 * H));
    for (const UpPart& u : p.up)
      up_sh.align_d = std::min(up_sh.align_d, alignment_of(p.gate_up.as<__nv_bfloat16>() + sl.r0 * 2 * F + u.row0));
    down_sh.align_b = std::min(down_sh.align_b, alignment_of(p.act_q.as<uint8_t>() + sl.r0 * F));
    down_sh.align_d = std::min(down_sh.align_d, alignment_of(p.out.as<__nv_bfloat16>() + sl.r0 * H));
  }
  for (const Slot& sl : p.slots) {
    if (p.gemms.count(sl.rows_pad)) continue;
    Gemms& g = p.gemms[sl.rows_pad];
    for (size_t i = 0; i < p.up.size(); ++i) {
      Fp8Gemm::Shape sh = up_sh;
      sh.m = p.up[i].rows, sh.n = sl.rows_pad, sh.k = H, sh.ldd = 2 * F;
      g.up.push_back(std::make_unique<Fp8Gemm>(lt, sh, p.up_scales[0][i].as<const float>(),
                                               p.xs_scale.as<const float>(), 1));
      if (g.up.back()->algos() == 0) p.no_algo = "up GEMM: " + g.up.back()->why();
    }
    Fp8Gemm::Shape sh = down_sh;
    sh.m = H, sh.n = sl.rows_pad, sh.k = F, sh.ldd = H;
    g.down = std::make_unique<Fp8Gemm>(lt, sh, p.down_scales[0].as<const float>(), p.act_scale.as<const float>(), 1);
    if (g.down->algos() == 0) p.no_algo = "down GEMM: " + g.down->why();
    if (!p.no_algo.empty()) break;
  }
  return p;
}

// Every up GEMM, one SwiGLU/quantize kernel over all gathered rows, every down GEMM, the combine.
void fp8_step(const Fp8BaselineRequest& q, const CublasLt& lt, const Problem& p, int c) {
  const ExpertWeights& w = q.weights[size_t(c)];
  const int64_t T = p.s.tokens, H = p.s.hidden, F = p.s.inter, k = p.s.topk;
  const cudaStream_t st = q.stream;
  for (const Slot& sl : p.slots) {
    const Gemms& g = p.gemms.at(sl.rows_pad);
    const int64_t e = sl.expert;
    for (size_t i = 0; i < p.up.size(); ++i) {
      const UpPart& u = p.up[i];
      g.up[i]->run(lt, bytes(w.w13) + (e * 2 * F + u.row0) * H, p.up_scales[size_t(c)][i].as<const float>() + e * u.brows * p.LH4,
                   p.xs_q.as<const uint8_t>() + sl.r0 * H, p.xs_scale.as<const float>() + sl.r0 * p.LH,
                   p.gate_up.as<__nv_bfloat16>() + sl.r0 * 2 * F + u.row0, st);
    }
  }
  const int64_t swiglu_threads = p.rows_pad * p.LF * 32;
  swiglu_quant_kernel<<<unsigned((swiglu_threads + kSwigluThreads - 1) / kSwigluThreads), kSwigluThreads, 0, st>>>(
      p.gate_up.as<const __nv_bfloat16>(), p.d_slot.as<const int2>(), p.act_q.as<uint8_t>(), p.act_scale.as<float>(),
      p.rows_pad, F);
  MK_LAUNCH_CHECK("swiglu_quant_kernel");
  for (const Slot& sl : p.slots) {
    const int64_t e = sl.expert;
    p.gemms.at(sl.rows_pad)
        .down->run(lt, bytes(w.w2) + e * H * F, p.down_scales[size_t(c)].as<const float>() + e * p.LH * p.LF4,
                   p.act_q.as<const uint8_t>() + sl.r0 * F, p.act_scale.as<const float>() + sl.r0 * p.LF,
                   p.out.as<__nv_bfloat16>() + sl.r0 * H, st);
  }
  combine_weighted_kernel<<<lt_blocks(T * H), kLtThreads, 0, st>>>(p.out.as<const __nv_bfloat16>(), p.d_pos.as<const int32_t>(),
                                                                   q.topk_weights.as<const float>(), p.y.as<__nv_bfloat16>(),
                                                                   T, k, H);
  MK_LAUNCH_CHECK("combine_weighted_kernel");
}

template <class T> std::vector<T> to_host(const void* src, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  MK_CUDA_CHECK(cudaMemcpy(v.data(), src, size_t(n) * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
std::vector<double> bf16_row(const void* src, int64_t n) {
  const std::vector<ref::bf16> b = to_host<ref::bf16>(src, n);
  std::vector<double> d(b.size());
  for (size_t i = 0; i < b.size(); ++i) d[i] = ref::to_float(b[i]);
  return d;
}

// Tokens 0 and T-1, each stage against double-precision host sums on the baseline's own inputs to
// it (as check_rows in baselines.cu): the up GEMM's gate_up rows against x_q·W13ᵀ dequantized; act
// against the host's SwiGLU/quantization of those bf16 rows; y against Σ_j w_j · act_j·W2ᵀ
// dequantized. Returns the worst relative norm error; `detail` gets each stage's.
double check_tokens(const Fp8BaselineRequest& q, const Problem& p, std::string& detail) {
  MK_CUDA_CHECK(cudaStreamSynchronize(q.stream));
  const int64_t T = p.s.tokens, H = p.s.hidden, F = p.s.inter, k = p.s.topk, LH = p.LH, LF = p.LF;
  const ExpertWeights& w = q.weights[0];
  const std::vector<float> tw = to_host<float>(q.topk_weights.data, T * k);
  const double* e4m3 = e4m3_table();
  double e_up = 0, e_act = 0, e_y = 0;
  auto worse = [](double& acc, double err) { acc = std::max(acc, std::isnan(err) ? INFINITY : err); };
  std::vector<int64_t> tokens = {0};
  if (T > 1) tokens.push_back(T - 1);
  for (const int64_t t : tokens) {
    const std::vector<uint8_t> xq = to_host<uint8_t>(bytes(q.x_q) + t * H, H);
    const std::vector<float> xs = to_host<float>(q.x_scale.as<const float>() + t * LH, LH);
    std::vector<double> x(static_cast<size_t>(H)), y_ref(static_cast<size_t>(H), 0.0);
    for (int64_t i = 0; i < H; ++i) x[size_t(i)] = e4m3[xq[size_t(i)]] * double(xs[size_t(i / 128)]);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t a = t * k + j, e = (*q.topk_ids)[size_t(a)], r = p.pos[size_t(a)];
      const Slot& sl = p.slots[size_t(p.slot_of[size_t(e)])];
      const std::vector<uint8_t> w13 = to_host<uint8_t>(bytes(w.w13) + e * 2 * F * H, 2 * F * H);
      const std::vector<float> s13 = to_host<float>(w.w13_scale.as<const float>() + e * 2 * LF * LH, 2 * LF * LH);
      const std::vector<uint8_t> w2 = to_host<uint8_t>(bytes(w.w2) + e * H * F, H * F);
      const std::vector<float> s2 = to_host<float>(w.w2_scale.as<const float>() + e * LH * LF, LH * LF);
      // gate_up[n] = Σ_b s13[block row of n, b] · Σ_{i in b} w13[n, i] · x[i]: gate's blocks, then up's.
      std::vector<double> gu_ref(size_t(2 * F));
      ref::parallel_for(2 * F, [&](int64_t n) {
        const int64_t nb = n < F ? n / 128 : LF + (n - F) / 128;
        double acc = 0;
        for (int64_t b = 0; b < LH; ++b) {
          double part = 0;
          for (int64_t i = b * 128; i < std::min(H, b * 128 + 128); ++i)
            part += e4m3[w13[size_t(n * H + i)]] * x[size_t(i)];
          acc += part * double(s13[size_t(nb * LH + b)]);
        }
        gu_ref[size_t(n)] = acc;
      });
      const std::vector<double> gu = bf16_row(p.gate_up.as<const __nv_bfloat16>() + r * 2 * F, 2 * F);
      worse(e_up, ref::rel_norm_error(gu, gu_ref));
      const std::vector<float> gate(gu.begin(), gu.begin() + F), up(gu.begin() + F, gu.end());
      const std::vector<uint8_t> aq = to_host<uint8_t>(p.act_q.as<const uint8_t>() + r * F, F);
      std::vector<float> as(static_cast<size_t>(LF));  // stride rows_pad in the slot layout
      MK_CUDA_CHECK(cudaMemcpy2D(as.data(), 4, p.act_scale.as<const float>() + sl.r0 * LF + (r - sl.r0),
                                 size_t(sl.rows_pad) * 4, 4, size_t(LF), cudaMemcpyDeviceToHost));
      std::vector<double> act(static_cast<size_t>(F));
      for (int64_t f = 0; f < F; ++f) act[size_t(f)] = e4m3[aq[size_t(f)]] * double(as[size_t(f / 128)]);
      worse(e_act, ref::rel_norm_error(act, host_swiglu_quant(gate, up)));
      ref::parallel_for(H, [&](int64_t h) {
        double acc = 0;
        for (int64_t b = 0; b < LF; ++b) {
          double part = 0;
          for (int64_t f = b * 128; f < std::min(F, b * 128 + 128); ++f)
            part += e4m3[w2[size_t(h * F + f)]] * act[size_t(f)];
          acc += part * double(s2[size_t((h / 128) * LF + b)]);
        }
        y_ref[size_t(h)] += double(tw[size_t(a)]) * acc;  // one h per call: no race
      });
    }
    worse(e_y, ref::rel_norm_error(bf16_row(p.y.as<const __nv_bfloat16>() + t * H, H), y_ref));
  }
  char b[96];
  std::snprintf(b, sizeof b, "up %.2e, act %.2e, y %.2e", e_up, e_act, e_y);
  detail = b;
  return std::max({e_up, e_act, e_y});
}

}  // namespace

std::vector<Fp8BaselineResult> run_fp8_baselines(const Fp8BaselineRequest& q) {
  std::vector<Fp8BaselineResult> results;
  if (q.shape.tokens == 0) return results;
  Fp8BaselineResult r, g;  // eager; replayed from CUDA graphs (q.graph)
  r.impl = "cublaslt-fp8-loop";
  g.impl = r.impl + "-graph";
  try {
    validate(q);
    std::unique_ptr<CublasLt> own;
    if (!q.lt) own = std::make_unique<CublasLt>();
    const CublasLt& lt = q.lt ? *q.lt : *own;
    const Problem p = make_problem(q, lt);
    if (!p.no_algo.empty()) throw std::runtime_error(p.no_algo);
    const size_t n = p.slots.size();
    r.note = "per expert: cublasLtMatmul e4m3 x e4m3 -> bf16 (CUBLAS_COMPUTE_32F, TN; weights "
             "BLK128x128_32F scales, token rows VEC128_32F) up" +
             std::string(p.up.size() > 1 ? " as gate + up (F % 128 != 0)" : "") + " and down, 1 SwiGLU/e4m3-quantize kernel, "
             "1 combine kernel with the routing weights (" + std::to_string(n) + " experts, " +
             std::to_string(n * (p.up.size() + 1) + 2) + " launches); x_q rows gathered per expert untimed, each "
             "expert's rows padded to a multiple of 4 (" + std::to_string(p.rows_pad) + " rows for " +
             std::to_string(p.s.assignments()) + " assignments)";
    // Poison what the step writes, run once, check, then time.
    for (const DeviceBuffer* b : {&p.gate_up, &p.act_q, &p.act_scale, &p.out, &p.y})
      MK_CUDA_CHECK(cudaMemsetAsync(b->get(), 0xff, size_t(b->bytes()), q.stream));
    fp8_step(q, lt, p, 0);
    r.check_err = check_tokens(q, p, r.check_detail);
    if (!(r.check_err <= kYRelTolerance)) {
      char b[200];
      std::snprintf(b, sizeof b, "failed its check: rel err %.3e > %.0e (%s); not timed", r.check_err, kYRelTolerance,
                    r.check_detail.c_str());
      throw std::runtime_error(b);
    }
    const int copies = int(q.weights.size());
    r.ms = time_median_ms(q.stream, q.warmup, q.steps, [&](int i) { fp8_step(q, lt, p, i % copies); });
    r.ok = true;
    if (q.graph) {  // one graph of the step per weight copy, launched in rotation: no host launch cost
      g.note = r.note + "; captured once per weight copy and replayed";
      g.check_err = r.check_err;
      g.check_detail = r.check_detail;
      try {
        LayerGraphs graphs;
        for (int c = 0; c < copies; ++c) graphs.capture([&] { fp8_step(q, lt, p, c); }, q.stream);
        g.ms = time_rotated_ms(graphs, copies, q.warmup, q.steps, q.stream);
        g.ok = true;
      } catch (const std::exception& e) {
        g.error = g.impl + ": " + e.what();
      }
    }
  } catch (const std::exception& e) {
    r.error = r.impl + ": " + e.what();
    g.error = g.impl + ": not run (" + r.error + ")";
  }
  results.push_back(r);
  if (q.graph) results.push_back(g);
  return results;
}

}  // namespace moekit::cli
