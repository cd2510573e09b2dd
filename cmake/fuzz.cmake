# cmake/fuzz.cmake — the libFuzzer target over moekit's host-side planning and validation
# (tests/fuzz/validation_fuzz.cpp), built from the host-only sources with clang and
# -fsanitize=fuzzer,address,undefined. Off by default; scripts/fuzz configures a build dir of its
# own with clang (MOEKIT_FUZZ=ON) and runs it for a bounded time. The sources include the CUDA
# runtime headers for types only; src/tuning/device.cpp (the one that calls cudart) stays out, and
# current_device() is never reached from the fuzzed entries.
option(MOEKIT_FUZZ "build the libFuzzer target moekit_validation_fuzz (needs clang)" OFF)
if(MOEKIT_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MOEKIT_FUZZ needs clang as the C++ compiler (-DCMAKE_CXX_COMPILER=clang++-14)")
  endif()
  set(MOEKIT_FUZZ_FLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1)
  add_executable(moekit_validation_fuzz tests/fuzz/validation_fuzz.cpp ${MOEKIT_PLANNING_SOURCES} src/reference/reference.cpp)
  target_include_directories(moekit_validation_fuzz PRIVATE include src ${CUDAToolkit_INCLUDE_DIRS})
  target_compile_options(moekit_validation_fuzz PRIVATE ${MOEKIT_FUZZ_FLAGS} -ffp-contract=off)
  target_link_options(moekit_validation_fuzz PRIVATE ${MOEKIT_FUZZ_FLAGS})
  find_package(Threads REQUIRED)
  target_link_libraries(moekit_validation_fuzz PRIVATE Threads::Threads)
endif()
