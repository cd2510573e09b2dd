// exit_codes.hpp — the exit status of every `moekit` command, defined once: main.cpp returns
// them, each command's --help footer and README.md ("Exit codes") list them from kExitCodesHelp.
#pragma once

#include "moekit/tensor.hpp"

namespace moekit::cli {

inline constexpr int kExitOk = 0;      // every check passed (and, bench/tune, every row was timed)
inline constexpr int kExitFailed = 1;  // a check failed, or a run-time error (CUDA, I/O)
inline constexpr int kExitNoGpu = 2;   // the command needs a Hopper GPU (sm_90a) and there is none
inline constexpr int kExitUsage = 3;   // bad command line: unknown flag, bad number, a layer moekit cannot run

inline constexpr const char* kExitCodesHelp =
    "Exit codes: 0 ok; 1 a check failed or a run-time error; 2 no Hopper GPU (sm_90a) for a command that needs "
    "one; 3 bad command line (unknown flag, bad number, a layer shape moekit cannot run).";

// A command-line value moekit cannot honour, found before any device is asked for: the message
// names the flag. main.cpp exits with kExitUsage.
struct UsageError : Error {
  using Error::Error;
};

}  // namespace moekit::cli
