// backward_cpu_util.hpp — what the backward's CPU tests (backward_plan_test.cpp,
// backward_workspace_test.cpp) share.
#pragma once

#include "moekit/backward.hpp"

namespace moekit::testing {

// Every gradient a training step with moekit's router asks for: dx, dW and the gate's (RouterGrad::gate).
inline BackwardOptions every_grad() {
  BackwardOptions o;
  o.router = RouterGrad::gate;
  return o;
}

}  // namespace moekit::testing
