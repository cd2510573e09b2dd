// timing.hpp — how `moekit bench` and `moekit tune` time GPU work alike: CUDA graphs, one per
// weight copy, replayed in rotation so the timed weights come from HBM and not from L2; the byte
// ranges of the weights a stage reads (its "read time" streams exactly those); the run's date.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "layer.hpp"
#include "tool_util.hpp"

namespace moekit::cli {

inline std::string iso_utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

// Timed weights must come from HBM, not L2: when the touched experts' bytes are below
// kRotateL2Multiple x L2, successive steps rotate among bitwise-identical weight copies whose
// touched bytes together exceed it, so a copy's lines are evicted before that copy comes back.
// (Activations and the workspace are not rotated: in a model they are hot in L2 as well. w_gate,
// 0.03-3.7 MB, rotates only with the weight copies; where they are few it may hit in L2, which
// can understate the router by at most its HBM read time, about 1 us.)
inline constexpr int64_t kRotateL2Multiple = 4;
inline constexpr int kMaxWeightCopies = 64;
// Device memory kept free when adding copies: room for the baselines' buffers and cuBLAS.
inline constexpr int64_t kKeepFreeBytes = int64_t(2) << 30;

struct WeightRotation {
  int copies = 1;    // weight copies to rotate among for this routing
  std::string note;  // "rotating N weight copies" (and why fewer than wanted), or empty
};

// Copies a rotation wants when the smallest set of bytes a timed stage streams is smallest_bytes:
// enough that those bytes of all copies together pass kRotateL2Multiple x L2 (at most
// kMaxWeightCopies).
inline int rotation_copies_wanted(int64_t smallest_bytes, int64_t l2_bytes) {
  const int64_t rotate_bytes = kRotateL2Multiple * l2_bytes;
  return smallest_bytes >= rotate_bytes
             ? 1
             : int(std::min<int64_t>(kMaxWeightCopies, (rotate_bytes + smallest_bytes - 1) / smallest_bytes));
}

// The rotation over min(want, held) copies, with its note ("rotating N <what> copies", and why
// fewer than wanted).
inline WeightRotation weight_rotation(int want, int held, const std::string& what) {
  WeightRotation r;
  r.copies = std::min(want, held);
  r.note = r.copies > 1 ? "rotating " + std::to_string(r.copies) + " " + what + " copies" : "";
  if (r.copies < want)
    r.note += (r.note.empty() ? "" : " ") + std::string("(L2 rotation wanted ") + std::to_string(want) + " " + what +
              " copies: capped by device memory)";
  return r;
}

// The weight copies a routing touching `touched` experts needs (added to `layer` as required),
// keeping kKeepFreeBytes + extra_free_bytes of device memory free. Copies made for an earlier T
// stay allocated; the rotation uses only as many as this routing needs.
inline WeightRotation rotate_weights(GpuLayer& layer, const std::vector<int32_t>& touched, int64_t l2_bytes,
                                     int64_t extra_free_bytes, cudaStream_t stream) {
  const MoeShape& s = layer.spec().shape;
  // Sized for the smallest set a timed stage streams (down: the touched w2 slices, a third of
  // the touched bytes), so every expert stage rotates past kRotateL2Multiple x L2.
  const int want = rotation_copies_wanted(int64_t(touched.size()) * s.hidden * s.inter * 2, l2_bytes);
  return weight_rotation(want, layer.ensure_copies(want, kKeepFreeBytes + extra_free_bytes, stream), "weight");
}

// Byte ranges of the weights `stage` reads in weight copy c: what its read time streams.
inline std::vector<std::pair<const void*, int64_t>> weight_ranges(const std::string& stage, const GpuLayer& layer,
                                                                  int c, const std::vector<int32_t>& touched) {
  const MoeShape& s = layer.spec().shape;
  const int64_t w13_e = 2 * s.inter * s.hidden * 2, w2_e = s.hidden * s.inter * 2;  // bytes per expert
  std::vector<std::pair<const void*, int64_t>> r;
  const bool router = stage == "router" || stage == "layer";
  const bool up = stage == "up" || stage == "experts" || stage == "layer";
  const bool down = stage == "down" || stage == "experts" || stage == "layer";
  if (router) r.emplace_back(layer.w_gate(c).data, s.experts * s.hidden * 2);
  for (int32_t e : touched) {
    if (up) r.emplace_back(static_cast<const char*>(layer.w13(c).data) + e * w13_e, w13_e);
    if (down) r.emplace_back(static_cast<const char*>(layer.w2(c).data) + e * w2_e, w2_e);
  }
  return r;
}

// One instantiated CUDA graph of the whole layer per weight copy.
class LayerGraphs {
 public:
  LayerGraphs() = default;
  LayerGraphs(const LayerGraphs&) = delete;
  LayerGraphs& operator=(const LayerGraphs&) = delete;
  ~LayerGraphs() {
    for (cudaGraphExec_t e : exec_) cudaGraphExecDestroy(e);
  }
  // Global capture mode: any unsafe CUDA call inside moe_forward (a sync, an allocation) fails.
  void capture(const std::function<void()>& enqueue, cudaStream_t stream) {
    cudaGraph_t graph = nullptr;
    MK_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    try {
      enqueue();
    } catch (...) {
      // Leave the stream usable; the error being thrown already says what went wrong.
      if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
      throw;
    }
    MK_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    MK_CUDA_CHECK(cudaGraphDestroy(graph));
    MK_CUDA_CHECK(err);
    exec_.push_back(exec);
  }
  void launch(int i, cudaStream_t stream) const { MK_CUDA_CHECK(cudaGraphLaunch(exec_.at(size_t(i)), stream)); }

 private:
  std::vector<cudaGraphExec_t> exec_;
};

// Captures one graph per weight copy c of `reps` back-to-back calls step((c + r) % copies), so
// the L2 rotation holds inside a graph too.
inline void capture_rotated(LayerGraphs& graphs, const std::function<void(int)>& step, int copies, int reps,
                            cudaStream_t stream) {
  for (int c = 0; c < copies; ++c)
    graphs.capture([&] {
      for (int r = 0; r < reps; ++r) step((c + r) % copies);
    }, stream);
}

// Median time of one graph launch, graphs launched in rotation (i % copies).
inline double time_rotated_ms(const LayerGraphs& graphs, int copies, int warmup, int steps, cudaStream_t stream) {
  return time_median_ms(stream, warmup, steps, [&](int i) { graphs.launch(i % copies, stream); });
}

// A bench's stage -> median ms, with the SM clock and power its timed loop sampled: assigning a
// stage's time (the value of time_median_ms or a timer built on it) records that loop's clocks.
class StageTimes {
 public:
  class Slot {
   public:
    Slot(StageTimes& t, std::string stage) : t_(t), stage_(std::move(stage)) {}
    Slot& operator=(double ms) {
      t_.ms_[stage_] = ms;
      t_.clocks_[stage_] = last_timed_clocks();
      return *this;
    }
    operator double() const { return t_.ms_.at(stage_); }

   private:
    StageTimes& t_;
    std::string stage_;
  };
  Slot operator[](const std::string& stage) { return {*this, stage}; }
  std::optional<ClockStats> clocks(const std::string& stage) const {
    const auto it = clocks_.find(stage);
    return it == clocks_.end() ? std::nullopt : it->second;
  }

 private:
  std::map<std::string, double> ms_;
  std::map<std::string, std::optional<ClockStats>> clocks_;
};

// Median time of one step(c): `reps` back-to-back calls captured per weight copy
// (capture_rotated), the graphs replayed in rotation, divided by reps.
inline double rotated_graph_ms(const std::function<void(int)>& step, int copies, int reps, int warmup, int steps,
                               cudaStream_t stream) {
  LayerGraphs graphs;
  capture_rotated(graphs, step, copies, reps, stream);
  return time_rotated_ms(graphs, copies, warmup, steps, stream) / reps;
}

}  // namespace moekit::cli
