// nccl.hpp — the NCCL calls of moekit's EP path, loaded at run time with dlopen.
//
// Why at run time: libnccl is 200+ MB and not on every machine that runs moekit (the Python
// wheel, a one-GPU box). Linking it would make every moekit binary fail to start without it;
// loading it when a Communicator is made fails only the EP entry points, with a clear message.
// The declarations below are the part of nccl.h's ABI moekit uses (unchanged since NCCL 2.7);
// nccl.cpp checks them against nccl.h wherever that header is installed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <string>

namespace moekit::ep::nccl {

struct UniqueId {
  char internal[128];  // NCCL_UNIQUE_ID_BYTES
};
using Comm = struct ncclComm*;
using Result = int;               // ncclResult_t: 0 = ncclSuccess
inline constexpr int kUint8 = 1;  // ncclDataType_t ncclUint8: moekit sends bytes

struct Api {
  Result (*GetVersion)(int*);
  Result (*GetUniqueId)(UniqueId*);
  Result (*CommInitRank)(Comm*, int, UniqueId, int);
  Result (*CommDestroy)(Comm);
  Result (*GroupStart)();
  Result (*GroupEnd)();
  Result (*Send)(const void*, size_t, int, int, Comm, cudaStream_t);
  Result (*Recv)(void*, size_t, int, int, Comm, cudaStream_t);
  const char* (*GetErrorString)(Result);
  std::string library;  // the file that was loaded
  int version = 0;      // NCCL_VERSION_CODE of that library, e.g. 22809
};

// The loaded library: $MOEKIT_NCCL_LIBRARY if set, else libnccl.so.2 from the loader's search
// path. Loaded once per process; throws moekit::Error saying what was tried when it is missing.
const Api& api();

// Throws moekit::Error "<what>: NCCL error <n> (<string>)" unless r is success.
void check(Result r, const char* what);

// The calls every exchange is made of, checked, counted in bytes: body() inside one
// ncclGroupStart/End (which is ended also when body throws), and sends and receives in it.
void group(const std::function<void()>& body);
void send(Comm c, const void* buf, size_t bytes, int peer, cudaStream_t stream);
void recv(Comm c, void* buf, size_t bytes, int peer, cudaStream_t stream);

// Equal-size exchanges among the R ranks, one group each; enqueue only (graph-safe).
// all_to_all: block p of send [R][bytes] goes to rank p, rank p's block lands in block p of recv.
void all_to_all(Comm c, int ranks, const void* send, void* recv, size_t bytes, cudaStream_t stream);
// all_gather: the same `bytes` of send to every rank; rank p's land in block p of recv [R][bytes].
void all_gather(Comm c, int ranks, const void* send, void* recv, size_t bytes, cudaStream_t stream);

}  // namespace moekit::ep::nccl
