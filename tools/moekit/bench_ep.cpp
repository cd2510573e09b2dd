// bench_ep.cpp — `moekit bench --ep R`: the expert-parallel layer over R GPUs of this host.
//
// The command re-runs itself as R rank processes (spawn_ranks: one GPU each). Every rank builds
// the preset's layer from the seed, keeps the weights of its placement's slots, and for each T
// (tokens per rank; R*T in the step):
//   check   its EP output against experts_forward of its own tokens on its GPU with every
//           expert and the same tile configs: must be bitwise equal (the EP contract);
//   step    route + EpLayer::forward, median of --steps (decode: replayed from a CUDA graph;
//           prefill: eager, it syncs once for the counts);
//   a2a     EpLayer::exchange_only, the step's two exchanges alone;
//   nccl    NCCL's own all-to-all (Communicator::all_to_all: grouped ncclSend/ncclRecv of equal
//           sizes to every rank, the pattern of nccl-tests' alltoall) moving the same bytes to
//           peers, twice (dispatch and return): the transport's ceiling measured in the same run.
// Rank 0 prints the table and writes --json (command, date, GPU, NCCL version).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench.hpp"
#include "layer.hpp"
#include "rng.hpp"
#include "moekit/ep.hpp"
#include "moekit/ep_nccl.hpp"
#include "timing.hpp"

namespace moekit::cli {
namespace {

struct EpRow {
  int64_t tokens_per_rank = 0;
  std::string mode;
  std::string config;
  double step_ms = 0, exchange_ms = 0, nccl_ms = 0;
  int64_t bytes_on_wire = 0;  // this rank, to its peers, both exchanges
  int64_t overflow = 0;
  bool bitwise = false;
  double a2a_GBps() const { return exchange_ms > 0 ? double(bytes_on_wire) / (exchange_ms * 1e-3) / 1e9 : 0; }
  double nccl_GBps() const { return nccl_ms > 0 ? double(bytes_on_wire) / (nccl_ms * 1e-3) / 1e9 : 0; }
};

// The largest of every rank's `value` (a size all ranks must agree on before a paired exchange).
int64_t max_over_ranks(const ep::Communicator& comm, int64_t value, cudaStream_t stream) {
  const int R = comm.ranks();
  const DeviceBuffer d(8 * (R + 1));
  std::vector<int64_t> all(static_cast<size_t>(R));
  MK_CUDA_CHECK(cudaMemcpyAsync(d.get(), &value, 8, cudaMemcpyHostToDevice, stream));
  comm.all_gather(d.get(), d.as<int64_t>() + 1, 8, stream);
  MK_CUDA_CHECK(cudaMemcpyAsync(all.data(), d.as<int64_t>() + 1, 8 * size_t(R), cudaMemcpyDeviceToHost, stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  return *std::max_element(all.begin(), all.end());
}

int run_rank(const BenchArgs& args, const ep::RankEnv& env, const std::string& command) {
  MK_CUDA_CHECK(cudaSetDevice(env.rank));
  const int R = env.ranks, rank = env.rank;
  const bool lead = rank == 0;
  Stream stream;
  const cudaStream_t s = stream.s;
  const LayerSpec spec = resolve_layer(args.layer);
  GpuLayer layer(spec, args.seed, s);
  const MoeShape& shape = spec.shape;
  const int64_t H = shape.hidden, F = shape.inter, E = shape.experts, k = shape.topk;
  const ep::Communicator comm(env.id, rank, R);
  const ep::Placement p = ep::plan_placement({.experts = E, .ranks = R});
  const int64_t S = p.slots_per_rank;
  const DeviceInfo dev = query_device();

  // This rank's slots' weights.
  const DeviceBuffer w13(S * 2 * F * H * 2), w2(S * H * F * 2);
  MK_CUDA_CHECK(cudaMemsetAsync(w13.get(), 0, size_t(w13.bytes()), s));
  MK_CUDA_CHECK(cudaMemsetAsync(w2.get(), 0, size_t(w2.bytes()), s));
  const Tensor w13t(w13.get(), DType::bf16, {S, 2 * F, H}), w2t(w2.get(), DType::bf16, {S, H, F});
  ep::copy_local_experts(p, rank, layer.w13(0), layer.w2(0), w13t, w2t, s);

  if (lead) {
    std::printf("moekit bench --ep %d: %s, %d ranks x %lld slots, NCCL %s\n", R, spec.str().c_str(), R, (long long)S,
                ep::nccl_version().c_str());
    std::printf("%8s %-8s %10s %10s %10s %10s %10s %9s %8s %s\n", "T/rank", "mode", "step_ms", "a2a_ms", "nccl_ms",
                "MB/rank", "a2a_GB/s", "nccl_GB/s", "%nccl", "check");
  }
  std::vector<EpRow> rows;
  bool all_ok = true;
  for (int64_t T : args.tokens) {
    const bool decode = args.ep_mode == "decode" || (args.ep_mode == "auto" && T <= 128);
    // Tokens: rank r's slice of one R*T batch (seeded, so every run sees the same batch).
    const DeviceBuffer x_all = random_activations(R * T, H, args.seed, kStreamX, s);
    const Tensor x(x_all.as<char>() + rank * T * H * 2, DType::bf16, {T, H});
    const DeviceBuffer ids(T * k * 4), wts(T * k * 4), logits(T * E * 4), y(T * H * 2), y_ref(T * H * 2);
    const Tensor idt(ids.get(), DType::i32, {T, k}), wtt(wts.get(), DType::f32, {T, k}),
        yt(y.get(), DType::bf16, {T, H});
    const MoeInputs in = layer.inputs(0, x);
    auto route_step = [&] {
      route(x, in.w_gate, Tensor(), in.score_bias, spec.router, idt, wtt, s, Tensor(logits.get(), DType::f32, {T, E}));
    };
    ep::EpOptions opt;
    opt.shape = MoeShape{T, H, F, E, k};
    opt.mode = decode ? ep::EpMode::decode : ep::EpMode::prefill;
    opt.capacity = decode ? args.ep_capacity : 0;
    ep::EpLayer ep_layer(comm, p, opt);
    auto step = [&] {
      route_step();
      ep_layer.forward(x, idt, wtt, w13t, w2t, yt, rank * T, s);
    };

    // check: bitwise against this GPU's experts_forward of the same tokens with every expert.
    step();
    const ep::EpStats st = ep_layer.stats(s);
    const ForwardPlan ref =
        plan_forward_with(MoeShape{T, H, F, E, k}, ep_layer.local_plan().up, ep_layer.local_plan().down, 1);
    const DeviceBuffer ref_ws(int64_t(workspace_bytes(ref)));
    experts_forward(ref, x, in.w13, in.w2, idt, wtt, Tensor(y_ref.get(), DType::bf16, {T, H}), ref_ws.get(),
                    size_t(ref_ws.bytes()), s);
    std::vector<uint16_t> a(size_t(T * H)), b(size_t(T * H));
    MK_CUDA_CHECK(cudaMemcpyAsync(a.data(), y.get(), a.size() * 2, cudaMemcpyDeviceToHost, s));
    MK_CUDA_CHECK(cudaMemcpyAsync(b.data(), y_ref.get(), b.size() * 2, cudaMemcpyDeviceToHost, s));
    MK_CUDA_CHECK(cudaStreamSynchronize(s));
    EpRow row;
    row.tokens_per_rank = T, row.mode = decode ? "decode" : "prefill", row.config = ep_layer.local_plan().str();
    row.overflow = st.overflow, row.bytes_on_wire = st.bytes_on_wire;
    row.bitwise = st.overflow == 0 && !st.ids_out_of_range && a == b;
    all_ok = all_ok && row.bitwise;

    // step
    if (decode) {
      LayerGraphs graphs;
      graphs.capture(step, s);
      row.step_ms = time_rotated_ms(graphs, 1, args.warmup, args.steps, s);
      LayerGraphs ex;
      ex.capture([&] { ep_layer.exchange_only(s); }, s);
      row.exchange_ms = time_rotated_ms(ex, 1, args.warmup, args.steps, s);
    } else {
      row.step_ms = time_median_ms(s, args.warmup, args.steps, [&](int) { step(); });
      row.exchange_ms = time_median_ms(s, args.warmup, args.steps, [&](int) { ep_layer.exchange_only(s); });
    }
    // NCCL's all-to-all with the step's bytes to peers: per direction, bytes/(2*(R-1)) to each.
    // Every rank must post the same sizes: the largest rank's bytes (prefill's differ a little).
    const int64_t bytes = max_over_ranks(comm, row.bytes_on_wire, s);
    const size_t per_peer = R > 1 ? size_t(bytes / (2 * (R - 1))) / 16 * 16 : 0;
    if (per_peer > 0) {
      const DeviceBuffer sb(int64_t(per_peer) * R), rb(int64_t(per_peer) * R);
      row.nccl_ms = time_median_ms(s, args.warmup, args.steps, [&](int) {
        comm.all_to_all(sb.get(), rb.get(), per_peer, s);
        comm.all_to_all(sb.get(), rb.get(), per_peer, s);
      });
    }
    if (lead)
      std::printf("%8lld %-8s %10.4f %10.4f %10.4f %10.2f %10.1f %9.1f %7.1f%% %s\n", (long long)T, row.mode.c_str(),
                  row.step_ms, row.exchange_ms, row.nccl_ms, row.bytes_on_wire / 1e6, row.a2a_GBps(), row.nccl_GBps(),
                  row.nccl_ms > 0 ? 100.0 * row.nccl_ms / row.exchange_ms : 0.0,
                  row.bitwise ? "bitwise = 1 GPU" : "MISMATCH");
    rows.push_back(row);
  }

  if (lead && !args.json.empty()) {
    nlohmann::json j;
    j["command"] = command;
    j["date"] = iso_utc_now();
    j["gpu"] = dev.name;
    j["nccl"] = ep::nccl_version();
    j["ranks"] = R;
    j["layer"] = spec.str();
    j["slots_per_rank"] = S;
    j["note"] =
        "tokens_per_rank: each rank's slice of one R*T batch. step: route + EpLayer::forward (decode: CUDA graph "
        "replay). exchange: the step's dispatch + return exchanges alone. nccl: NCCL all-to-all (grouped "
        "send/recv, equal sizes) moving the same bytes to peers, twice. bytes: rank 0 to its peers, both "
        "directions. bitwise: EP output == experts_forward on one GPU with the same configs.";
    for (const EpRow& r : rows)
      j["rows"].push_back({{"tokens_per_rank", r.tokens_per_rank},
                           {"mode", r.mode},
                           {"config", r.config},
                           {"step_ms", r.step_ms},
                           {"exchange_ms", r.exchange_ms},
                           {"nccl_alltoall_ms", r.nccl_ms},
                           {"bytes_to_peers", r.bytes_on_wire},
                           {"exchange_GBps", r.a2a_GBps()},
                           {"nccl_alltoall_GBps", r.nccl_GBps()},
                           {"fraction_of_nccl", r.nccl_ms > 0 ? r.nccl_ms / r.exchange_ms : 0.0},
                           {"overflow", r.overflow},
                           {"bitwise_equal_single_gpu", r.bitwise}});
    std::ofstream(args.json) << j.dump(2) << "\n";
    std::printf("wrote %zu rows to %s\n", rows.size(), args.json.c_str());
  }
  return all_ok ? kExitOk : kExitFailed;
}

}  // namespace

int run_bench_ep(const BenchArgs& args, const std::string& command, int argc, char** argv) {
  if (const std::optional<ep::RankEnv> env = ep::rank_from_env()) return run_rank(args, *env, command);
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) cudaGetLastError(), gpus = 0;
  if (args.ep > gpus) {
    std::fprintf(stderr, "moekit bench --ep %d needs %d GPUs (one per rank); this machine has %d.\n", args.ep, args.ep,
                 gpus);
    return kExitNoGpu;
  }
  if (!require_hopper("bench --ep", "", "Run it on a machine with several Hopper GPUs.")) return kExitNoGpu;
  ep::nccl_version();  // a missing NCCL is reported here, once, not by every rank
  const std::vector<std::string> rest(argv + 1, argv + argc);
  const std::vector<int> status = ep::spawn_ranks(args.ep, rest);
  int rc = kExitOk;
  for (size_t r = 0; r < status.size(); ++r)
    if (status[r] != 0) {
      std::fprintf(stderr, "moekit bench --ep: rank %zu exited with status %d\n", r, status[r]);
      rc = kExitFailed;
    }
  return rc;
}

}  // namespace moekit::cli
