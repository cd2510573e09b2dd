// tune_experts.cuh — one precision's side of `moekit tune` (tune.cu): the layer's inputs, the
// oracle, the weight rotation and the read time of one T, and the expert GEMMs it times, for bf16
// weights and for their FP8 copies.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bench.hpp"
#include "ceilings.cuh"
#include "fp8_layer.hpp"
#include "timing.hpp"
#include "tune.hpp"

namespace moekit::cli {

// One precision's side of tuning one T: the layer's inputs, the oracle (its side computed once,
// from the first candidate's checked run: the routing, and so the oracle, the touched experts and
// the read time, do not depend on the plan), the weight copies the timing rotates over, and the
// expert GEMMs it times.
class TunedExperts {
 public:
  virtual ~TunedExperts() = default;
  virtual MoeInputs inputs(const Tensor& x) const = 0;  // on weight copy 0, which the oracle reads
  // The oracle's side and the rotation (keeping extra_free_bytes more free), from a finished run.
  virtual void prepare(const Workspace& ws, const Tensor& x, int64_t extra_free_bytes) = 0;
  virtual bool prepared() const = 0;
  // The finished forward (ws, y) of any plan against the oracle: ok, and one line (or more) why.
  virtual std::pair<bool, std::string> check(const Workspace& ws, const Tensor& y) const = 0;
  // up + down of `plan` on weight copy c, reading the routing (and fp8: x_q) the forward left in ws.
  virtual void up_down(const ForwardPlan& plan, const Tensor& x, const Workspace& ws, int copy) const = 0;
  const WeightRotation& rotation() const { return rotation_; }
  double read_ms() const { return read_ms_; }

 protected:
  TunedExperts(const TuneArgs& args, const MoeShape& shape, const DeviceInfo& dev, cudaStream_t s)
      : args_(args), shape_(shape), dev_(dev), s_(s) {}
  // Times the streaming read of `ranges_of(copy)` over the rotation and says what it found.
  template <class Ranges>
  void time_read(size_t touched, const char* what, const Ranges& ranges_of) {
    std::vector<StreamReader> readers;
    for (int cp = 0; cp < rotation_.copies; ++cp) readers.emplace_back(ranges_of(cp));
    read_ms_ = rotated_read_ms(readers, s_, args_.warmup, args_.steps);
    std::printf("%zu experts touched (%.1f MB of %s), read time %.4f ms%s%s\n", touched,
                double(readers.front().bytes()) / 1e6, what, read_ms_, rotation_.note.empty() ? "" : "; ",
                rotation_.note.c_str());
  }
  const TuneArgs& args_;
  const MoeShape shape_;  // with this T
  const DeviceInfo& dev_;
  cudaStream_t s_;
  WeightRotation rotation_;
  double read_ms_ = 0;
};

// bf16 experts: the layer's own weights, checked by ForwardOracle (check.cpp).
class Bf16Experts final : public TunedExperts {
 public:
  Bf16Experts(const TuneArgs& args, GpuLayer& layer, const MoeShape& shape, const DeviceInfo& dev, cudaStream_t s)
      : TunedExperts(args, shape, dev, s), layer_(layer) {}
  MoeInputs inputs(const Tensor& x) const override { return layer_.inputs(0, x); }
  void prepare(const Workspace& ws, const Tensor& x, int64_t extra_free_bytes) override {
    oracle_.emplace(layer_, shape_, ws, x, args_.check_tokens, args_.seed, s_);
    const std::vector<int32_t> touched = oracle_->touched_experts();
    rotation_ = rotate_weights(layer_, touched, dev_.l2_bytes, extra_free_bytes, s_);
    time_read(touched.size(), "w13 + w2", [&](int cp) { return weight_ranges("experts", layer_, cp, touched); });
  }
  bool prepared() const override { return oracle_.has_value(); }
  std::pair<bool, std::string> check(const Workspace& ws, const Tensor& y) const override {
    const ForwardCheck c = oracle_->check(ws, y, s_);
    return {c.ok, c.summary};
  }
  void up_down(const ForwardPlan& plan, const Tensor& x, const Workspace& ws, int copy) const override {
    expert_up(plan, x, layer_.w13(copy), ws, s_);
    expert_down(plan, layer_.w2(copy), ws.topk_weights, ws, s_);
  }

 private:
  GpuLayer& layer_;
  std::optional<ForwardOracle> oracle_;
};

// fp8 experts: e4m3 copies of the layer's weights (fp8_layer.hpp), checked by Fp8Oracle.
class Fp8Experts final : public TunedExperts {
 public:
  Fp8Experts(const TuneArgs& args, const GpuLayer& layer, Fp8Weights& fp8, const MoeShape& shape,
             const DeviceInfo& dev, cudaStream_t s)
      : TunedExperts(args, shape, dev, s), layer_(layer), fp8_(fp8) {}
  MoeInputs inputs(const Tensor& x) const override {
    MoeInputs in = layer_.inputs(0, x);
    const ExpertWeights w = fp8_.at(0);
    in.w13 = w.w13, in.w2 = w.w2, in.w13_scale = w.w13_scale, in.w2_scale = w.w2_scale;
    return in;
  }
  void prepare(const Workspace& ws, const Tensor& x, int64_t extra_free_bytes) override {
    oracle_.emplace(layer_, fp8_, shape_, ws, x, args_.check_tokens, s_);
    const std::vector<int32_t> touched = oracle_->touched_experts();
    // Sized for the smallest set a timed stage streams: the touched experts' e4m3 w2.
    const int want = rotation_copies_wanted(int64_t(touched.size()) * shape_.hidden * shape_.inter, dev_.l2_bytes);
    rotation_ = weight_rotation(want, fp8_.ensure(want, kKeepFreeBytes + extra_free_bytes, s_), "fp8 weight");
    time_read(touched.size(), "fp8 w13 + w2 and their scales",
              [&](int cp) { return fp8_.ranges("experts", cp, touched); });
  }
  bool prepared() const override { return oracle_.has_value(); }
  std::pair<bool, std::string> check(const Workspace& ws, const Tensor& y) const override {
    Fp8Check c = oracle_->check(ws, y, s_);
    try {
      check_status(ws, s_);  // the status bits, as ForwardOracle checks them for bf16
    } catch (const Error& e) {
      c.ok = false;
      c.summary += std::string("\n  ") + e.what();
    }
    return {c.ok, c.summary};
  }
  void up_down(const ForwardPlan& plan, const Tensor&, const Workspace& ws, int copy) const override {
    const ExpertWeights w = fp8_.at(copy);
    expert_up(plan, ws.x_q, w.w13, ws, s_, w.w13_scale);  // x_q: quantize_tokens ran in the checked forward
    expert_down(plan, w.w2, ws.topk_weights, ws, s_, w.w2_scale);
  }

 private:
  const GpuLayer& layer_;
  Fp8Weights& fp8_;
  std::optional<Fp8Oracle> oracle_;
};

}  // namespace moekit::cli
