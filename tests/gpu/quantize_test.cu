// quantize_test.cu — the FP8 quantizers on the GPU (src/quant) against the CPU oracle, bit for bit:
// every e4m3 byte and every scale's bits equal ref::quantize_tokens / ref::quantize_weight_blocks,
// on random inputs with zero, tiny, huge, NaN and Inf groups, partial groups and blocks, and 64-bit
// offsets. Outputs are poisoned before each launch (an unwritten byte fails), each result is the
// same run after run, and a captured CUDA graph replays it.
#include <algorithm>
#include <cstring>

#include "gpu/gpu_util.hpp"
#include "gpu/hash_fill.hpp"
#include "quant/launch.hpp"

namespace moekit::test {
namespace {

using ref::bf16;
using ref::fp8;

constexpr bf16 kBf16NaN = 0x7fc0, kBf16NegNaN = 0xffc1, kBf16Inf = 0x7f80, kBf16NegInf = 0xff80;
constexpr bf16 kBf16Max = 0x7f7f, kBf16NegMax = 0xff7f, kBf16NegZero = 0x8000, kBf16MinSubnormal = 0x0001;


// Fills `n` values from `first` with what a special group holds: 0 zeros (±0), 1 tiny (|v| well
// below 2^-100, bf16 subnormals too), 2 huge (up to ±bf16 max), 3 one NaN, 4 one Inf, 5 Inf and NaN,
// 6 -Inf among normal values.
void make_special(bf16* first, int64_t n, int kind, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    switch (kind) {
      case 0: first[i] = i % 3 ? 0 : kBf16NegZero; break;
      case 1: first[i] = i % 5 ? ref::to_bf16(std::ldexp(d(rng), -110)) : kBf16MinSubnormal; break;
      case 2: first[i] = ref::to_bf16(std::ldexp(d(rng), 120)); break;
      default: first[i] = ref::to_bf16(d(rng)); break;
    }
  }
  if (kind == 2) first[0] = kBf16Max, first[n - 1] = kBf16NegMax;
  if (kind == 3 || kind == 5) first[n / 2] = kind == 3 ? kBf16NaN : kBf16NegNaN;
  if (kind == 4 || kind == 5) first[n - 1] = kBf16Inf;
  if (kind == 6) first[0] = kBf16NegInf;
}

// Random rows (each its own magnitude, 2^-30 to 2^30) and, in the first rows, one special group
// each: row r's group r % groups is special kind r (kinds 0-6).
std::vector<bf16> make_tokens(int64_t T, int64_t H, std::mt19937_64& rng) {
  std::vector<bf16> x(static_cast<size_t>(T * H));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    const int e = int(rng() % 61) - 30;
    for (int64_t h = 0; h < H; ++h) x[size_t(t * H + h)] = ref::to_bf16(std::ldexp(d(rng), e));
  }
  const int64_t G = fp8_blocks(H);
  for (int64_t r = 0; r < std::min<int64_t>(T, 7); ++r) {
    const int64_t c0 = (r % G) * kFp8Block;
    make_special(x.data() + r * H + c0, std::min(kFp8Block, H - c0), int(r), rng);
  }
  return x;
}

struct Quantized {
  std::vector<fp8> q;
  std::vector<uint32_t> scale;  // bits
};
// Bitwise equal, or where they first differ and how often (not the whole vectors).
template <class T>
::testing::AssertionResult same(const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": " << got.size() << " values, want " << want.size();
  size_t first = got.size(), n = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && n++ == 0) first = i;
  if (n == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << n << " of " << got.size() << " differ; first at " << first
                                       << ": 0x" << std::hex << uint64_t(got[first]) << ", want 0x" << uint64_t(want[first]);
}
::testing::AssertionResult equal(const Quantized& got, const Quantized& want) {
  const ::testing::AssertionResult s = same("scale bits", got.scale, want.scale);
  return s ? same("e4m3 bytes", got.q, want.q) : s;
}
Quantized oracle_tokens(const std::vector<bf16>& x, int64_t T, int64_t H) {
  std::vector<fp8> q(static_cast<size_t>(T * H));
  std::vector<float> s(static_cast<size_t>(T * fp8_blocks(H)));
  ref::quantize_tokens(x.data(), T, H, q.data(), s.data());
  return {q, float_bits(s)};
}

class QuantizeTest : public GpuTest {
 protected:
  // Poisons q and scale, runs `enqueue` on the stream, returns both.
  template <class Enqueue>
  Quantized run(DeviceBuffer<fp8>& q, DeviceBuffer<float>& scale, Enqueue&& enqueue) {
    q.poison();
    scale.poison();
    enqueue();
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    return {q.download(), float_bits(scale.download())};
  }
};

TEST_F(QuantizeTest, TokensBitwiseEqualOracle) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int64_t H : {16, 112, 128, 336, 2048, 7168})
    for (int64_t T : {1, 7, 133}) {
      SCOPED_TRACE("T=" + std::to_string(T) + " H=" + std::to_string(H));
      const std::vector<bf16> x = make_tokens(T, H, rng);
      DeviceBuffer<bf16> d_x(x);
      DeviceBuffer<fp8> d_q(size_t(T * H));
      DeviceBuffer<float> d_s(size_t(T * fp8_blocks(H)));
      auto launch = [&] { detail::launch_quantize_tokens(d_x.ptr, T, H, d_q.ptr, d_s.ptr, stream); };
      const Quantized got = run(d_q, d_s, launch);
      const Quantized want = oracle_tokens(x, T, H);
      ASSERT_TRUE(equal(got, want));
      ASSERT_TRUE(equal(run(d_q, d_s, launch), got));  // deterministic
    }
}

// The public entry on an fp8 plan's workspace, eagerly and from a captured graph (global capture:
// a sync or an allocation inside fails), replayed twice.
TEST_F(QuantizeTest, TokensEntryEagerAndGraphReplayEqualOracle) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t T = 100, H = 336;
  const ForwardPlan plan = plan_forward(MoeShape{T, H, 256, 16, 4}, query_device(), Precision::fp8);
  DeviceBuffer<unsigned char> ws_buf(workspace_bytes(plan));
  const Workspace ws = carve_workspace(plan, ws_buf.ptr, ws_buf.count);
  const std::vector<bf16> x = make_tokens(T, H, rng);
  DeviceBuffer<bf16> d_x(x);
  const Tensor tx(d_x.ptr, DType::bf16, {T, H});
  auto result = [&] {
    Quantized r{std::vector<fp8>(size_t(T * H)), {}};
    std::vector<float> s(static_cast<size_t>(T * fp8_blocks(H)));
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    MK_CUDA_CHECK(cudaMemcpy(r.q.data(), ws.x_q.data, r.q.size(), cudaMemcpyDeviceToHost));
    MK_CUDA_CHECK(cudaMemcpy(s.data(), ws.x_scale.data, s.size() * sizeof(float), cudaMemcpyDeviceToHost));
    r.scale = float_bits(s);
    return r;
  };
  ws_buf.poison();
  quantize_tokens(plan, tx, ws, stream);
  const Quantized eager = result();
  ASSERT_TRUE(equal(eager, oracle_tokens(x, T, H)));
  const CapturedGraph graph(stream, [&] { quantize_tokens(plan, tx, ws, stream); });
  for (int replay = 0; replay < 2; ++replay) {
    ws_buf.poison();
    graph.launch(stream);
    ASSERT_TRUE(equal(result(), eager)) << "replay " << replay;
  }
}

// T·H = 300000 · 7168 > 2^31 elements: the offsets of the last rows need 64 bits. x comes from
// hash_fill on the device; the host checks a sample of rows (both ends, those around element
// 2^31, random ones), with special groups patched into three of them.
TEST_F(QuantizeTest, TokensBeyond2Pow31ElementsEqualOracleOnSampledRows) {
  const int64_t T = 300000, H = 7168, G = fp8_blocks(H);
  ASSERT_GT(T * H, int64_t(1) << 31);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  DeviceBuffer<bf16> d_x(size_t(T * H));
  DeviceBuffer<fp8> d_q(size_t(T * H));
  DeviceBuffer<float> d_s(size_t(T * G));
  hash_fill_device(d_x.ptr, T * H, seed, 1.0f, stream);
  const int64_t boundary = (int64_t(1) << 31) / H;  // the row holding element 2^31
  std::vector<int64_t> rows = {0, 1, T / 2, boundary - 1, boundary, boundary + 1, T - 2, T - 1};
  while (rows.size() < 24) {  // and 16 distinct random ones
    const int64_t r = int64_t(rng() % uint64_t(T));
    if (std::find(rows.begin(), rows.end(), r) == rows.end()) rows.push_back(r);
  }
  std::vector<std::vector<bf16>> x_rows;
  for (int64_t r : rows) x_rows.push_back(hash_fill_host(r * H, H, seed, 1.0f));
  const int special_kinds[3] = {3, 4, 2};  // NaN in a group of row `boundary`, Inf, huge in the last rows
  for (int i = 0; i < 3; ++i) {
    const size_t at = size_t(4 + i * 3) % rows.size();  // rows boundary, T-1 and a random one
    const int64_t c0 = (rows[at] % G) * kFp8Block;
    make_special(x_rows[at].data() + c0, kFp8Block, special_kinds[i], rng);
    MK_CUDA_CHECK(cudaMemcpyAsync(d_x.ptr + rows[at] * H, x_rows[at].data(), size_t(H) * sizeof(bf16),
                                  cudaMemcpyHostToDevice, stream));
  }
  d_q.poison();
  d_s.poison();
  detail::launch_quantize_tokens(d_x.ptr, T, H, d_q.ptr, d_s.ptr, stream);
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(rows[i]));
    Quantized got{std::vector<fp8>(size_t(H)), {}};
    std::vector<float> s(static_cast<size_t>(G));
    MK_CUDA_CHECK(cudaMemcpy(got.q.data(), d_q.ptr + rows[i] * H, size_t(H), cudaMemcpyDeviceToHost));
    MK_CUDA_CHECK(cudaMemcpy(s.data(), d_s.ptr + rows[i] * G, size_t(G) * sizeof(float), cudaMemcpyDeviceToHost));
    got.scale = float_bits(s);
    ASSERT_TRUE(equal(got, oracle_tokens(x_rows[i], 1, H)));
  }
}

// ---- weights --------------------------------------------------------------------------------

struct WeightCase {
  int64_t P, R, C;
};

TEST_F(QuantizeTest, WeightsBitwiseEqualOracleRunAfterRunAndFromAGraph) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const WeightCase& c : {WeightCase{1, 128, 128}, WeightCase{2, 7, 16}, WeightCase{3, 200, 336},
                              WeightCase{4, 320, 384}, WeightCase{2, 576, 7168}}) {
    SCOPED_TRACE("P=" + std::to_string(c.P) + " R=" + std::to_string(c.R) + " C=" + std::to_string(c.C));
    const int64_t RB = fp8_blocks(c.R), CB = fp8_blocks(c.C);
    std::vector<bf16> w = random_bf16(size_t(c.P * c.R * c.C), rng, 0.05f);
    // Every 3rd block is special, kind i % 7 for the i-th: kinds 0-2 (zero, tiny, huge) in all its
    // rows, kinds 3-6 (NaN, Inf) in its first row only.
    for (int64_t b = 0, i = 0; b < c.P * RB * CB; b += 3, ++i) {
      const int64_t p = b / (RB * CB), rb = b / CB % RB, cb = b % CB;
      const int64_t c0 = cb * kFp8Block, nc = std::min(kFp8Block, c.C - c0), r0 = rb * kFp8Block;
      const int kind = int(i % 7);
      for (int64_t r = r0; r < std::min(c.R, r0 + kFp8Block) && (kind <= 2 || r == r0); ++r)
        make_special(w.data() + (p * c.R + r) * c.C + c0, nc, kind, rng);
    }
    DeviceBuffer<bf16> d_w(w);
    DeviceBuffer<fp8> d_q(w.size());
    DeviceBuffer<float> d_s(size_t(c.P * RB * CB));
    const Tensor tw(d_w.ptr, DType::bf16, {c.P, c.R, c.C}), tq(d_q.ptr, DType::e4m3, {c.P, c.R, c.C}),
        ts(d_s.ptr, DType::f32, {c.P, RB, CB});
    auto launch = [&] { quantize_weights(tw, tq, ts, stream); };
    const Quantized got = run(d_q, d_s, launch);

    std::vector<float> wf(w.size()), s(d_s.count);
    for (size_t i = 0; i < w.size(); ++i) wf[i] = ref::to_float(w[i]);
    Quantized want{std::vector<fp8>(w.size()), {}};
    ref::quantize_weight_blocks(wf.data(), c.P, c.R, c.C, want.q.data(), s.data());
    want.scale = float_bits(s);
    ASSERT_TRUE(equal(got, want));
    ASSERT_TRUE(equal(run(d_q, d_s, launch), got));  // deterministic
    const CapturedGraph graph(stream, launch);
    ASSERT_TRUE(equal(run(d_q, d_s, [&] { graph.launch(stream); }), got));
  }
}

}  // namespace
}  // namespace moekit::test
