// table.cpp — lookup in the measured tile-config tables (configs/*.json, compiled in by
// cmake/tuning_tables.cmake; tuning/table.hpp) and the pure parts of `moekit tune`: candidates,
// bucket bounds, merging a run into a table (moekit/tuning.hpp).
#include "tuning/table.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include "tuning/planner.hpp"

namespace moekit::tuning {

double rows_per_expert(const MoeShape& s) {
  return s.experts > 0 ? double(s.tokens * s.topk) / double(s.experts) : 0.0;
}

int64_t gemm_smem_bytes(const GemmConfig& c) {
  return int64_t(c.stages) * (c.block_m + c.block_n) * c.block_k * (c.precision == Precision::fp8 ? 1 : 2);
}

Precision config_name_precision(std::string_view name) {
  return name.starts_with("fp8-") ? Precision::fp8 : Precision::bf16;
}

const GemmConfig* compiled_config_named(std::string_view name) {
  for (Precision pr : {Precision::bf16, Precision::fp8})
    for (const GemmConfig& c : compiled_gemm_configs(pr))
      if (c.str() == name) return &c;
  return nullptr;
}

static bool fits(const GemmConfig& c, const DeviceInfo& device) {
  return gemm_smem_bytes(c) <= device.smem_per_block_optin;
}

// The rules plan_forward_with enforces (plus shared memory), as a predicate instead of a throw.
static bool valid_choice(const TileChoice& t, const DeviceInfo& device) {
  return t.up.block_m == t.down.block_m && t.up.precision == t.down.precision &&
         up_config_ok(t.up) && t.down_splits >= 1 && t.down_splits <= kMaxDownSplits &&
         down_splits_ok(t.down, t.down_splits) && fits(t.up, device) && fits(t.down, device);
}

std::optional<TileChoice> resolve_entry(const TuningEntry& e, const DeviceInfo& device) {
  const GemmConfig* up = compiled_config_named(e.up);
  const GemmConfig* down = compiled_config_named(e.down);
  if (!up || !down) return std::nullopt;
  const TileChoice t{*up, *down, e.down_splits};
  if (!valid_choice(t, device)) return std::nullopt;
  return t;
}

const TuningEntry* find_entry(std::span<const TuningEntry> table, const MoeShape& shape, const DeviceInfo& device,
                              Precision precision) {
  const double rows = rows_per_expert(shape);
  const TuningEntry* best = nullptr;
  for (const TuningEntry& e : table) {
    if (e.device != device.name || e.hidden != shape.hidden || e.inter != shape.inter ||
        e.experts != shape.experts || e.topk != shape.topk)
      continue;
    // The other precision's buckets are not this plan's (checked before the bound: they must not
    // shadow this precision's bucket either).
    if (config_name_precision(e.up) != precision || config_name_precision(e.down) != precision) continue;
    if (!(rows <= e.rows_per_expert_max)) continue;
    if (best && e.rows_per_expert_max >= best->rows_per_expert_max) continue;  // ties: the first wins
    if (!resolve_entry(e, device)) continue;  // stale: as if absent
    best = &e;
  }
  return best;
}

std::optional<ForwardPlan> plan_from_table(std::span<const TuningEntry> table, const MoeShape& shape,
                                           const DeviceInfo& device, Precision precision) {
  const TuningEntry* e = find_entry(table, shape, device, precision);
  if (!e) return std::nullopt;
  const TileChoice t = *resolve_entry(*e, device);  // find_entry returns only entries that resolve
  ForwardPlan plan = plan_with(shape, t.up, t.down, t.down_splits, device.smem_per_block_optin, device.sm_count);
  char bound[32];
  std::snprintf(bound, sizeof bound, "%g", e->rows_per_expert_max);
  plan.source = "table:" + std::string(e->source) + "(rows/expert<=" + bound + ")";
  return plan;
}

std::string device_slug(std::string_view name) {
  std::string s;
  bool dash = false;
  for (char ch : name) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (std::isalnum(c)) {
      if (dash && !s.empty()) s += '-';
      s += char(std::tolower(c));
      dash = false;
    } else {
      dash = true;
    }
  }
  return s;
}

std::vector<TileChoice> tune_candidates(const MoeShape& shape, const DeviceInfo& device, Precision precision) {
  const std::vector<GemmConfig>& compiled = compiled_gemm_configs(precision);
  std::set<int> block_ms;
  for (const GemmConfig& c : compiled) block_ms.insert(c.block_m);
  std::vector<TileChoice> out;
  for (int bm : block_ms)
    for (const GemmConfig& up : compiled)
      for (const GemmConfig& down : compiled) {
        if (up.block_m != bm || down.block_m != bm || !fits(up, device) || !fits(down, device)) continue;
        if (!up_config_ok(up)) continue;  // plan_with's rule
        // Split-K where the kernel has it (down_splits_ok); an empty K-slice would only add a zero partial.
        const int64_t k_tiles = (shape.inter + down.block_k - 1) / down.block_k;
        for (int splits = 1; splits <= kMaxDownSplits; splits *= 2) {
          if (splits > 1 && (!down_splits_ok(down, splits) || splits > k_tiles)) break;
          out.push_back({up, down, splits});
        }
      }
  return out;
}

std::vector<double> bucket_bounds(std::span<const double> rows) {
  std::vector<double> b(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i + 1 < rows.size() && !(rows[i] < rows[i + 1]))
      throw Error("bucket_bounds: rows per expert must be strictly ascending; got " + std::to_string(rows[i]) +
                  " then " + std::to_string(rows[i + 1]));
    b[i] = i + 1 < rows.size() ? 0.5 * (rows[i] + rows[i + 1]) : rows[i];
  }
  return b;
}

namespace {
// One set of buckets: a shape and a precision.
using ShapeKey = std::tuple<int64_t, int64_t, int64_t, int64_t, Precision>;
ShapeKey key_of(const TuningRecord& r) { return {r.hidden, r.inter, r.experts, r.topk, r.precision()}; }
}  // namespace

std::vector<TuningRecord> merge_records(const std::vector<TuningRecord>& existing,
                                        const std::vector<TuningRecord>& fresh, bool keep_other_tokens) {
  std::map<ShapeKey, std::set<int64_t>> fresh_tokens;
  for (const TuningRecord& r : fresh)
    if (!fresh_tokens[key_of(r)].insert(r.tokens).second)
      throw Error("merge_records: T=" + std::to_string(r.tokens) + " of one shape measured twice (" +
                  precision_name(r.precision()) + ")");
  std::vector<TuningRecord> out;
  for (const TuningRecord& r : existing) {
    const auto it = fresh_tokens.find(key_of(r));
    if (it == fresh_tokens.end() || (keep_other_tokens && !it->second.count(r.tokens))) out.push_back(r);
  }
  out.insert(out.end(), fresh.begin(), fresh.end());
  std::stable_sort(out.begin(), out.end(), [](const TuningRecord& a, const TuningRecord& b) {
    return std::make_tuple(a.hidden, a.inter, a.experts, a.topk, a.precision(), a.tokens) <
           std::make_tuple(b.hidden, b.inter, b.experts, b.topk, b.precision(), b.tokens);
  });
  // Recompute the bounds of every (shape, precision) this run measured (its points are now
  // contiguous).
  for (size_t lo = 0; lo < out.size();) {
    size_t hi = lo;
    while (hi < out.size() && key_of(out[hi]) == key_of(out[lo])) ++hi;
    if (fresh_tokens.count(key_of(out[lo]))) {
      std::vector<double> rows;
      for (size_t i = lo; i < hi; ++i) rows.push_back(rows_per_expert(out[i].shape()));
      const std::vector<double> bounds = bucket_bounds(rows);
      for (size_t i = lo; i < hi; ++i) out[i].rows_per_expert_max = bounds[i - lo];
    }
    lo = hi;
  }
  return out;
}

}  // namespace moekit::tuning
