// src/common/version.cpp — moekit::version(): the version the library was compiled with
// (moekit/version.hpp, generated from CMakeLists.txt's project(VERSION)).
#include "moekit/version.hpp"

namespace moekit {

const char* version() noexcept { return MOEKIT_VERSION_STRING; }

}  // namespace moekit
