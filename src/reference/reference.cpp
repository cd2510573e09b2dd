// reference.cpp — the CPU oracle (see moekit/reference.hpp). Built with -ffp-contract=off: the
// router and combine use canon.hpp's operations in the kernels' order, so results are bitwise equal.
#include "moekit/reference.hpp"

#include <algorithm>
#include <cmath>
#include <thread>

#include "common/canon.hpp"
#include "reference/internal.hpp"

namespace moekit::ref {

float to_float(bf16 b) { return canon::bf16_bits_to_float(b); }
bf16 to_bf16(float f) { return canon::float_to_bf16_bits(f); }

void parallel_for(int64_t n, const std::function<void(int64_t)>& body) {
  const int64_t workers = std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      for (int64_t i = w; i < n; i += workers) body(i);
    });
  for (auto& t : pool) t.join();
}

std::vector<float> router_logits(const bf16* x, const void* w_gate, DType w_gate_dtype,
                                 int64_t tokens, int64_t hidden, int64_t experts) {
  std::vector<float> logits(size_t(tokens * experts));
  const int64_t chunks = hidden / canon::kLogitChunk;
  parallel_for(tokens, [&](int64_t t) {
    const bf16* xr = x + t * hidden;
    for (int64_t e = 0; e < experts; ++e) {
      float lane[32];
      for (int l = 0; l < 32; ++l) {
        float acc = 0.0f;
        for (int64_t c = l; c < chunks; c += 32)
          for (int q = 0; q < canon::kLogitChunk; ++q) {
            const int64_t h = c * canon::kLogitChunk + q;
            const float w = w_gate_dtype == DType::f32
                                ? static_cast<const float*>(w_gate)[e * hidden + h]
                                : to_float(static_cast<const bf16*>(w_gate)[e * hidden + h]);
            acc = canon::fma(to_float(xr[h]), w, acc);
          }
        lane[l] = acc;
      }
      logits[size_t(t * experts + e)] = canon::tree_sum32(lane);
    }
  });
  return logits;
}

int64_t logits_beyond_bound(const float* got, const bf16* x, const bf16* w_gate, int64_t tokens, int64_t hidden,
                            int64_t experts, std::string* first) {
  const std::vector<float> want = router_logits(x, w_gate, DType::bf16, tokens, hidden, experts);
  std::vector<int64_t> beyond(size_t(tokens), 0);
  std::vector<std::string> what(static_cast<size_t>(tokens));
  parallel_for(tokens, [&](int64_t t) {
    for (int64_t e = 0; e < experts; ++e) {
      double mag = 0.0;
      for (int64_t h = 0; h < hidden; ++h)
        mag += std::fabs(double(to_float(x[t * hidden + h])) * double(to_float(w_gate[e * hidden + h])));
      const size_t i = size_t(t * experts + e);
      const double err = std::fabs(double(got[i]) - double(want[i]));
      if (!(err <= kTensorCoreLogitTol * mag)) {  // NaN fails too
        if (beyond[size_t(t)]++ == 0)
          what[size_t(t)] = "token " + std::to_string(t) + " expert " + std::to_string(e) + ": got " +
                            std::to_string(got[i]) + ", oracle " + std::to_string(want[i]) + ", bound " +
                            std::to_string(kTensorCoreLogitTol * mag);
      }
    }
  });
  int64_t n = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    if (n == 0 && beyond[size_t(t)] > 0 && first != nullptr) *first = what[size_t(t)];
    n += beyond[size_t(t)];
  }
  return n;
}

namespace {
// Index of the best candidate among `allowed` entries by canon::ranks_before, or -1.
int best_of(const float* v, const std::vector<bool>& allowed, int n) {
  int best = -1;
  for (int e = 0; e < n; ++e)
    if (allowed[e] && (best < 0 || canon::ranks_before(v[e], e, v[best], best))) best = e;
  return best;
}
}  // namespace

Routing route(const float* logits, const float* bias, int64_t tokens, int64_t experts,
              int64_t topk, const RouterOptions& opt) {
  Routing r;
  r.ids.resize(size_t(tokens * topk));
  r.weights.resize(size_t(tokens * topk));
  const int E = int(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* l = logits + t * experts;
    std::vector<float> score(E), choice(E);
    if (opt.scoring == Scoring::softmax) {
      float m = -INFINITY;
      for (int e = 0; e < E; ++e) m = std::fmax(m, l[e]);
      float lane[32] = {};
      for (int e = 0; e < E; ++e) {
        score[e] = canon::exp(canon::add(l[e], -m));
        lane[e % 32] = canon::add(lane[e % 32], score[e]);
      }
      const float sum = canon::tree_sum32(lane);
      for (int e = 0; e < E; ++e) score[e] = canon::div(score[e], sum);
    } else {
      for (int e = 0; e < E; ++e) score[e] = canon::sigmoid(l[e]);
    }
    for (int e = 0; e < E; ++e) choice[e] = bias ? canon::add(score[e], bias[e]) : score[e];

    std::vector<bool> allowed(E, true);
    if (opt.n_group > 0) {
      const int G = int(opt.n_group), gs = E / G;
      std::vector<float> gscore(G);
      for (int g = 0; g < G; ++g) {
        std::vector<bool> in(gs, true);
        const int a = best_of(choice.data() + g * gs, in, gs);
        if (bias == nullptr || gs < 2) {
          gscore[g] = choice[g * gs + a];
        } else {
          in[a] = false;
          const int b = best_of(choice.data() + g * gs, in, gs);
          gscore[g] = canon::add(choice[g * gs + a], choice[g * gs + b]);
        }
      }
      std::vector<bool> gfree(G, true), gkeep(G, false);
      for (int i = 0; i < opt.topk_group; ++i) {
        const int g = best_of(gscore.data(), gfree, G);
        gfree[g] = false;
        gkeep[g] = true;
      }
      for (int e = 0; e < E; ++e) allowed[e] = gkeep[e / gs];
    }

    int32_t* ids = r.ids.data() + t * topk;
    float* w = r.weights.data() + t * topk;
    for (int j = 0; j < topk; ++j) {
      const int e = best_of(choice.data(), allowed, E);
      allowed[e] = false;
      ids[j] = e;
      w[j] = score[e];
    }
    if (opt.renormalize) {
      float s = 0.0f;
      for (int j = 0; j < topk; ++j) s = canon::add(s, w[j]);
      for (int j = 0; j < topk; ++j) w[j] = canon::div(w[j], s);
    }
    for (int j = 0; j < topk; ++j) w[j] = canon::weight_out(canon::mul(w[j], opt.routed_scaling_factor));
  }
  return r;
}

Aligned align(const int32_t* topk_ids, int64_t tokens, int64_t topk, int64_t experts,
              int64_t block_m, int64_t max_blocks) {
  Aligned out;
  const int64_t n = tokens * topk;
  out.expert_counts.assign(size_t(experts), 0);
  for (int64_t a = 0; a < n; ++a) {
    const int32_t e = topk_ids[a];
    if (e < 0 || e >= experts) {
      out.status |= kStatusExpertIdOutOfRange;
      continue;
    }
    ++out.expert_counts[size_t(e)];
  }
  std::vector<int64_t> start(size_t(experts) + 1, 0);
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t padded = (out.expert_counts[size_t(e)] + block_m - 1) / block_m * block_m;
    start[size_t(e) + 1] = start[size_t(e)] + padded;
  }
  out.num_rows_padded = int32_t(start[size_t(experts)]);
  out.sorted_ids.assign(size_t(out.num_rows_padded), int32_t(n));
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t a = 0; a < n; ++a) {
    const int32_t e = topk_ids[a];
    if (e < 0 || e >= experts) continue;
    out.sorted_ids[size_t(next[size_t(e)]++)] = int32_t(a);
  }
  out.block_expert.assign(size_t(max_blocks), -1);
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t r = start[size_t(e)]; r < start[size_t(e) + 1]; r += block_m)
      out.block_expert[size_t(r / block_m)] = int32_t(e);
  return out;
}

std::vector<bf16> combine(const bf16* y_rows, int64_t tokens, int64_t topk, int64_t hidden) {
  std::vector<bf16> y(size_t(tokens * hidden));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < hidden; ++h) {
      float s = 0.0f;
      for (int64_t j = 0; j < topk; ++j) s = canon::add(s, to_float(y_rows[(t * topk + j) * hidden + h]));
      y[size_t(t * hidden + h)] = to_bf16(s);
    }
  return y;
}

std::vector<bf16> combine_partials(const float* partials, int64_t splits, int64_t tokens,
                                   int64_t topk, int64_t hidden) {
  std::vector<bf16> y(static_cast<size_t>(tokens * hidden));
  const int64_t stride = tokens * topk * hidden;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < hidden; ++h) {
      float s = 0.0f;
      for (int64_t j = 0; j < topk; ++j)
        for (int64_t sp = 0; sp < splits; ++sp) s = canon::add(s, partials[sp * stride + (t * topk + j) * hidden + h]);
      y[size_t(t * hidden + h)] = to_bf16(s);
    }
  return y;
}

std::vector<double> expert_act(const bf16* x_row, const bf16* w13_expert, int64_t hidden,
                               int64_t inter) {
  std::vector<double> act(static_cast<size_t>(inter));
  for (int64_t f = 0; f < inter; ++f) {
    double g = 0, u = 0;
    const bf16* wg = w13_expert + f * hidden;
    const bf16* wu = w13_expert + (inter + f) * hidden;
    for (int64_t h = 0; h < hidden; ++h) {
      const double xv = to_float(x_row[h]);
      g += xv * to_float(wg[h]);
      u += xv * to_float(wu[h]);
    }
    act[size_t(f)] = internal::silu(g) * u;
  }
  return act;
}

std::vector<double> expert_down_row(const bf16* act_row, const bf16* w2_expert, float weight,
                                    int64_t hidden, int64_t inter) {
  std::vector<double> y(static_cast<size_t>(hidden));
  for (int64_t h = 0; h < hidden; ++h) {
    double s = 0;
    for (int64_t f = 0; f < inter; ++f) s += double(to_float(act_row[f])) * to_float(w2_expert[h * inter + f]);
    y[size_t(h)] = double(weight) * s;
  }
  return y;
}

std::vector<double> moe_tokens(const MoeShape& s, const bf16* x, const bf16* w13, const bf16* w2,
                               const int32_t* topk_ids, const float* topk_weights,
                               const std::vector<int64_t>& tokens) {
  std::vector<double> y(tokens.size() * size_t(s.hidden), 0.0);
  parallel_for(int64_t(tokens.size()), [&](int64_t i) {
    const int64_t t = tokens[size_t(i)];
    for (int64_t j = 0; j < s.topk; ++j) {
      const int64_t e = topk_ids[t * s.topk + j];
      const double w = topk_weights[t * s.topk + j];
      const std::vector<double> act =
          expert_act(x + t * s.hidden, w13 + e * 2 * s.inter * s.hidden, s.hidden, s.inter);
      const bf16* w2e = w2 + e * s.hidden * s.inter;
      for (int64_t h = 0; h < s.hidden; ++h) {
        double acc = 0;
        for (int64_t f = 0; f < s.inter; ++f) acc += act[size_t(f)] * to_float(w2e[h * s.inter + f]);
        y[size_t(i) * size_t(s.hidden) + size_t(h)] += w * acc;
      }
    }
  });
  return y;
}

double rel_norm_error(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = a[i] - b[i];
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num += d * d;
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace moekit::ref
