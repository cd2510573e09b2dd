// stats.hpp — the median every timed loop and clock sample of the CLI is summarised by (plain C++:
// the CPU tests' report code uses it too).
#pragma once

#include <algorithm>
#include <vector>

namespace moekit::cli {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace moekit::cli
