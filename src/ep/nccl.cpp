// nccl.cpp — dlopen of libnccl and the checked call helper (see nccl.hpp).
#include "ep/nccl.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "moekit/tensor.hpp"

#if __has_include(<nccl.h>)
#include <nccl.h>
// The hand-written ABI subset must match the real header wherever it is installed.
static_assert(sizeof(moekit::ep::nccl::UniqueId) == sizeof(ncclUniqueId));
static_assert(moekit::ep::nccl::kUint8 == int(ncclUint8));
static_assert(int(ncclSuccess) == 0);
#endif

namespace moekit::ep::nccl {
namespace {

template <class F>
void bind(void* lib, F& fn, const char* name, const std::string& file) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr) throw Error("NCCL: " + file + " has no symbol " + name + " (NCCL 2.7 or newer is needed)");
}

Api load() {
  const char* env = std::getenv("MOEKIT_NCCL_LIBRARY");
  const std::string file = env && *env ? env : "libnccl.so.2";
  void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw Error("NCCL not found: dlopen(\"" + file + "\") failed: " + (why ? why : "unknown error") +
                ". Install NCCL 2.x (e.g. pip install nvidia-nccl-cu13) and put its lib/ on LD_LIBRARY_PATH, "
                "or set MOEKIT_NCCL_LIBRARY to the path of libnccl.so.2");
  }
  Api a{};
  a.library = file;
  bind(lib, a.GetVersion, "ncclGetVersion", file);
  bind(lib, a.GetUniqueId, "ncclGetUniqueId", file);
  bind(lib, a.CommInitRank, "ncclCommInitRank", file);
  bind(lib, a.CommDestroy, "ncclCommDestroy", file);
  bind(lib, a.GroupStart, "ncclGroupStart", file);
  bind(lib, a.GroupEnd, "ncclGroupEnd", file);
  bind(lib, a.Send, "ncclSend", file);
  bind(lib, a.Recv, "ncclRecv", file);
  bind(lib, a.GetErrorString, "ncclGetErrorString", file);
  if (a.GetVersion(&a.version) != 0) a.version = 0;
  return a;  // the library stays loaded for the life of the process
}

}  // namespace

const Api& api() {
  static std::once_flag once;
  static Api a;
  static std::string error;
  std::call_once(once, [] {
    try {
      a = load();
    } catch (const Error& e) {
      error = e.what();
    }
  });
  if (!error.empty()) throw Error(error);
  return a;
}

void check(Result r, const char* what) {
  if (r == 0) return;
  throw Error(std::string(what) + ": NCCL error " + std::to_string(r) + " (" + api().GetErrorString(r) + ")");
}

}  // namespace moekit::ep::nccl
