// tune.cu — `moekit tune`: for each T, every candidate tile config of the layer in one precision
// (moekit/tuning.hpp: tune_candidates) is run once and checked against the CPU oracle (bf16:
// check.cpp, the check bench runs; fp8: fp8_layer.hpp, the check of bench --dtype fp8; the
// oracle's side computed once per T), then its up + down + combine is timed as CUDA graphs rotated
// over weight copies (timing.hpp: as bench times stages); the fastest passing one becomes that
// T's entry of configs/<device>.json, bucketed by rows per expert among that precision's points
// (bucket_bounds). cmake/tuning_tables.cmake compiles that file into the library, where
// plan_forward reads it.
//
//   build/moekit tune --preset mixtral-8x7b --tokens 1,2,4,8,16,32,64 --out configs/nvidia-h200.json --merge
//   build/moekit tune --dtype fp8 --preset deepseek-v3 --merge
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "bench.hpp"
#include "ceilings.cuh"
#include "fp8_layer.hpp"
#include "rng.hpp"
#include "timing.hpp"
#include "tune.hpp"
#include "tune_experts.cuh"

namespace moekit::cli {

namespace {

// A candidate is first timed for kScreenSteps steps after one warm-up; one slower than
// kScreenSlack x the best full median so far is dropped without its full timing. 25% is far above
// the step-to-step spread of a graph replay (a few %), so a dropped candidate could not have won;
// prefill candidates on decode tiles are 5-10x slower and would otherwise dominate the run.
constexpr int kScreenSteps = 3;
constexpr double kScreenSlack = 1.25;
// Device memory left free beside a candidate's workspace (cuBLAS is not used; the graphs and the
// read-time chunk tables need little).
constexpr int64_t kWorkspaceMarginBytes = int64_t(1) << 30;

std::string describe(const tuning::TileChoice& c) {
  std::string s = c.up == c.down ? c.up.str() : "up " + c.up.str() + " / down " + c.down.str();
  if (c.down_splits > 1) s += " split " + std::to_string(c.down_splits);
  return s;
}

struct TuneContext {
  const TuneArgs& args;
  GpuLayer& layer;
  Fp8Weights* fp8;  // the FP8 copies for --dtype fp8; nullptr for bf16
  const DeviceInfo& dev;
  cudaStream_t stream;
  std::chrono::steady_clock::time_point start;  // when the run began (the candidates' elapsed time)
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

struct TokensResult {
  std::optional<tuning::TuningRecord> record;  // none when no candidate passed
  int failed = 0;                              // candidates that failed the check or determinism
};

TokensResult tune_tokens(const TuneContext& cx, int64_t T) {
  const TuneArgs& args = cx.args;
  const cudaStream_t s = cx.stream;
  MoeShape shape = cx.layer.spec().shape;
  shape.tokens = T;
  const int64_t H = shape.hidden;
  const Precision precision = cx.fp8 ? Precision::fp8 : Precision::bf16;
  TokensResult result;
  std::unique_ptr<TunedExperts> held;
  if (cx.fp8) held = std::make_unique<Fp8Experts>(args, cx.layer, *cx.fp8, shape, cx.dev, s);
  else held = std::make_unique<Bf16Experts>(args, cx.layer, shape, cx.dev, s);
  TunedExperts& experts = *held;

  // The heuristic's choice goes first: a strong baseline early makes the screen effective, and
  // its time is recorded beside the winner's.
  const ForwardPlan heuristic = plan_forward_heuristic(shape, cx.dev, precision);
  const tuning::TileChoice heuristic_choice{heuristic.up, heuristic.down, heuristic.down_splits};
  std::vector<tuning::TileChoice> candidates = tuning::tune_candidates(shape, cx.dev, precision);
  std::erase(candidates, heuristic_choice);
  candidates.insert(candidates.begin(), heuristic_choice);
  const int n = int(candidates.size());
  const auto t_start = std::chrono::steady_clock::now();
  std::printf("\nT=%lld (%.4g rows per expert): %d %s candidates; the heuristic's first\n", (long long)T,
              tuning::rows_per_expert(shape), n, precision_name(precision));

  const DeviceBuffer x = random_activations(T, H, args.seed, kStreamX, s);
  const DeviceBuffer y(T * H * 2);
  const Tensor xt(x.get(), DType::bf16, {T, H}), yt(y.get(), DType::bf16, {T, H});
  std::vector<uint16_t> y_checked(size_t(T * H)), y_after(size_t(T * H));

  // The largest workspace any candidate plans: the weight copies must leave room for it.
  int64_t max_ws_bytes = 0;
  for (const tuning::TileChoice& c : candidates)
    max_ws_bytes = std::max<int64_t>(max_ws_bytes, int64_t(workspace_bytes(plan_forward_with(shape, c.up, c.down, c.down_splits))));

  std::optional<tuning::TileChoice> best;
  double best_ms = 0;
  std::optional<double> heuristic_ms;
  auto line = [&](int i, const char* outcome, std::optional<double> ms, std::string note = {}) {  // --candidates
    if (args.candidates.empty()) return;
    const tuning::TileChoice& c = candidates[size_t(i)];
    append_candidate_line(args.candidates, {shape.hidden, shape.inter, shape.experts, shape.topk, T, precision_name(precision),
                                            c.up.str(), c.down.str(), c.down_splits, i == 0, outcome, ms,
                                            experts.prepared() ? std::optional<double>(experts.read_ms()) : std::nullopt,
                                            tuning::model_estimate_us(shape, c, cx.dev, precision) / 1000, std::move(note)});
  };

  for (int i = 0; i < n; ++i) {
    const tuning::TileChoice& c = candidates[size_t(i)];
    // Each candidate's line, formatted when it is printed (after the candidate ran): the time
    // since `moekit tune` started, and what this T's remaining candidates should take at the mean
    // of those done so far.
    auto head = [&, i] {
      const double run_s = seconds_since(cx.start), t_s = seconds_since(t_start);
      const double left_s = t_s / double(i + 1) * double(n - i - 1);
      char b[256];
      std::snprintf(b, sizeof b, "[%d/%d %.0fs elapsed, ~%.0fs left for T=%lld] %s%s", i + 1, n, run_s, left_s,
                    (long long)T, describe(c).c_str(), i == 0 ? " (heuristic)" : "");
      return std::string(b);
    };
    try {
      const ForwardPlan plan = plan_forward_with(shape, c.up, c.down, c.down_splits);
      const int64_t ws_bytes = int64_t(workspace_bytes(plan));
      size_t free_bytes = 0, total_bytes = 0;
      MK_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
      if (ws_bytes + kWorkspaceMarginBytes > int64_t(free_bytes)) {
        std::printf("%s: skipped: its workspace needs %.2f GB, %.2f GB free\n", head().c_str(), double(ws_bytes) / 1e9,
                    double(free_bytes) / 1e9);
        line(i, "skipped", std::nullopt, "workspace");
        continue;
      }
      const DeviceBuffer wsbuf(ws_bytes);
      const Workspace ws = carve_workspace(plan, wsbuf.get(), size_t(ws_bytes));

      // ---- check before timing: y poisoned (0xffff, a bf16 NaN), one forward on weight copy 0,
      // the oracle (its side computed from the first candidate's run).
      MK_CUDA_CHECK(cudaMemsetAsync(y.get(), 0xff, size_t(y.bytes()), s));
      moe_forward(plan, experts.inputs(xt), cx.layer.spec().router, yt, wsbuf.get(), size_t(ws_bytes), s);
      if (!experts.prepared()) experts.prepare(ws, xt, max_ws_bytes);
      const auto [ok, summary] = experts.check(ws, yt);
      if (!ok) {
        std::printf("%s: CHECK FAILED, not timed\n  %s\n", head().c_str(), summary.c_str());
        line(i, "check_failed", std::nullopt, summary);
        ++result.failed;
        continue;
      }
      MK_CUDA_CHECK(cudaMemcpy(y_checked.data(), y.get(), size_t(y.bytes()), cudaMemcpyDeviceToHost));

      // ---- up + down + combine as one graph per weight copy. Combine is in: split-K moves work
      // into it (FP32 partials, S x T*k*H*4 bytes), so without it more splits would look free.
      const int copies = experts.rotation().copies;
      LayerGraphs graphs;
      capture_rotated(graphs, [&](int cp) {
        experts.up_down(plan, xt, ws, cp);
        if (plan.down_splits > 1) combine_partials(ws.y_partials, shape.topk, yt, s);
        else combine(ws.y_rows, shape.topk, yt, s);
      }, copies, 1, s);
      if (best && !args.exhaustive) {
        const double screen_ms = time_rotated_ms(graphs, copies, 1, kScreenSteps, s);
        if (screen_ms > kScreenSlack * best_ms) {
          std::printf("%s: screened out: %.4f ms over %d steps, > %.2fx the best %.4f ms\n", head().c_str(), screen_ms,
                      kScreenSteps, kScreenSlack, best_ms);
          line(i, "screened", screen_ms);
          continue;
        }
      }
      const double ms = time_rotated_ms(graphs, copies, args.warmup, args.steps, s);

      // ---- determinism: the timed replays rewrote y; it must be bitwise the checked y.
      MK_CUDA_CHECK(cudaStreamSynchronize(s));
      MK_CUDA_CHECK(cudaMemcpy(y_after.data(), y.get(), size_t(y.bytes()), cudaMemcpyDeviceToHost));
      if (y_after != y_checked) {
        std::printf("%s: DETERMINISM FAILED: y after the timed runs differs from the checked y\n", head().c_str());
        line(i, "determinism_failed", ms);
        ++result.failed;
        continue;
      }
      const bool is_best = !best || ms < best_ms;
      std::printf("%s: %.4f ms, %.0f%% of read, model %.4f ms%s\n", head().c_str(), ms, 100.0 * experts.read_ms() / ms,
                  tuning::model_estimate_us(shape, c, cx.dev, precision) / 1000, is_best ? " (best so far)" : "");
      line(i, "timed", ms);
      if (i == 0) heuristic_ms = ms;
      if (is_best) {
        best = c;
        best_ms = ms;
      }
    } catch (const Error& e) {
      std::printf("%s: skipped: %s\n", head().c_str(), e.what());
      line(i, "skipped", std::nullopt, e.what());
    }
  }

  if (!best) {
    std::printf("T=%lld: no candidate passed; no entry\n", (long long)T);
    return result;
  }
  std::printf("T=%lld best: %s, %.4f ms (%.0f%% of read)", (long long)T, describe(*best).c_str(), best_ms,
              100.0 * experts.read_ms() / best_ms);
  if (heuristic_ms) std::printf("; the heuristic's %.4f ms is %.1f%% slower", *heuristic_ms, 100.0 * (*heuristic_ms / best_ms - 1));
  std::printf("\n");
  tuning::TuningRecord r;
  r.hidden = shape.hidden;
  r.inter = shape.inter;
  r.experts = shape.experts;
  r.topk = shape.topk;
  r.tokens = T;
  r.up = best->up.str();
  r.down = best->down.str();
  r.down_splits = best->down_splits;
  r.ms = best_ms;
  r.frac_read = experts.read_ms() / best_ms;
  r.heuristic_ms = heuristic_ms;
  r.date = iso_utc_now();
  result.record = r;
  return result;
}

}  // namespace

int run_tune(const TuneArgs& args, const std::string& command) {
  const auto run_start = std::chrono::steady_clock::now();
  const LayerSpec spec = resolve_layer(args.layer);  // option errors first, GPU or not
  if (args.tokens.empty()) throw UsageError("--tokens: give at least one token count");
  std::vector<int64_t> sorted = args.tokens;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) throw UsageError("--tokens: a token count is given twice");
  const Precision precision = args.dtype == "fp8" ? Precision::fp8 : Precision::bf16;
  if (precision == Precision::fp8 && (spec.shape.hidden % 16 != 0 || spec.shape.inter % 16 != 0))
    throw Error("--dtype fp8: H and F must be multiples of 16 (16-byte rows of e4m3), got H=" +
                std::to_string(spec.shape.hidden) + " F=" + std::to_string(spec.shape.inter));
  if (!require_hopper("tune", ": it times candidate configs on the device",
                      "Without a table, plan_forward uses its heuristic; `moekit check --cpu` runs the CPU oracle here."))
    return kExitNoGpu;
  const DeviceInfo dev = query_device();
  const std::string out = args.out.empty() ? "configs/" + tuning::device_slug(dev.name) + ".json" : args.out;
  // Read the table first: a file for another GPU, or a malformed one, stops before any timing.
  TableFile table;
  if (std::optional<TableFile> existing = read_table_file(out)) {
    if (existing->device != dev.name || existing->sm_count != dev.sm_count)
      throw Error("--out: '" + out + "' is the table of " + existing->device + " (" + std::to_string(existing->sm_count) +
                  " SMs); this GPU is " + dev.name + " (" + std::to_string(dev.sm_count) + " SMs)");
    table = std::move(*existing);
  }
  const std::vector<tuning::TuningRecord> before = table.entries;
  table.device = dev.name;
  table.sm_count = dev.sm_count;
  table.commands.push_back(command);

  const char* dtype = precision_name(precision);
  std::printf("moekit tune %s — %s, %s experts, on %s (%d SMs); %d steps after %d warm-up per candidate; table %s (%s "
              "this shape's %s points)\n", kVersion, spec.str().c_str(), dtype, dev.name.c_str(), dev.sm_count,
              args.steps, args.warmup, out.c_str(), args.merge ? "merging with" : "replacing", dtype);
  Stream stream;
  GpuLayer layer(spec, args.seed, stream.s);
  std::optional<Fp8Weights> fp8;
  if (precision == Precision::fp8) fp8.emplace(layer).ensure(1, kKeepFreeBytes, stream.s);
  const TuneContext cx{args, layer, fp8 ? &*fp8 : nullptr, dev, stream.s, run_start};
  std::vector<tuning::TuningRecord> fresh;
  int failed = 0;
  for (int64_t T : args.tokens) {
    TokensResult r = tune_tokens(cx, T);
    failed += r.failed;
    if (!r.record) continue;
    fresh.push_back(*r.record);
    // Written after every T: a run cut short keeps what it measured.
    table.entries = tuning::merge_records(before, fresh, args.merge);
    write_table_file(out, table);
  }

  std::printf("\n%-6s %-10s %-44s %6s %9s %6s %9s\n", "T", "rows/exp<=", "configs", "split", "ms", "%read", "heur. ms");
  for (const tuning::TuningRecord& r : table.entries) {
    if (r.hidden != spec.shape.hidden || r.inter != spec.shape.inter || r.experts != spec.shape.experts ||
        r.topk != spec.shape.topk || r.precision() != precision)
      continue;
    const std::string cfg = r.up == r.down ? r.up : r.up + " / " + r.down;
    char heur[32] = "-";
    if (r.heuristic_ms) std::snprintf(heur, sizeof heur, "%.4f", *r.heuristic_ms);
    std::printf("%-6lld %-10.4g %-44s %6d %9.4f %5.0f%% %9s\n", (long long)r.tokens, r.rows_per_expert_max, cfg.c_str(),
                r.down_splits, r.ms, 100.0 * r.frac_read, heur);
  }
  if (!fresh.empty())
    std::printf("\nwrote %s: %zu entries in all, %zu measured now; the next build compiles it in (cmake re-runs)\n",
                out.c_str(), table.entries.size(), fresh.size());
  if (failed > 0) {
    std::printf("%d candidate(s) FAILED the check or determinism (see above): a kernel bug, not a slow config\n", failed);
    return kExitFailed;
  }
  return fresh.size() == args.tokens.size() ? kExitOk : kExitFailed;
}

}  // namespace moekit::cli
