// fp8.cpp — the CPU oracle of FP8 plans (see moekit/reference.hpp, "FP8"; docs/design.md, "FP8").
// Built with -ffp-contract=off: the quantization is src/common/fp8.cuh's FP32 arithmetic, one IEEE
// operation at a time, so scales and e4m3 bytes equal the kernels' bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "moekit/reference.hpp"
#include "reference/internal.hpp"

namespace moekit::ref {

namespace {

// The NaN the GPU's FP32 arithmetic produces (max.NaN, div.rn): a NaN scale is written as this one
// pattern on both processors (the host's arithmetic would keep its input's payload).
float gpu_nan() {
  const uint32_t u = 0x7fffffffu;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// max(amax, |v|) over n values, NaN if any is NaN (dev::amax_step).
float amax_of(const float* v, int64_t n, float amax) {
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(v[i]);
    amax = (a != a || amax != amax) ? gpu_nan() : std::max(amax, a);
  }
  return amax;
}

// dev::fp8_scale: `inv` quantizes (v · inv), `scale` dequantizes (q · scale).
struct Scale {
  float inv, scale;
};
Scale scale_of(float amax) {
  if (amax != amax) return {gpu_nan(), gpu_nan()};
  const float a = std::max(amax, kFp8AmaxFloor);
  return {kFp8Max / a, a / kFp8Max};
}

void quantize_with(const float* v, int64_t n, float inv, fp8* q) {
  for (int64_t i = 0; i < n; ++i) q[i] = to_e4m3(v[i] * inv);  // one FP32 rounding, then the cvt's
}

double dequant(fp8 q, float scale) { return double(e4m3_to_float(q)) * double(scale); }  // exact in double

// Σ_c (q[c] · scale_row[c / 128]) · v[c] over n columns: one row of an FP8 weight against a vector.
double dot_row(const fp8* q, const float* scale_row, const double* v, int64_t n) {
  double s = 0;
  for (int64_t c = 0; c < n; ++c) s += dequant(q[c], scale_row[c / kFp8Block]) * v[c];
  return s;
}

}  // namespace

float e4m3_to_float(fp8 q) {
  if ((q & 0x7f) == 0x7f) return gpu_nan();
  const int e = (q >> 3) & 0xf, m = q & 7;
  // Subnormals (e = 0) are m · 2^-9; normals (1 + m/8) · 2^(e-7).
  const float mag = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(float(8 + m), e - 10);
  return (q & 0x80) ? -mag : mag;
}

fp8 to_e4m3(float f) {
  if (f != f) return 0x7f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const fp8 sign = fp8((u >> 24) & 0x80);
  const float a = std::fabs(f);
  // [448, 464] rounds to 448 (464 is the tie between 448 and the NaN pattern: to even, 448);
  // beyond it, and ±Inf, saturate.
  if (a >= kFp8Max) return fp8(sign | 0x7e);
  // Below 2^-6 the steps are 2^-9 (subnormals; 8 · 2^-9 is the smallest normal, code 0x08).
  // The scalings by powers of two are exact; nearbyint rounds to nearest even.
  if (a < 0x1p-6f) return fp8(sign | int(std::nearbyint(a * 512.0f)));
  int ex;
  std::frexp(a, &ex);  // a in [2^(ex-1), 2^ex)
  const int e = ex - 1;  // in [-6, 8]
  const int m = int(std::nearbyint(std::ldexp(a, 3 - e)));  // in [8, 16]: 16 carries into the next binade
  return fp8(sign | (((e + 7) << 3) + m - 8));
}

float quantize_group(const float* v, int64_t n, fp8* q) {
  const Scale s = scale_of(amax_of(v, n, 0.0f));
  quantize_with(v, n, s.inv, q);
  return s.scale;
}

void quantize_tokens(const bf16* x, int64_t tokens, int64_t hidden, fp8* q, float* scale) {
  const int64_t groups = fp8_blocks(hidden);
  parallel_for(tokens, [&](int64_t t) {
    float v[kFp8Block];
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t c0 = g * kFp8Block, n = std::min(kFp8Block, hidden - c0);
      for (int64_t i = 0; i < n; ++i) v[i] = to_float(x[t * hidden + c0 + i]);
      scale[t * groups + g] = quantize_group(v, n, q + t * hidden + c0);
    }
  });
}

void quantize_weight_blocks(const float* w, int64_t projections, int64_t rows, int64_t cols, fp8* q, float* scale) {
  const int64_t rb = fp8_blocks(rows), cb = fp8_blocks(cols);
  parallel_for(projections * rb, [&](int64_t pr) {  // one row of blocks of one projection
    const int64_t p = pr / rb, r0 = (pr % rb) * kFp8Block, nr = std::min(kFp8Block, rows - r0);
    for (int64_t b = 0; b < cb; ++b) {
      const int64_t c0 = b * kFp8Block, nc = std::min(kFp8Block, cols - c0);
      const int64_t first = (p * rows + r0) * cols + c0;  // the block's first element
      float amax = 0.0f;
      for (int64_t r = 0; r < nr; ++r) amax = amax_of(w + first + r * cols, nc, amax);
      const Scale s = scale_of(amax);
      for (int64_t r = 0; r < nr; ++r) quantize_with(w + first + r * cols, nc, s.inv, q + first + r * cols);
      scale[pr * cb + b] = s.scale;
    }
  });
}

std::vector<double> moe_tokens_fp8(const MoeShape& s, const fp8* x_q, const float* x_scale, const Fp8Experts& w,
                                   const int32_t* topk_ids, const float* topk_weights,
                                   const std::vector<int64_t>& tokens) {
  const int64_t H = s.hidden, F = s.inter, hb = fp8_blocks(H), fb = fp8_blocks(F);
  std::vector<double> y(tokens.size() * size_t(H), 0.0);
  parallel_for(int64_t(tokens.size()), [&](int64_t i) {
    const int64_t t = tokens[size_t(i)];
    std::vector<double> x(static_cast<size_t>(H)), act(static_cast<size_t>(F));
    for (int64_t h = 0; h < H; ++h) x[size_t(h)] = dequant(x_q[t * H + h], x_scale[t * hb + h / kFp8Block]);
    std::vector<float> act_f(static_cast<size_t>(F));
    std::vector<fp8> act_q(static_cast<size_t>(F));
    for (int64_t j = 0; j < s.topk; ++j) {
      const int64_t e = topk_ids[t * s.topk + j];
      const double weight = topk_weights[t * s.topk + j];
      const fp8* w13 = w.w13 + e * 2 * F * H;
      const float* s13 = w.w13_scale + e * 2 * fb * hb;  // gate's block rows, then up's
      for (int64_t f = 0; f < F; ++f) {
        const double g = dot_row(w13 + f * H, s13 + (f / kFp8Block) * hb, x.data(), H);
        const double u = dot_row(w13 + (F + f) * H, s13 + (fb + f / kFp8Block) * hb, x.data(), H);
        act_f[size_t(f)] = float(internal::silu(g) * u);
      }
      // The up epilogue's quantization of act, per 128-column group, and its dequantization.
      for (int64_t c0 = 0; c0 < F; c0 += kFp8Block) {
        const int64_t n = std::min(kFp8Block, F - c0);
        const float sc = quantize_group(act_f.data() + c0, n, act_q.data() + c0);
        for (int64_t c = c0; c < c0 + n; ++c) act[size_t(c)] = dequant(act_q[size_t(c)], sc);
      }
      const fp8* w2 = w.w2 + e * H * F;
      const float* s2 = w.w2_scale + e * hb * fb;
      for (int64_t h = 0; h < H; ++h)
        y[size_t(i) * size_t(H) + size_t(h)] += weight * dot_row(w2 + h * F, s2 + (h / kFp8Block) * fb, act.data(), F);
    }
  });
  return y;
}

double calc_diff(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size())
    throw Error("ref::calc_diff: sizes differ (" + std::to_string(x.size()) + " vs " + std::to_string(y.size()) + ")");
  double xy = 0, xx_yy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    xy += x[i] * y[i];
    xx_yy += x[i] * x[i] + y[i] * y[i];
  }
  if (xx_yy == 0) return 0.0;  // both all zeros: equal
  return 1.0 - 2.0 * xy / xx_yy;
}

}  // namespace moekit::ref
