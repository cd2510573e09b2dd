// tests/package/consumer/main.cpp — CPU-side use of the installed moekit (no GPU needed): the
// version, a plan of Mixtral-8x7B's layer for an H200 described by hand, its workspace, the same
// plan given back through plan_forward_with, and the oracle's routing laid out in the plan's
// blocks. Prints the plan; exits non-zero on the first check that fails.
#include <moekit/moe.hpp>
#include <moekit/reference.hpp>
#include <moekit/version.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

namespace {

int failures = 0;
void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "consumer: FAILED: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main() {
  using namespace moekit;
  std::printf("moekit %s (headers %s)\n", version(), MOEKIT_VERSION_STRING);
  check(std::strcmp(version(), MOEKIT_VERSION_STRING) == 0, "the library's version is the headers'");
#ifdef MOEKIT_EXPECTED_VERSION
  check(std::strcmp(version(), MOEKIT_EXPECTED_VERSION) == 0, "the version is CMakeLists.txt's");
#endif

  // An H200 as query_device() describes it; no device is read.
  const DeviceInfo h200{"NVIDIA H200", 132, 9, 0, 232448, 60LL << 20};
  const MoeShape shape{64, 4096, 14336, 8, 2};  // Mixtral-8x7B, T = 64
  const ForwardPlan plan = plan_forward_heuristic(shape, h200);
  const size_t ws_bytes = workspace_bytes(plan);
  std::printf("plan: %s\nworkspace: %zu bytes\n", plan.str().c_str(), ws_bytes);
  check(plan.source == "heuristic", "plan_forward_heuristic's plan says so");
  check(plan.up.block_m == plan.down.block_m && plan.block_m() > 0, "up and down share one block_m");
  check(ws_bytes >= size_t(plan.max_rows()) * size_t(shape.hidden) * 2, "the workspace holds y_rows");

  const ForwardPlan given = plan_forward_with(shape, plan.up, plan.down, plan.down_splits);
  check(given.source == "given", "plan_forward_with's plan says so");
  check(workspace_bytes(given) == ws_bytes, "the same configs size the same workspace");

  bool refused = false;
  try {
    plan_forward_heuristic(MoeShape{64, 4096, 14336, 8, 0}, h200);
  } catch (const Error& e) {
    refused = std::strstr(e.what(), "topk") != nullptr;
    std::printf("refused: %s\n", e.what());
  }
  check(refused, "top-k 0 is refused, naming topk");

  // The oracle (moekit::reference): route 64 tokens' logits, lay them out in the plan's blocks.
  std::vector<float> logits(shape.tokens * shape.experts);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float((i * 7919) % 97) / 97.0f;
  RouterOptions opt;
  opt.renormalize = true;
  const ref::Routing r = ref::route(logits.data(), nullptr, shape.tokens, shape.experts, shape.topk, opt);
  const ref::Aligned a = ref::align(r.ids.data(), shape.tokens, shape.topk, shape.experts, plan.block_m(),
                                    plan.max_blocks());
  int64_t routed = 0;
  for (int32_t c : a.expert_counts) routed += c;
  std::printf("aligned: %d rows for %lld assignments\n", a.num_rows_padded, (long long)routed);
  check(routed == shape.assignments(), "every assignment is counted once");
  check(a.num_rows_padded % plan.block_m() == 0 && a.num_rows_padded <= plan.max_rows(),
        "the padded rows are whole blocks within the plan's worst case");

  if (failures) return 1;
  std::printf("consumer: ok\n");
  return 0;
}
