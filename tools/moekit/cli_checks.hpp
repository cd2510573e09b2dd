// cli_checks.hpp — what the command line checks before any command asks for a device: every
// number a flag takes (CLI11 validators with readable ranges), the layer the flags describe
// (H, F, E, k, the T list, grouped top-k, --dtype's rules) and the flags a bench mode refuses
// (--backward with --dtype fp8 or --ep), each error naming its flag. The shape
// rules are the library's own (plan_forward_with runs them, no device needed); the flags only name
// them. Included by main.cpp, the CLI11 translation unit.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cpu_oracle.hpp"
#include "exit_codes.hpp"
#include "moekit/moe.hpp"
#include "presets.hpp"

namespace moekit::cli {

// A whole number in [lo, hi]: "expected a whole number in [1, 2147483646], got 'abc'". Replaces
// CLI::PositiveNumber, whose message prints DBL_MAX in full (300 digits).
inline CLI::Validator whole_number(int64_t lo, int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        int64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec == std::errc::result_out_of_range || (ec == std::errc() && end == s.data() + s.size() && (v < lo || v > hi)))
          return "expected a whole number in " + range + ", got " + s;
        if (ec != std::errc() || end != s.data() + s.size() || s.empty())
          return "expected a whole number in " + range + ", got '" + s + "'";
        return "";
      },
      "INT in " + range);
}

// The largest --tokens any layer can take (32-bit assignment ids, kMaxLayoutRows); the layer's own
// limit (T·k and E) is checked with the layer.
inline constexpr int64_t kMaxTokensFlag = kMaxLayoutRows;
inline constexpr int64_t kMaxStepsFlag = 1000000;

namespace detail_cli {

inline void need(bool ok, const std::string& flag, const std::string& what, int64_t got) {
  if (!ok) throw UsageError(flag + ": " + what + ", got " + std::to_string(got));
}

}  // namespace detail_cli

// The layer of `spec` (a preset with the flags applied) at each T of `tokens`, in `dtype`: the
// library's shape rules (the first error names its flag), grouped top-k as the router takes it.
inline void check_layer(const LayerSpec& spec, const std::string& dtype, const std::vector<int64_t>& tokens) {
  using detail_cli::need;
  const MoeShape& s = spec.shape;
  need(s.hidden > 0 && s.hidden % 8 == 0 && s.hidden <= kMaxHidden, "--hidden",
       "H must be a positive multiple of 8 (16-byte bf16 rows), at most " + std::to_string(kMaxHidden), s.hidden);
  need(s.inter > 0 && s.inter % 8 == 0 && s.inter <= kMaxInter, "--inter",
       "F must be a positive multiple of 8 (16-byte bf16 rows), at most " + std::to_string(kMaxInter), s.inter);
  if (dtype == "fp8") {
    need(s.hidden % 16 == 0, "--hidden", "--dtype fp8 needs H a multiple of 16 (16-byte rows of e4m3)", s.hidden);
    need(s.inter % 16 == 0, "--inter", "--dtype fp8 needs F a multiple of 16 (16-byte rows of e4m3)", s.inter);
  }
  need(s.experts >= 1 && s.experts <= kMaxExperts, "--experts",
       "E must be in [1, " + std::to_string(kMaxExperts) + "] (the router's kernels)", s.experts);
  need(s.topk >= 1 && s.topk <= std::min(kMaxTopk, s.experts), "--topk",
       "k must be in [1, min(" + std::to_string(kMaxTopk) + ", E = " + std::to_string(s.experts) + ")]", s.topk);
  const RouterOptions& r = spec.router;
  need(r.n_group >= 0 && r.n_group <= 32, "--n-group", "must be in [0, 32] (0: grouped top-k off)", r.n_group);
  if (r.n_group > 0) {
    need(s.experts % r.n_group == 0, "--n-group",
         "must divide E = " + std::to_string(s.experts) + " into equal groups", r.n_group);
    need(r.topk_group >= 1 && r.topk_group <= r.n_group, "--topk-group",
         "must be in [1, n_group = " + std::to_string(r.n_group) + "]", r.topk_group);
    need(r.topk_group * (s.experts / r.n_group) >= s.topk, "--topk-group",
         "the kept groups must hold at least k = " + std::to_string(s.topk) + " experts (topk_group * E / n_group)",
         r.topk_group);
  }
  // T and what T·k makes (the 32-bit layout): the library's rule, on a bf16 config of every block_m.
  const GemmConfig& cfg = compiled_gemm_configs(Precision::bf16).front();
  for (int64_t T : tokens) {
    MoeShape at = s;
    at.tokens = T;
    need(T >= 1 && T <= kMaxTokensFlag, "--tokens", "T must be in [1, " + std::to_string(kMaxTokensFlag) + "]", T);
    try {
      plan_forward_with(at, cfg, cfg);
    } catch (const Error& e) {
      throw UsageError("--tokens " + std::to_string(T) + ": " + e.what());
    }
  }
}

// `bench --backward` times the bf16 backward on one GPU: the flags of the other bench modes are
// refused by name, before any device is asked for.
inline void check_bench_mode(const BenchArgs& b) {
  if (!b.backward) return;
  if (b.dtype != "bf16")
    throw UsageError("--backward: the backward is bf16 only (there is no FP8 backward); drop --dtype " + b.dtype);
  if (b.ep > 0)
    throw UsageError("--backward: bench --ep times the expert-parallel forward only (there is no EP backward); "
                     "drop --ep");
}

// `check --cpu` runs the oracle on a scaled-down layer: the preset's E down to
// kCpuOracleMaxExperts, H and F to kCpuOracleHidden / kCpuOracleInter. A value given on the command
// line is honoured, or refused here when the oracle cannot take it — never clamped.
inline void check_cpu_layer(const LayerArgs& a, const LayerSpec& spec) {
  using detail_cli::need;
  if (a.experts >= 0)
    need(a.experts <= kCpuOracleMaxExperts, "--experts",
         "check --cpu runs at most " + std::to_string(kCpuOracleMaxExperts) + " experts (drop --cpu for the GPU check)",
         a.experts);
  if (a.hidden >= 0)
    need(a.hidden <= kCpuOracleMaxDim, "--hidden",
         "check --cpu runs H up to " + std::to_string(kCpuOracleMaxDim) + " (a double-precision loop)", a.hidden);
  if (a.inter >= 0)
    need(a.inter <= kCpuOracleMaxDim, "--inter",
         "check --cpu runs F up to " + std::to_string(kCpuOracleMaxDim) + " (a double-precision loop)", a.inter);
  const int64_t experts = a.experts >= 0 ? a.experts : std::min(spec.shape.experts, kCpuOracleMaxExperts);
  if (a.topk >= 0)
    need(a.topk <= experts, "--topk",
         "k must be at most the E = " + std::to_string(experts) + " experts check --cpu runs", a.topk);
}

}  // namespace moekit::cli
