// tune_table.cpp — reads and writes configs/<device>.json for `moekit tune` (format:
// configs/README.md). Plain C++, so nlohmann/json stays out of nvcc's way. The library never
// reads these files: cmake/tuning_tables.cmake compiles them in at configure time.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "tune.hpp"

namespace moekit::cli {

namespace {

using json = nlohmann::ordered_json;

const json& field(const json& obj, const char* key, json::value_t type, const std::string& where) {
  if (!obj.is_object() || !obj.contains(key)) throw Error(where + ": missing \"" + key + "\"");
  const json& v = obj.at(key);
  const bool ok = type == json::value_t::number_float ? v.is_number()
                  : type == json::value_t::number_integer ? v.is_number_integer()
                                                          : v.type() == type;
  if (!ok) throw Error(where + "." + key + ": expected a " + std::string(json(type).type_name()) + ", got " + v.dump());
  return v;
}

}  // namespace

std::optional<TableFile> read_table_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    if (!std::filesystem::exists(path)) return std::nullopt;
    throw Error("--out: cannot read '" + path + "'");
  }
  json doc;
  try {
    doc = json::parse(f);
  } catch (const json::parse_error& e) {
    throw Error("--out: '" + path + "' is not JSON: " + e.what());
  }
  const std::string where = "--out: " + path;
  TableFile t;
  t.device = field(doc, "device", json::value_t::string, where).get<std::string>();
  t.sm_count = field(doc, "sm_count", json::value_t::number_integer, where).get<int>();
  if (doc.contains("commands"))
    for (const json& c : field(doc, "commands", json::value_t::array, where)) t.commands.push_back(c.get<std::string>());
  const json& entries = field(doc, "entries", json::value_t::array, where);
  for (size_t i = 0; i < entries.size(); ++i) {
    const json& e = entries[i];
    const std::string at = where + ": entries[" + std::to_string(i) + "]";
    using V = json::value_t;
    tuning::TuningRecord r;
    r.hidden = field(e, "hidden", V::number_integer, at).get<int64_t>();
    r.inter = field(e, "inter", V::number_integer, at).get<int64_t>();
    r.experts = field(e, "experts", V::number_integer, at).get<int64_t>();
    r.topk = field(e, "topk", V::number_integer, at).get<int64_t>();
    r.tokens = field(e, "tokens", V::number_integer, at).get<int64_t>();
    r.rows_per_expert_max = field(e, "rows_per_expert_max", V::number_float, at).get<double>();
    r.up = field(e, "up", V::string, at).get<std::string>();
    r.down = field(e, "down", V::string, at).get<std::string>();
    r.down_splits = field(e, "down_splits", V::number_integer, at).get<int>();
    if (e.contains("ms")) r.ms = field(e, "ms", V::number_float, at).get<double>();
    if (e.contains("frac_read")) r.frac_read = field(e, "frac_read", V::number_float, at).get<double>();
    if (e.contains("heuristic_ms") && !e.at("heuristic_ms").is_null())
      r.heuristic_ms = field(e, "heuristic_ms", V::number_float, at).get<double>();
    if (e.contains("date")) r.date = field(e, "date", V::string, at).get<std::string>();
    t.entries.push_back(std::move(r));
  }
  return t;
}

void write_table_file(const std::string& path, const TableFile& t) {
  json doc;
  doc["device"] = t.device;
  doc["sm_count"] = t.sm_count;
  doc["commands"] = t.commands;
  json entries = json::array();
  for (const tuning::TuningRecord& r : t.entries) {
    json e;
    e["hidden"] = r.hidden;
    e["inter"] = r.inter;
    e["experts"] = r.experts;
    e["topk"] = r.topk;
    e["tokens"] = r.tokens;
    e["rows_per_expert_max"] = r.rows_per_expert_max;
    e["up"] = r.up;
    e["down"] = r.down;
    e["down_splits"] = r.down_splits;
    e["ms"] = r.ms;
    e["frac_read"] = r.frac_read;
    e["heuristic_ms"] = r.heuristic_ms ? json(*r.heuristic_ms) : json(nullptr);
    e["date"] = r.date;
    entries.push_back(std::move(e));
  }
  doc["entries"] = std::move(entries);
  const std::filesystem::path target(path);
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    if (!f) throw Error("--out: cannot open '" + tmp + "' for writing");
    f << doc.dump(2) << "\n";
    if (!f) throw Error("--out: writing '" + tmp + "' failed");
  }
  std::filesystem::rename(tmp, target);
}

void append_candidate_line(const std::string& path, const CandidateLine& c) {
  json e;
  e["hidden"] = c.hidden, e["inter"] = c.inter, e["experts"] = c.experts, e["topk"] = c.topk;
  e["dtype"] = c.dtype, e["tokens"] = c.tokens;
  e["up"] = c.up, e["down"] = c.down, e["down_splits"] = c.down_splits, e["heuristic"] = c.heuristic;
  e["outcome"] = c.outcome;
  e["ms"] = c.ms ? json(*c.ms) : json(nullptr);
  e["read_ms"] = c.read_ms ? json(*c.read_ms) : json(nullptr);
  e["model_ms"] = c.model_ms;
  e["note"] = c.note;
  std::ofstream f(path, std::ios::app);
  f << e.dump() << '\n';
  if (!f) throw Error("--candidates: cannot append to '" + path + "'");
}

}  // namespace moekit::cli
