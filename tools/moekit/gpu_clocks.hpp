// gpu_clocks.hpp — the SM clock, board power and the driver's clock-limit reasons while `moekit
// bench` times a stage. A GPU at its power cap lowers its SM clock under back-to-back GEMMs, so a
// kernel made faster at ncu's locked clock can gain nothing in the bench's timed loop (NOTES:
// Backward); these fields say at which clock each row ran. NVML is the driver's library, opened at
// run time (gpu_clocks.cpp): the CLI starts without a driver, and there — or for a stage too short
// to sample — the fields are null.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stats.hpp"  // median

namespace moekit::cli {

struct ClockSample {
  unsigned sm_mhz = 0;
  unsigned power_mw = 0;
  uint64_t reasons = 0;  // NVML's clocks-event reason bits (nvmlClocksEventReason*)
};

struct ClockStats {
  int samples = 0;
  double sm_clock_mhz = 0;      // median over the samples
  double sm_clock_min_mhz = 0;  // the lowest sample
  double power_w = 0;           // mean
  uint64_t limit_reasons = 0;   // OR over the samples
};

// The samples of one timed loop summarised; none without samples.
inline std::optional<ClockStats> summarize_clocks(const std::vector<ClockSample>& samples) {
  if (samples.empty()) return std::nullopt;
  std::vector<double> mhz;
  ClockStats s;
  s.samples = int(samples.size());
  double power = 0;
  for (const ClockSample& c : samples) mhz.push_back(c.sm_mhz), power += c.power_mw, s.limit_reasons |= c.reasons;
  s.sm_clock_mhz = median(mhz);
  s.sm_clock_min_mhz = *std::min_element(mhz.begin(), mhz.end());
  s.power_w = power / double(samples.size()) / 1000.0;
  return s;
}

// The reasons that lower the clock under load, by name, '+'-joined ("sw_power_cap+hw_slowdown");
// "none" when no bit is set. The idle bit (0x1) and the display clock's (0x100) are left out: a
// busy GPU sets neither, and they limit nothing a benchmark measures.
inline std::string clock_limit_names(uint64_t reasons) {
  static constexpr std::pair<uint64_t, const char*> kNames[] = {
      {0x2, "applications_clocks"}, {0x4, "sw_power_cap"},    {0x8, "hw_slowdown"},      {0x10, "sync_boost"},
      {0x20, "sw_thermal"},         {0x40, "hw_thermal"},     {0x80, "hw_power_brake"}};
  std::string out;
  for (const auto& [bit, name] : kNames)
    if (reasons & bit) out += (out.empty() ? "" : "+") + std::string(name);
  return out.empty() ? "none" : out;
}

// One sample of the current CUDA device (its NVML handle looked up once); none where NVML or the
// device is missing. The CLI samples from its one host thread.
std::optional<ClockSample> sample_gpu_clocks();

// What the latest timed loop (tool_util.hpp, time_median_ms) sampled: read right after it.
void set_last_timed_clocks(std::optional<ClockStats> s);
std::optional<ClockStats> last_timed_clocks();

}  // namespace moekit::cli
