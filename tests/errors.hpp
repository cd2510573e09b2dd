// errors.hpp — how the CPU and GPU tests check a validation error: moekit::Error naming the
// argument the way detail::fail writes it ("argument '<name>'").
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "moekit/tensor.hpp"

namespace moekit::test_errors {

// Passes when call() throws moekit::Error whose message names the argument as 'arg'.
template <class F>
::testing::AssertionResult throws_naming(F&& call, const std::string& arg) {
  try {
    call();
  } catch (const Error& e) {
    if (std::string(e.what()).find("'" + arg + "'") != std::string::npos)
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "moekit::Error does not name '" << arg << "': " << e.what();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "expected moekit::Error naming '" << arg
                                         << "', got another exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "expected moekit::Error naming '" << arg << "', nothing thrown";
}

}  // namespace moekit::test_errors
