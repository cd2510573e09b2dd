// ceilings.cuh — the two ceilings every benchmark row is measured against, in the same run
// (docs/design.md, "What the benchmarks report"): a read-only streaming kernel (TB/s) and a large dense cuBLAS bf16 GEMM
// (TFLOP/s). The same streaming kernel also reads exactly the bytes of the touched experts: the
// "read time", the lower bound of a decode step that must read those weights once.
// Included by bench.cu and tune.cu. Everything here is in an anonymous namespace: each includer
// gets its own kernel and reader, so no definition is shared (or has to agree) across units.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "layer.hpp"
#include "rng.hpp"
#include "tool_util.hpp"

namespace moekit::cli {

namespace {

// A contiguous run of 16-byte vectors one block streams through.
struct ReadChunk {
  const uint4* ptr;
  int64_t vecs;
};

constexpr int kReadThreads = 512;
constexpr int kReadUnroll = 4;  // 16-byte loads in flight per thread: enough to cover HBM latency
// 64 KiB chunks: small enough that a few hundred MB of touched experts still spread over every
// SM, large enough that the chunk table is negligible next to the data (16 B per 64 KiB).
constexpr int64_t kReadChunkBytes = int64_t(64) << 10;

__global__ void __launch_bounds__(kReadThreads)
    stream_read_kernel(const ReadChunk* __restrict__ chunks, int64_t n_chunks, uint32_t* __restrict__ sink) {
  uint32_t acc = 0;
  for (int64_t c = blockIdx.x; c < n_chunks; c += gridDim.x) {
    const uint4* p = chunks[c].ptr;
    const int64_t n = chunks[c].vecs;
    int64_t i = threadIdx.x;
    for (; i + int64_t(kReadUnroll - 1) * kReadThreads < n; i += int64_t(kReadUnroll) * kReadThreads) {
      uint4 v[kReadUnroll];
#pragma unroll
      for (int u = 0; u < kReadUnroll; ++u) v[u] = __ldg(p + i + u * kReadThreads);
#pragma unroll
      for (int u = 0; u < kReadUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += kReadThreads) {
      const uint4 v = __ldg(p + i);
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  // The store is (almost) never taken, but the compiler cannot know: the loads stay.
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// A fixed list of byte ranges, split into chunks once; launch() streams all of them.
class StreamReader {
 public:
  StreamReader() = default;
  explicit StreamReader(const std::vector<std::pair<const void*, int64_t>>& ranges) {
    std::vector<ReadChunk> chunks;
    for (const auto& [ptr, bytes] : ranges) {
      if (bytes % 16 != 0 || reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
        throw Error("StreamReader: ranges must be 16-byte aligned multiples of 16 bytes");
      for (int64_t off = 0; off < bytes; off += kReadChunkBytes)
        chunks.push_back({reinterpret_cast<const uint4*>(static_cast<const char*>(ptr) + off),
                          std::min(kReadChunkBytes, bytes - off) / 16});
      bytes_ += bytes;
    }
    n_chunks_ = int64_t(chunks.size());
    table_ = DeviceBuffer(n_chunks_ * int64_t(sizeof(ReadChunk)));
    sink_ = DeviceBuffer(16);
    if (n_chunks_ > 0)
      MK_CUDA_CHECK(cudaMemcpy(table_.get(), chunks.data(), chunks.size() * sizeof(ReadChunk), cudaMemcpyHostToDevice));
    int dev = 0, sms = 0, per_sm = 0;
    MK_CUDA_CHECK(cudaGetDevice(&dev));
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    MK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, stream_read_kernel, kReadThreads, 0));
    blocks_ = int(std::max<int64_t>(1, std::min<int64_t>(n_chunks_, int64_t(sms) * std::max(per_sm, 1))));
  }
  int64_t bytes() const { return bytes_; }
  void launch(cudaStream_t stream) const {
    if (n_chunks_ == 0) return;
    stream_read_kernel<<<blocks_, kReadThreads, 0, stream>>>(table_.as<const ReadChunk>(), n_chunks_,
                                                             sink_.as<uint32_t>());
    MK_LAUNCH_CHECK("stream_read_kernel");
  }

 private:
  DeviceBuffer table_, sink_;
  int64_t n_chunks_ = 0, bytes_ = 0;
  int blocks_ = 1;
};

// Median time of streaming one reader per weight copy, rotating copies step by step exactly as
// the stage being compared does (so both see the same L2 state).
inline double rotated_read_ms(const std::vector<StreamReader>& per_copy, cudaStream_t stream, int warmup, int steps) {
  return time_median_ms(stream, warmup, steps, [&](int i) { per_copy[size_t(i) % per_copy.size()].launch(stream); });
}

struct Ceilings {
  double read_TBps = 0;
  int64_t read_bytes = 0;
  double dense_TFLOPs = 0;
  int64_t gemm_dim = 0;
};

// The streaming buffer is >= 2 GiB and >= 8x L2: nearly every byte comes from HBM.
constexpr int64_t kCeilingReadMinBytes = int64_t(2) << 30;
constexpr int64_t kCeilingReadL2Multiple = 8;
// 8192^3: large enough that cuBLAS runs its best tile schedule at full occupancy (1.1 TFLOP/call).
constexpr int64_t kCeilingGemmDim = 8192;
// Warm-up calls before the dense ceiling is timed (~0.5 s): with 10 the first preset of a run
// measured 696-715 TFLOP/s and later ones ~795 on the same H200 (clocks still ramping), which
// inflated that preset's fractions of the ceiling.
constexpr int kCeilingGemmWarmup = 400;

inline Ceilings measure_ceilings(const DeviceInfo& dev, cublasHandle_t blas, cudaStream_t stream, uint64_t seed,
                                 int warmup, int steps) {
  Ceilings c;
  {
    c.read_bytes = std::max(kCeilingReadMinBytes, kCeilingReadL2Multiple * dev.l2_bytes);
    DeviceBuffer buf(c.read_bytes);
    fill_normal_bf16(buf.get(), c.read_bytes / 2, 1.0f, seed, kStreamCeiling, stream);
    std::vector<StreamReader> reader;
    reader.emplace_back(std::vector<std::pair<const void*, int64_t>>{{buf.get(), c.read_bytes}});
    const double ms = rotated_read_ms(reader, stream, warmup, steps);
    c.read_TBps = double(c.read_bytes) / (ms * 1e-3) / 1e12;
  }
  {
    const int64_t n = kCeilingGemmDim;
    c.gemm_dim = n;
    DeviceBuffer a(n * n * 2), b(n * n * 2), out(n * n * 2);
    fill_normal_bf16(a.get(), n * n, 1.0f, seed, kStreamCeiling + 100, stream);
    fill_normal_bf16(b.get(), n * n, 1.0f, seed, kStreamCeiling + 101, stream);
    const float alpha = 1.0f, beta = 0.0f;
    const double ms = time_median_ms(stream, std::max(warmup, kCeilingGemmWarmup), steps, [&](int) {
      MK_CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(n), int(n), &alpha, a.get(), CUDA_R_16BF,
                                   int(n), b.get(), CUDA_R_16BF, int(n), &beta, out.get(), CUDA_R_16BF, int(n),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    c.dense_TFLOPs = 2.0 * double(n) * double(n) * double(n) / (ms * 1e-3) / 1e12;
  }
  return c;
}

}  // namespace

}  // namespace moekit::cli
