# _moekit.pyi — the types of the extension moekit._moekit (python/src/bindings.cpp), for type
# checkers and editors. Made by `python -m nanobind.stubgen -m moekit._moekit`, then edited: array
# arguments are DLPackArray (any array with DLPack support, or a DLPack capsule: the binding checks
# dtype, rank, strides and device, naming the argument), the exceptions are declared, and the
# device argument of plan_forward is typed. tests/python/test_stubs.py checks that the names and
# parameters here are the module's: regenerate or edit this file with bindings.cpp.
"""
moekit: the kernels of one Mixture-of-Experts layer for NVIDIA Hopper (sm_90a).
"""

from typing import Any, TypeAlias

# An array with DLPack support (torch.Tensor, CuPy, JAX, NumPy for the checks) or a DLPack capsule.
DLPackArray: TypeAlias = Any

__version__: str

class Error(ValueError):
    """A bad argument; the message names it (shown as moekit.Error)."""

class CudaError(RuntimeError):
    """No usable GPU, or a CUDA call failed (shown as moekit.CudaError)."""


MAX_EXPERTS: int = 512

MAX_TOPK: int = 16

FP8_BLOCK: int = 128

def device_count() -> int:
    """Number of visible CUDA devices; 0 where there is no GPU or driver."""

class DeviceInfo:
    """What the config chooser knows of a GPU (moekit.query_device())."""

    def __init__(self, *, name: str = '', sm_count: int = 0, cc_major: int = 0, cc_minor: int = 0, smem_per_block_optin: int = 0, l2_bytes: int = 0) -> None: ...

    @property
    def name(self) -> str: ...

    @name.setter
    def name(self, arg: str, /) -> None: ...

    @property
    def sm_count(self) -> int: ...

    @sm_count.setter
    def sm_count(self, arg: int, /) -> None: ...

    @property
    def cc_major(self) -> int: ...

    @cc_major.setter
    def cc_major(self, arg: int, /) -> None: ...

    @property
    def cc_minor(self) -> int: ...

    @cc_minor.setter
    def cc_minor(self, arg: int, /) -> None: ...

    @property
    def smem_per_block_optin(self) -> int: ...

    @smem_per_block_optin.setter
    def smem_per_block_optin(self, arg: int, /) -> None: ...

    @property
    def l2_bytes(self) -> int: ...

    @l2_bytes.setter
    def l2_bytes(self, arg: int, /) -> None: ...

    def __repr__(self) -> str: ...

def query_device(device: int = -1) -> DeviceInfo:
    """
    Properties of a CUDA device (-1: the current one). Raises moekit.CudaError without a GPU.
    """

class Plan:
    """
    The plan of one forward pass: every kernel choice and the buffer sizes (plan_forward).
    """

    @property
    def tokens(self) -> int: ...

    @property
    def hidden(self) -> int: ...

    @property
    def inter(self) -> int: ...

    @property
    def experts(self) -> int: ...

    @property
    def topk(self) -> int: ...

    @property
    def precision(self) -> str:
        """'bf16' or 'fp8': the precision of the expert GEMMs"""

    @property
    def block_m(self) -> int: ...

    @property
    def max_rows(self) -> int: ...

    @property
    def max_blocks(self) -> int: ...

    @property
    def down_splits(self) -> int:
        """
        split-K of the down GEMM: > 1 writes FP32 partials (combine_partials sums them)
        """

    @property
    def up(self) -> str: ...

    @property
    def down(self) -> str: ...

    @property
    def router(self) -> str: ...

    @property
    def workspace_bytes(self) -> int: ...

    def workspace_layout(self) -> dict[str, tuple[int, str, list[int]]]:
        """
        {name: (offset_bytes, dtype, shape)} of the tensors carved from the workspace.
        """

    def str(self) -> str: ...

    def __str__(self) -> str: ...

    def __repr__(self) -> str: ...

def plan_forward(tokens: int, hidden: int, inter: int, experts: int, topk: int, *, device: int | DeviceInfo | None = None, precision: str = 'bf16') -> Plan:
    """
    Validates the shape and picks tile configs for it. device: None (the current GPU), a device index, or a moekit.DeviceInfo (plans without a GPU). precision: 'bf16', or 'fp8' (DeepSeek-V3's e4m3 weights with 128x128 block scales; H and F multiples of 16).
    """

def compiled_gemm_configs(precision: str = 'bf16') -> list[str]: ...

def route(x: DLPackArray | None, w_gate: DLPackArray | None, router_logits: DLPackArray | None, score_bias: DLPackArray | None, topk_ids: DLPackArray | None, topk_weights: DLPackArray | None, *, scoring: str = 'softmax', renormalize: bool = False, n_group: int = 0, topk_group: int = 0, routed_scaling_factor: float = 1.0, logits_scratch: DLPackArray | None = None, stream: int = 0) -> None:
    """
    Stage 1: writes topk_ids [T,k] i32 and topk_weights [T,k] f32 from router_logits [T,E] f32, or from x [T,H] bf16 and w_gate [E,H] bf16/f32. logits_scratch [T,E] f32 (optional, w_gate path): the logits are then computed over many SMs first (bf16 w_gate: on the tensor cores, deterministic and batch-invariant, within 2^-12*sum|x*w| of FP32; f32 w_gate: the same bits as without it).
    """

def quantize_tokens(plan: Plan, x: DLPackArray | None, workspace: DLPackArray | None, *, stream: int = 0) -> None:
    """
    Stage 1b of fp8 plans: x [T,H] bf16 -> the workspace's x_q [T,H] e4m3 and x_scale [T,ceil(H/128)] f32, per token and 128 columns (amax / 448).
    """

def quantize_weights(w: DLPackArray | None, q: DLPackArray | None, scale: DLPackArray | None, *, stream: int = 0) -> None:
    """
    bf16 weights to DeepSeek-V3's FP8 format: w [P,R,C] bf16 (w13 [E,2F,H] as [2E,F,H]) -> q [P,R,C] e4m3 and scale [P,ceil(R/128),ceil(C/128)] f32, per 128x128 block (amax / 448; scale dequantizes).
    """

def align(plan: Plan, topk_ids: DLPackArray | None, workspace: DLPackArray | None, *, expert_load: DLPackArray | None = None, stream: int = 0) -> None:
    """
    Stage 2: the expert-sorted, block_m-padded order of the assignments, in the workspace. expert_load [E] int64 (optional): gains this call's assignments per expert, on the device.
    """

def expert_up(plan: Plan, x: DLPackArray | None, w13: DLPackArray | None, workspace: DLPackArray | None, *, w13_scale: DLPackArray | None = None, h: DLPackArray | None = None, stream: int = 0) -> None:
    """
    Stage 3: act = silu(x·W_gateᵀ) ⊙ (x·W_upᵀ) per sorted row, in the workspace. fp8 plans: x is the workspace's x_q (quantize_tokens), w13 e4m3 with w13_scale [E,2·ceil(F/128),ceil(H/128)] f32. h [plan.max_rows,2F] bf16 (optional, bf16 plans): g|u of every sorted row too, as moe_forward's h.
    """

def expert_down(plan: Plan, w2: DLPackArray | None, topk_weights: DLPackArray | None, workspace: DLPackArray | None, *, w2_scale: DLPackArray | None = None, stream: int = 0) -> None:
    """
    Stage 4: y_rows[a] = topk_weights[a] · act·W2ᵀ, in the workspace. fp8 plans: w2 e4m3 with w2_scale [E,ceil(H/128),ceil(F/128)] f32.
    """

def combine(y_rows: DLPackArray | None, topk: int, y: DLPackArray | None, *, stream: int = 0) -> None:
    """Stage 5: y[t] = Σ_j y_rows[t*k+j] in slot order (no atomics)."""

def combine_partials(y_partials: DLPackArray | None, topk: int, y: DLPackArray | None, *, stream: int = 0) -> None:
    """
    Stage 5 after a split-K down GEMM (plan.down_splits > 1): y[t] = Σ_j Σ_s y_partials[s][t*k+j].
    """

def moe_forward(plan: Plan, x: DLPackArray | None, w_gate: DLPackArray | None, router_logits: DLPackArray | None, score_bias: DLPackArray | None, w13: DLPackArray | None, w2: DLPackArray | None, y: DLPackArray | None, workspace: DLPackArray | None, *, scoring: str = 'softmax', renormalize: bool = False, n_group: int = 0, topk_group: int = 0, routed_scaling_factor: float = 1.0, w13_scale: DLPackArray | None = None, w2_scale: DLPackArray | None = None, expert_load: DLPackArray | None = None, h: DLPackArray | None = None, stream: int = 0) -> None:
    """
    The whole layer: route -> align -> up -> down -> combine into y [T,H] bf16. fp8 plans: w13/w2 e4m3 with their block scales w13_scale/w2_scale f32 (x is quantized on the device). expert_load [E] int64 (optional): gains this call's assignments per expert, on the device (never read or cleared by moekit). h [plan.max_rows,2F] bf16 (optional, bf16 plans: the training forward): the up GEMM also writes g|u, its gate and up values before SwiGLU, of every sorted row (the workspace's sorted_ids order; padding rows are not written) for moe_backward(..., h=h) with a plan_backward(..., saved='h'); it shares no memory with another argument. y is the same with or without h; the plan given is not changed.
    """

def experts_forward(plan: Plan, x: DLPackArray | None, w13: DLPackArray | None, w2: DLPackArray | None, topk_ids: DLPackArray | None, topk_weights: DLPackArray | None, y: DLPackArray | None, workspace: DLPackArray | None, *, w13_scale: DLPackArray | None = None, w2_scale: DLPackArray | None = None, expert_load: DLPackArray | None = None, h: DLPackArray | None = None, stream: int = 0) -> None:
    """
    Stages 2-5 with the routing given (topk_ids [T,k] i32, topk_weights [T,k] f32); fp8 plans: the weights' block scales, and expert_load and h (the training forward's g|u, bf16 plans), as in moe_forward.
    """

def check_status(plan: Plan, workspace: DLPackArray | None, *, stream: int = 0) -> None:
    """
    Synchronises the stream and raises moekit.Error if a kernel flagged bad input (an expert id outside [0, E)). Not for hot loops.
    """

# The backward (python/src/bindings_backward.cpp, include/moekit/backward.hpp).

# The smallest and largest block_m of the compiled bf16 configs: every aligned layout a bf16 plan lays
# out has at most T·k + (E+1)·(MAX_BLOCK_M − 1) rows and ceil(T·k / MIN_BLOCK_M) + E blocks.
MIN_BLOCK_M: int = 16

MAX_BLOCK_M: int = 128

class BackwardPlan:
    """
    The plan of one backward pass, made from the forward's (plan_backward): every kernel choice and the workspace size.
    """

    @property
    def tokens(self) -> int: ...

    @property
    def hidden(self) -> int: ...

    @property
    def inter(self) -> int: ...

    @property
    def experts(self) -> int: ...

    @property
    def topk(self) -> int: ...

    @property
    def block_m(self) -> int:
        """rows per block of the forward's aligned layout, which it replays"""

    @property
    def saved(self) -> str:
        """'recompute' (h = x·W13ᵀ again) or 'h' (the forward kept h)"""

    @property
    def router(self) -> str:
        """'none', 'logits' or 'gate': the router gradient it computes"""

    @property
    def input_grad(self) -> bool: ...

    @property
    def weight_grads(self) -> bool: ...

    @property
    def weight_grad_dtype(self) -> str: ...

    @property
    def accumulate_weight_grads(self) -> bool: ...

    @property
    def max_rows(self) -> int: ...

    @property
    def max_blocks(self) -> int: ...

    @property
    def dx_splits(self) -> int: ...

    @property
    def dw_splits(self) -> int: ...

    @property
    def gate_splits(self) -> int: ...

    @property
    def tile_rows(self) -> int: ...

    @property
    def h_wgmma(self) -> bool: ...

    @property
    def d_wgmma(self) -> bool: ...

    @property
    def dx_wgmma(self) -> bool: ...

    @property
    def dw_wgmma(self) -> bool: ...

    @property
    def up(self) -> str: ...

    @property
    def d(self) -> str: ...

    @property
    def dx(self) -> str: ...

    @property
    def source(self) -> str: ...

    @property
    def workspace_bytes(self) -> int: ...

    def str(self) -> str: ...

    def __str__(self) -> str: ...

    def __repr__(self) -> str: ...

def plan_backward(forward: Plan, *, device: int | DeviceInfo | None = None, saved: str = 'recompute', router: str = 'none', input_grad: bool = True, weight_grads: bool = True, weight_grad_dtype: str = 'bf16', accumulate_weight_grads: bool = False) -> BackwardPlan:
    """
    The backward of a forward planned as `forward` (a bf16 moekit.Plan; the backward replays its layout). device: None (the current GPU), a device index, or a moekit.DeviceInfo (plans without a GPU). saved: 'recompute' or 'h'; router: 'none' (the routing was given: d_topk_weights), 'logits' (d_router_logits) or 'gate' (d_w_gate, and dx gains the router's part); input_grad: dx; weight_grads: dw13 and dw2, of weight_grad_dtype 'bf16' or 'f32' (accumulate_weight_grads: += into f32 ones).
    """

def backward_workspace_bytes(plan: BackwardPlan) -> int:
    """Bytes of the backward's workspace (plan.workspace_bytes)."""

def moe_backward(plan: BackwardPlan, x: DLPackArray | None, w13: DLPackArray | None, w2: DLPackArray | None, topk_ids: DLPackArray | None, topk_weights: DLPackArray | None, sorted_ids: DLPackArray | None, block_expert: DLPackArray | None, num_rows_padded: DLPackArray | None, expert_counts: DLPackArray | None, dy: DLPackArray | None, workspace: DLPackArray | None, *, w_gate: DLPackArray | None = None, router_logits: DLPackArray | None = None, h: DLPackArray | None = None, d_logits_aux: DLPackArray | None = None, dx: DLPackArray | None = None, dw13: DLPackArray | None = None, dw2: DLPackArray | None = None, d_topk_weights: DLPackArray | None = None, d_router_logits: DLPackArray | None = None, d_w_gate: DLPackArray | None = None, scoring: str = 'softmax', renormalize: bool = False, n_group: int = 0, topk_group: int = 0, routed_scaling_factor: float = 1.0, stream: int = 0) -> None:
    """
    The backward of the layer the forward ran: x [T,H] bf16, w13 [E,2F,H], w2 [E,H,F] bf16, the forward's routing (topk_ids [T,k] i32, topk_weights [T,k] f32) and aligned layout (its workspace's sorted_ids [max_rows], block_expert [max_blocks], num_rows_padded [1], expert_counts [E] i32: views, or copies), dy [T,H] bf16 and a workspace of plan.workspace_bytes (not the forward's). router 'gate': w_gate [E,H] and the forward's router_logits [T,E] f32 (+ d_logits_aux [T,E] f32, optional); 'logits': router_logits. Writes what the plan computes and refuses the rest: dx [T,H] bf16 (input_grad), dw13, dw2 (weight_grads), d_topk_weights [T,k] f32 (required with router 'none'), d_router_logits [T,E] f32 ('logits'), d_w_gate [E,H] of w_gate's dtype ('gate'). The router options are the forward's. Deterministic, no allocation or sync: CUDA-graph capturable.
    """
