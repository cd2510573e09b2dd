// spawn.cpp — spawn_ranks and rank_from_env (moekit/ep_nccl.hpp): R rank processes on one host.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/validate.hpp"
#include "moekit/ep_nccl.hpp"
#include "moekit/tensor.hpp"

extern char** environ;

namespace moekit::ep {
namespace {
using detail::fail;
constexpr const char* kEnv = "rank_from_env";

std::string to_hex(const NcclId& id) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (unsigned char c : id.bytes) s += digits[c >> 4], s += digits[c & 15];
  return s;
}

NcclId from_hex(const std::string& s) {
  NcclId id{};
  if (s.size() != 2 * sizeof id.bytes)
    fail(kEnv, "MOEKIT_EP_NCCL_ID", "expected 256 hex digits, got " + std::to_string(s.size()));
  auto nibble = [&](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    fail(kEnv, "MOEKIT_EP_NCCL_ID", std::string("not a hex digit: '") + c + "'");
  };
  for (size_t i = 0; i < sizeof id.bytes; ++i) id.bytes[i] = char(nibble(s[2 * i]) * 16 + nibble(s[2 * i + 1]));
  return id;
}

int to_int(const char* name, const char* v) {
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < 0 || x > 4096)
    fail(kEnv, name, std::string("not a rank number: '") + v + "'");
  return int(x);
}

}  // namespace

std::optional<RankEnv> rank_from_env() {
  const char* rank = std::getenv("MOEKIT_EP_RANK");
  if (rank == nullptr) return std::nullopt;
  const char* ranks = std::getenv("MOEKIT_EP_RANKS");
  const char* id = std::getenv("MOEKIT_EP_NCCL_ID");
  if (ranks == nullptr || id == nullptr)
    fail(kEnv, ranks == nullptr ? "MOEKIT_EP_RANKS" : "MOEKIT_EP_NCCL_ID", "is not set but MOEKIT_EP_RANK is");
  RankEnv e;
  e.rank = to_int("MOEKIT_EP_RANK", rank), e.ranks = to_int("MOEKIT_EP_RANKS", ranks);
  if (e.ranks < 1 || e.rank >= e.ranks) fail(kEnv, "MOEKIT_EP_RANK", "must be below MOEKIT_EP_RANKS");
  e.id = from_hex(id);
  return e;
}

std::vector<int> spawn_ranks(int ranks, const std::vector<std::string>& args) {
  if (ranks < 1) fail("spawn_ranks", "ranks", "must be >= 1, got " + std::to_string(ranks));
  const std::string id = to_hex(nccl_unique_id());  // the parent hosts NCCL's rendezvous
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) throw Error(std::string("spawn_ranks: readlink(/proc/self/exe): ") + std::strerror(errno));
  exe[n] = '\0';
  // Everything the child needs is built here: between fork and exec a child of a threaded parent
  // (NCCL's bootstrap thread) may only call async-signal-safe functions, so no allocation there.
  std::vector<std::vector<std::string>> envs(static_cast<size_t>(ranks));
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "MOEKIT_EP_", 10) != 0)
      for (auto& env : envs) env.emplace_back(*e);
  for (int r = 0; r < ranks; ++r) {
    envs[size_t(r)].push_back("MOEKIT_EP_RANK=" + std::to_string(r));
    envs[size_t(r)].push_back("MOEKIT_EP_RANKS=" + std::to_string(ranks));
    envs[size_t(r)].push_back("MOEKIT_EP_NCCL_ID=" + id);
  }
  std::vector<std::vector<char*>> envps(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    for (std::string& e : envs[size_t(r)]) envps[size_t(r)].push_back(e.data());
    envps[size_t(r)].push_back(nullptr);
  }
  std::vector<std::string> arg_copy(args);
  std::vector<char*> argv{exe};
  for (std::string& a : arg_copy) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      for (pid_t started : pids) kill(started, SIGKILL);  // they would wait for the missing rank forever
      for (pid_t started : pids) waitpid(started, nullptr, 0);
      throw Error("spawn_ranks: fork: " + why);
    }
    if (pid == 0) {
      execve(exe, argv.data(), envps[size_t(r)].data());
      static const char msg[] = "moekit: spawn_ranks: execve failed\n";
      (void)!write(2, msg, sizeof msg - 1);
      _exit(127);
    }
    pids.push_back(pid);
  }
  // Wait for all. A rank that fails leaves its peers blocked in NCCL: once one has failed, the
  // others get kFailureGraceSeconds to finish, then they are killed (status 128 + SIGKILL).
  constexpr int kFailureGraceSeconds = 20;
  std::vector<int> status(size_t(ranks), -1);
  int running = ranks, grace_ticks = -1;
  while (running > 0) {
    for (int r = 0; r < ranks; ++r) {
      if (status[size_t(r)] >= 0) continue;
      int st = 0;
      const pid_t got = waitpid(pids[size_t(r)], &st, WNOHANG);
      if (got == 0 || (got < 0 && errno == EINTR)) continue;
      status[size_t(r)] = got < 0 ? 127 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
      --running;
      if (status[size_t(r)] != 0 && grace_ticks < 0) grace_ticks = kFailureGraceSeconds * 20;
    }
    if (running == 0) break;
    if (grace_ticks == 0)
      for (int r = 0; r < ranks; ++r)
        if (status[size_t(r)] < 0) kill(pids[size_t(r)], SIGKILL);
    if (grace_ticks > 0) --grace_ticks;
    usleep(50 * 1000);
  }
  return status;
}

}  // namespace moekit::ep
