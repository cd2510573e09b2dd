// sm90_expert_gemm.hpp — host entry of the Hopper (wgmma + TMA) prefill expert GEMM
// (device code: sm90_expert_gemm.cuh; launcher: sm90_expert_gemm.cu). Host-only declarations.
//
// It takes the same kernels::gemm::Params as the mma.sync kernel (expert_gemm.cuh) and a plan
// whose block_m is 128 (the aligned layout's row blocks are this kernel's M tiles).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "moekit/moe.hpp"

namespace moekit::kernels::gemm {
enum class Mode;
struct Params;
}  // namespace moekit::kernels::gemm

namespace moekit::detail {

// Rows per tile of the sm90 kernel: the plan's block_m must equal it.
inline constexpr int kSm90BlockM = 128;

// Column tile widths (B rows per tile) compiled; Up tiles produce block_n/2 act columns.
const std::vector<int>& sm90_block_ns();

// Runs one expert GEMM (mode Up: act = silu(x·W_gateᵀ)⊙(x·W_upᵀ); Down: y_rows = w·act·W2ᵀ) on the
// stream. `p` as for the mma.sync kernel (p.n_tiles is ignored and recomputed for block_n);
// `plan` gives E (the weights' 4-D TMA view), max_blocks (the grid bound) and block_m (checked).
// Throws moekit::Error on a precondition it cannot meet (names the argument), CudaError on a
// CUDA/driver failure. No allocation, no synchronisation: safe to capture in a CUDA graph.
void launch_sm90_expert_gemm(kernels::gemm::Mode mode, const kernels::gemm::Params& p, const ForwardPlan& plan,
                             cudaStream_t stream, int block_n = 256);

}  // namespace moekit::detail
