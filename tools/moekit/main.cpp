// main.cpp — the `moekit` command line: parses the options of `bench`, `check`, `tune` and `plan`
// (CLI11) and dispatches to run_bench (bench.cu; --dtype fp8: bench_fp8.cu, --ep: bench_ep.cpp,
// --backward: bench_backward.cu), run_check (check.cpp), run_tune (tune.cu) and run_plan
// (plan_cmd.cpp).
//
//   moekit bench --preset deepseek-v3 --tokens 1,16,64,512 --json out.json
//   moekit bench --backward --preset qwen3-30b-a3b --tokens 1,64,4096 --json bwd.json
//   moekit check --cpu
//   moekit tune --preset mixtral-8x7b --tokens 1,2,4,8,16,32,64 --merge
//   moekit tune --dtype fp8 --preset deepseek-v3 --merge
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "bench.hpp"
#include "cli_checks.hpp"
#include "exit_codes.hpp"
#include "plan_cmd.hpp"
#include "report.hpp"
#include "tune.hpp"

namespace {

using moekit::cli::LayerArgs;
using moekit::cli::whole_number;

std::string preset_list() {
  std::string s, m;
  for (const std::string& n : moekit::cli::layer_names(true)) s += (s.empty() ? "" : "|") + n;
  for (const std::string& n : moekit::cli::layer_names(false)) m += (m.empty() ? "" : "|") + n;
  return s + " (tuned), or a public model with no table entry: " + m;
}

// --tokens T,T,... of bench, tune and plan: each a whole number a shape can hold.
void add_tokens_option(CLI::App* cmd, std::vector<int64_t>& tokens, const std::string& help) {
  cmd->add_option("--tokens", tokens, help)
      ->delimiter(',')
      ->capture_default_str()
      ->check(whole_number(1, moekit::cli::kMaxTokensFlag));
}

// --dtype bf16|fp8 of bench, tune and plan.
void add_dtype_option(CLI::App* cmd, std::string& dtype, const std::string& help) {
  cmd->add_option("--dtype", dtype, help)->check(CLI::IsMember({"bf16", "fp8"}))->capture_default_str();
}

// --steps and --warmup of bench and tune.
void add_timing_options(CLI::App* cmd, int& steps, int& warmup, const std::string& steps_help) {
  cmd->add_option("--steps", steps, steps_help)->capture_default_str()->check(whole_number(1, moekit::cli::kMaxStepsFlag));
  cmd->add_option("--warmup", warmup, "untimed iterations first")
      ->capture_default_str()
      ->check(whole_number(0, moekit::cli::kMaxStepsFlag));
}

// --seed and --check-tokens of bench, check and tune: the random inputs, and the tokens the CPU
// oracle checks.
void add_oracle_options(CLI::App* cmd, uint64_t& seed, int& check_tokens, const std::string& check_help) {
  cmd->add_option("--seed", seed, "seed of every random input")->capture_default_str();
  cmd->add_option("--check-tokens", check_tokens, check_help)->capture_default_str()->check(whole_number(1, 1 << 20));
}

void add_layer_options(CLI::App* cmd, LayerArgs& a, bool full) {
  cmd->add_option("--preset", a.preset, "model layer: " + preset_list())->capture_default_str();
  if (!full) return;
  // Ranges here are what a number can be at all; the layer's rules (multiples, k <= E, groups)
  // are checked on the whole layer (check_layer) before any device is asked for.
  cmd->add_option("--hidden", a.hidden, "H: hidden size (overrides the preset)")->check(whole_number(1, moekit::kMaxHidden));
  cmd->add_option("--inter", a.inter, "F: expert intermediate size")->check(whole_number(1, moekit::kMaxInter));
  cmd->add_option("--experts", a.experts, "E: number of experts")->check(whole_number(1, moekit::kMaxExperts));
  cmd->add_option("--topk", a.topk, "k: experts per token")->check(whole_number(1, moekit::kMaxTopk));
  cmd->add_option("--n-group", a.n_group, "expert groups for grouped top-k (0 = off)")->check(whole_number(0, 32));
  cmd->add_option("--topk-group", a.topk_group, "groups kept per token when --n-group > 0")
      ->check(whole_number(0, 32));
  cmd->add_option("--scoring", a.scoring, "softmax|sigmoid")->check(CLI::IsMember({"softmax", "sigmoid"}));
  auto* renorm = cmd->add_flag("--renormalize", a.renormalize, "divide the k weights by their sum");
  cmd->add_flag("--no-renormalize", a.no_renormalize, "keep the raw scores as weights")->excludes(renorm);
  cmd->add_option("--scaling-factor", a.routed_scaling_factor, "routed scaling factor of the weights");
  auto* bias = cmd->add_flag("--score-bias", a.score_bias, "add a random score-correction bias (selection only)");
  cmd->add_flag("--no-score-bias", a.no_score_bias, "no score-correction bias")->excludes(bias);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moekit — Mixture-of-Experts layer kernels for NVIDIA Hopper (sm_90a)", "moekit"};
  app.set_version_flag("--version", std::string("moekit ") + moekit::cli::kVersion);
  app.require_subcommand(1);

  moekit::cli::BenchArgs bench;
  CLI::App* bench_cmd = app.add_subcommand(
      "bench", "check, then time every stage of the layer against ceilings and cuBLAS baselines (needs a Hopper GPU)");
  add_layer_options(bench_cmd, bench.layer, true);
  add_tokens_option(bench_cmd, bench.tokens, "token counts T, comma-separated");
  add_timing_options(bench_cmd, bench.steps, bench.warmup, "timed iterations (median reported)");
  bench_cmd->add_flag("--skew", bench.skew,
                      "skewed expert loads (0.5-1.5x the mean, one expert at 4x) from a calibrated router bias");
  bench_cmd->add_option("--json", bench.json, "write the rows to this JSON file");
  bench_cmd->add_option("--csv", bench.csv, "write the rows to this CSV file (the --json rows' fields, one line each)");
  bench_cmd->add_flag("--no-baselines", bench.no_baselines, "skip the cuBLAS baselines");
  add_dtype_option(bench_cmd, bench.dtype, "expert weights: bf16, or fp8 (DeepSeek-V3's e4m3 with 128x128 block scales)");
  add_oracle_options(bench_cmd, bench.seed, bench.check_tokens, "tokens the oracle checks before timing");
  bench_cmd->add_option("--ep", bench.ep,
                        "expert parallelism over R GPUs of this host (R processes over NCCL); --tokens are per rank")
      ->check(whole_number(1, 8));
  bench_cmd->add_option("--ep-mode", bench.ep_mode, "EP exchange: prefill (counts first), decode (fixed messages, CUDA "
                                                    "graph) or auto (decode for T <= 128 per rank)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "prefill", "decode"}));
  bench_cmd->add_option("--ep-capacity", bench.ep_capacity,
                        "decode rows per (source, destination) message; 0: T*min(k, S), never overflows")
      ->capture_default_str()
      ->check(whole_number(0, moekit::cli::kMaxTokensFlag));
  CLI::Option* backward_flag = bench_cmd->add_flag("--backward", bench.backward,
                      "time the bf16 backward instead (moe_backward: h recomputed, the router's gate gradient, dx and "
                      "dW), its forward + backward as one graph, and a cuBLAS loop of its GEMMs");
  bench_cmd->add_flag("--backward-mma-sync", bench.backward_mma_sync,
                      "with --backward: run its h, D, dx and dW GEMMs on the mma.sync tile instead of the wgmma kernel the "
                      "planner picks (h, D, dx where the layout's block_m is 128, dW at every block_m; use_wgmma_gemms(plan, "
                      "false, false, false, false))")
      ->needs(backward_flag);

  moekit::cli::CheckArgs check;
  CLI::App* check_cmd = app.add_subcommand(
      "check", "compare the GPU forward pass with the CPU oracle (needs a Hopper GPU), or with --cpu self-check the oracle");
  add_layer_options(check_cmd, check.layer, true);
  CLI::Option* tokens_opt =
      check_cmd->add_option("--tokens", check.tokens, "T (GPU: default 16; --cpu: default 37)")->check(whole_number(1, moekit::cli::kMaxTokensFlag));
  check_cmd->add_flag("--cpu", check.cpu, "run the CPU oracle on a scaled-down layer, even with a GPU");
  add_oracle_options(check_cmd, check.seed, check.check_tokens, "tokens the oracle checks (GPU)");

  moekit::cli::TuneArgs tune;
  CLI::App* tune_cmd = app.add_subcommand(
      "tune", "time every compiled tile config per T (each checked against the oracle first) and write the fastest "
              "to the device's table in configs/ (needs a Hopper GPU)");
  add_layer_options(tune_cmd, tune.layer, true);
  add_tokens_option(tune_cmd, tune.tokens, "token counts T, comma-separated (each one bucket of the table)");
  add_timing_options(tune_cmd, tune.steps, tune.warmup, "timed iterations per candidate (median kept)");
  tune_cmd->add_option("--out", tune.out, "table file (default: configs/<device>.json, e.g. configs/nvidia-h200.json)");
  tune_cmd->add_flag("--merge", tune.merge,
                     "keep this shape's entries at token counts not measured now (default: replace the shape's entries; "
                     "other shapes' entries are always kept)");
  tune_cmd->add_flag("--exhaustive", tune.exhaustive, "time every candidate in full (no 3-step screen)");
  add_oracle_options(tune_cmd, tune.seed, tune.check_tokens, "tokens the oracle checks per candidate");
  tune_cmd->add_option("--candidates", tune.candidates,
                       "also append one JSON line per candidate and T to this file (its configs, outcome and time: "
                       "the data a cost model of the kernels is fitted to)");
  add_dtype_option(tune_cmd, tune.dtype,
                   "expert weights: bf16, or fp8 (DeepSeek-V3's e4m3 with 128x128 block scales); each precision has "
                   "buckets of its own in the table");

  moekit::cli::PlanArgs plan;
  CLI::App* plan_cmd = app.add_subcommand(
      "plan", "print what the planner chooses for a layer at each T, and its cost model's ranking of the tile "
              "candidates (no GPU needed with a described --device)");
  add_layer_options(plan_cmd, plan.layer, true);
  add_tokens_option(plan_cmd, plan.tokens, "token counts T, comma-separated");
  add_dtype_option(plan_cmd, plan.dtype, "expert weights: bf16 or fp8");
  plan_cmd->add_option("--device", plan.device,
                       "h200 or h100 (the GPUs of the runs of record, described: the H200's tables apply), or current")
      ->check(CLI::IsMember({"h200", "h100", "current"}))
      ->capture_default_str();
  plan_cmd->add_option("--top", plan.top, "candidates listed per T, cheapest by the model first")
      ->capture_default_str()
      ->check(whole_number(0, 1000));

  for (CLI::App* cmd : {&app, bench_cmd, check_cmd, tune_cmd, plan_cmd}) cmd->footer(moekit::cli::kExitCodesHelp);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every parse error (an unknown flag, a bad number) is a usage error.
    return app.exit(e) == 0 ? moekit::cli::kExitOk : moekit::cli::kExitUsage;
  }
  check.tokens_given = tokens_opt->count() > 0;

  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);

  try {
    // The layer the flags describe, checked before any command asks for a device.
    using moekit::cli::check_layer;
    if (bench_cmd->parsed()) moekit::cli::check_bench_mode(bench);
    if (bench_cmd->parsed()) check_layer(moekit::cli::resolve_layer(bench.layer), bench.dtype, bench.tokens);
    if (tune_cmd->parsed()) check_layer(moekit::cli::resolve_layer(tune.layer), tune.dtype, tune.tokens);
    if (plan_cmd->parsed()) check_layer(moekit::cli::resolve_layer(plan.layer), plan.dtype, plan.tokens);
    if (check_cmd->parsed() && check.cpu) {
      const moekit::cli::LayerSpec preset = moekit::cli::resolve_layer(check.layer);
      moekit::cli::check_cpu_layer(check.layer, preset);
      const int64_t T = check.tokens_given ? check.tokens : moekit::cli::kCpuOracleTokens;
      check_layer(moekit::cli::cpu_oracle_spec(check.layer, preset, T, false), "bf16", {T});
    } else if (check_cmd->parsed()) {
      check_layer(moekit::cli::resolve_layer(check.layer), "bf16", {check.tokens});
    }
    if (bench_cmd->parsed() && bench.ep > 0 && !bench.csv.empty())
      throw moekit::cli::UsageError("--csv: bench --ep writes --json only");
    if (bench_cmd->parsed() && bench.ep > 0) return moekit::cli::run_bench_ep(bench, command, argc, argv);
    if (bench_cmd->parsed() && bench.backward) return moekit::cli::run_bench_backward(bench, command);
    if (bench_cmd->parsed())
      return bench.dtype == "fp8" ? moekit::cli::run_bench_fp8(bench, command) : moekit::cli::run_bench(bench, command);
    if (check_cmd->parsed()) return moekit::cli::run_check(check);
    if (tune_cmd->parsed()) return moekit::cli::run_tune(tune, command);
    if (plan_cmd->parsed()) return moekit::cli::run_plan(plan);
  } catch (const moekit::cli::UsageError& e) {
    std::fprintf(stderr, "moekit: error: %s\nRun with --help for more information.\n", e.what());
    return moekit::cli::kExitUsage;
  } catch (const moekit::Error& e) {
    std::fprintf(stderr, "moekit: error: %s\n", e.what());
  } catch (const moekit::CudaError& e) {
    std::fprintf(stderr, "moekit: CUDA error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit: error: %s\n", e.what());
  }
  return moekit::cli::kExitFailed;
}
