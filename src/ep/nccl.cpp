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

void group(const std::function<void()>& body) {
  check(api().GroupStart(), "ncclGroupStart");
  try {
    body();
  } catch (...) {
    api().GroupEnd();  // leave NCCL's group state balanced; the first error is the one reported
    throw;
  }
  check(api().GroupEnd(), "ncclGroupEnd");
}

void send(Comm c, const void* buf, size_t bytes, int peer, cudaStream_t stream) {
  check(api().Send(buf, bytes, kUint8, peer, c, stream), "ncclSend");
}

void recv(Comm c, void* buf, size_t bytes, int peer, cudaStream_t stream) {
  check(api().Recv(buf, bytes, kUint8, peer, c, stream), "ncclRecv");
}

namespace {
// Block p of recv from rank p; to rank p, send + p*send_stride (all_to_all) or send itself (0).
void exchange_equal(Comm c, int ranks, const void* send_buf, size_t send_stride, void* recv_buf, size_t bytes,
                    cudaStream_t stream) {
  group([&] {
    for (int peer = 0; peer < ranks; ++peer) {
      send(c, static_cast<const char*>(send_buf) + size_t(peer) * send_stride, bytes, peer, stream);
      recv(c, static_cast<char*>(recv_buf) + size_t(peer) * bytes, bytes, peer, stream);
    }
  });
}
}  // namespace

void all_to_all(Comm c, int ranks, const void* send_buf, void* recv_buf, size_t bytes, cudaStream_t stream) {
  exchange_equal(c, ranks, send_buf, bytes, recv_buf, bytes, stream);
}

void all_gather(Comm c, int ranks, const void* send_buf, void* recv_buf, size_t bytes, cudaStream_t stream) {
  exchange_equal(c, ranks, send_buf, 0, recv_buf, bytes, stream);
}

}  // namespace moekit::ep::nccl
