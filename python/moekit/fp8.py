"""moekit.fp8 — DeepSeek-V3's FP8 format on torch tensors: the quantizer of bf16 weights (on the
GPU, and its CPU reference), dequantization, and the checks of fused_moe's FP8 arguments.

The format (docs/design.md, "FP8"): e4m3 weights (torch.float8_e4m3fn) w13 [E, 2F, H] (gate rows,
then up rows) and w2 [E, H, F], each with FP32 block scales, one per 128 x 128 block of each
projection: w13_scale [E, 2·ceil(F/128), ceil(H/128)] (gate's blocks, then up's), w2_scale
[E, ceil(H/128), ceil(F/128)]. A scale dequantizes (the checkpoint's weight_scale_inv):
w ≈ q · scale. A dimension that is not a multiple of 128 has a partial last block. The GEMMs need
H and F multiples of 16. Activations are quantized by the library on the device (per token and
128 columns), so fused_moe takes no activation scales.

The quantization of a block v, in FP32 (the library's contract, bit for bit):
amax = max |v| (NaN if any v is NaN), a = max(amax, 2^-100), scale = a / 448,
q = e4m3(v · (448 / a)) rounded to nearest even, saturating at ±448; a NaN q is 0x7F and a NaN
scale 0x7FFFFFFF.
"""
from __future__ import annotations

from typing import Optional

from ._requires import require

require("moekit.fp8")

import torch
from torch import Tensor

from . import _moekit as _C
from ._torch_util import _check, _check_experts, _dl, _fail, _stream

__all__ = ["BLOCK", "E4M3_MAX", "blocks", "to_e4m3", "quantize_fp8_weights", "quantize_weight_blocks",
           "quantize_fp8_weights_reference", "quantize_weight_blocks_reference", "dequantize_weight_blocks",
           "dequantize_fp8_weights"]

BLOCK = _C.FP8_BLOCK  # 128: weights per 128 x 128 block, activations per 128 columns
E4M3_MAX = 448.0      # the largest finite e4m3
_AMAX_FLOOR = 2.0 ** -100
e4m3 = torch.float8_e4m3fn


def blocks(n: int) -> int:
    """ceil(n / 128): the blocks of a dimension of n."""
    return -(-n // BLOCK)


# ---- the quantizer --------------------------------------------------------------------------

def quantize_weight_blocks(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [P, R, C] bf16 on a CUDA device -> (q [P, R, C] float8_e4m3fn, scale [P, ceil(R/128),
    ceil(C/128)] float32), by the library's quantize_weights on the current stream (no host sync).
    C must be a multiple of 16."""
    fn = "quantize_weight_blocks"
    _check(fn, "w", w, (torch.bfloat16,), (("P", None), ("R", None), ("C", None)))
    P, R, C = w.shape
    q = torch.empty((P, R, C), dtype=e4m3, device=w.device)
    scale = torch.empty((P, blocks(R), blocks(C)), dtype=torch.float32, device=w.device)
    _C.quantize_weights(_dl(w), _dl(q), _dl(scale), stream=_stream(w.device))
    return q, scale


def quantize_fp8_weights(w13: Tensor, w2: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """bf16 expert weights -> DeepSeek-V3's FP8 format on their GPU: (w13_q, w13_scale, w2_q,
    w2_scale) for fused_moe(..., use_fp8_w8a8=True, w1_scale=w13_scale, w2_scale=w2_scale,
    block_shape=[128, 128]). w13 [E, 2F, H] is quantized as 2E projections [F, H] (gate's and
    up's blocks apart); H and F multiples of 16."""
    fn = "quantize_fp8_weights"
    _check(fn, "w13", w13, (torch.bfloat16,), (("E", None), ("2F", None), ("H", None)))
    E, F2, H = w13.shape
    if F2 % 2 != 0:
        _fail(fn, "w13", f"expected shape [E, 2F, H] (gate rows then up rows), got an odd row count {F2}")
    F = F2 // 2
    _check(fn, "w2", w2, (torch.bfloat16,), (("E", E), ("H", H), ("F", F)), w13.device, "w13")
    _check_multiples_of_16(fn, H, F)
    q13, s13 = quantize_weight_blocks(w13.view(2 * E, F, H))
    q2, s2 = quantize_weight_blocks(w2)
    return q13.view(E, F2, H), s13.view(E, 2 * blocks(F), blocks(H)), q2, s2


def _nan_as(t: Tensor, bits: int) -> Tensor:
    """t with every NaN written as the one pattern `bits` (the library's NaN)."""
    ints = t.view({1: torch.uint8, 4: torch.int32}[t.element_size()])
    return torch.where(torch.isnan(t.float()), torch.tensor(bits, dtype=ints.dtype), ints).view(t.dtype)


def quantize_weight_blocks_reference(w: Tensor) -> tuple[Tensor, Tensor]:
    """The CPU reference of quantize_weight_blocks, in plain torch FP32 (any float dtype in, computed
    on the CPU): the same bits as the library's kernel (src/reference/fp8.cpp's arithmetic).
    NOTES: the divisions take two tensors (a scalar operand may become a multiplication by its
    reciprocal), and the product is clamped to ±448 before the cast (torch's cast to float8_e4m3fn
    gives NaN past 464 rather than saturating)."""
    if w.dim() != 3:
        _fail("quantize_weight_blocks_reference", "w", f"expected shape [P, R, C], got {list(w.shape)}")
    v = w.detach().to("cpu", torch.float32)
    P, R, C = v.shape
    rb, cb = blocks(R), blocks(C)
    padded = v.new_zeros((P, rb * BLOCK, cb * BLOCK))  # zeros leave every block's amax as it is
    padded[:, :R, :C] = v
    amax = padded.view(P, rb, BLOCK, cb, BLOCK).abs().amax(dim=(2, 4))  # NaN if the block has one
    a = torch.maximum(amax, torch.full_like(amax, _AMAX_FLOOR))         # NaN stays NaN
    inv = torch.full_like(a, E4M3_MAX) / a
    scale = a / torch.full_like(a, E4M3_MAX)
    inv_e = inv.repeat_interleave(BLOCK, dim=1).repeat_interleave(BLOCK, dim=2)[:, :R, :C]
    return to_e4m3(v * inv_e), _nan_as(scale, 0x7FFFFFFF)


def to_e4m3(v: Tensor) -> Tensor:
    """float32 -> float8_e4m3fn as the library converts: round to nearest even, ±448 past the
    range and for ±Inf (saturation), 0x7F for every NaN."""
    return _nan_as(v.clamp(-E4M3_MAX, E4M3_MAX).to(e4m3), 0x7F)


def quantize_fp8_weights_reference(w13: Tensor, w2: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """quantize_fp8_weights on the CPU (quantize_weight_blocks_reference), same outputs and bits."""
    E, F2, H = w13.shape
    q13, s13 = quantize_weight_blocks_reference(w13.reshape(2 * E, F2 // 2, H))
    q2, s2 = quantize_weight_blocks_reference(w2)
    return q13.view(E, F2, H), s13.view(E, -1, s13.shape[-1]), q2, s2


# ---- dequantization -------------------------------------------------------------------------

def dequantize_weight_blocks(q: Tensor, scale: Tensor) -> Tensor:
    """q [P, R, C] float8_e4m3fn and scale [P, ceil(R/128), ceil(C/128)] -> q · scale [P, R, C]
    float32 (exact: an e4m3 times an FP32 scale is one FP32 rounding)."""
    P, R, C = q.shape
    s = scale.float().repeat_interleave(BLOCK, dim=1).repeat_interleave(BLOCK, dim=2)[:, :R, :C]
    return q.float() * s


def dequantize_fp8_weights(w13: Tensor, w13_scale: Tensor, w2: Tensor, w2_scale: Tensor) -> tuple[Tensor, Tensor]:
    """FP8 experts in moekit's layout -> (w13 [E, 2F, H], w2 [E, H, F]) float32, gate and up
    dequantized with their own blocks."""
    E, F2, H = w13.shape
    d13 = dequantize_weight_blocks(w13.reshape(2 * E, F2 // 2, H), w13_scale.reshape(2 * E, -1, w13_scale.shape[-1]))
    return d13.view(E, F2, H), dequantize_weight_blocks(w2, w2_scale)


# ---- fused_moe's FP8 arguments --------------------------------------------------------------

def _check_multiples_of_16(fn: str, H: int, F: int):
    if H % 16 != 0 or F % 16 != 0:
        _fail(fn, "w13", f"FP8 needs H and F multiples of 16 (16-byte rows of e4m3), got H={H}, F={F}")


def check_fp8_experts(fn: str, x, w13, w2, use_fp8_w8a8, w13_scale: Optional[Tensor], w2_scale: Optional[Tensor],
                      a1_scale, a2_scale, block_shape) -> tuple[int, int, int, int]:
    """The expert arguments of fused_moe / fused_experts with vLLM's FP8 flags -> (T, H, F, E).

    use_fp8_w8a8=True: w13/w2 float8_e4m3fn, w13_scale/w2_scale float32 of the block-scale shapes,
    block_shape [128, 128]; a1_scale/a2_scale (static activation scales) are refused, since the
    library quantizes activations itself. use_fp8_w8a8=False: bf16 weights and none of these."""
    if not isinstance(use_fp8_w8a8, bool):
        raise TypeError(f"moekit.{fn}: argument 'use_fp8_w8a8': expected a bool, got {type(use_fp8_w8a8).__name__}")
    if not use_fp8_w8a8:
        for arg, value in (("w13_scale", w13_scale), ("w2_scale", w2_scale), ("block_shape", block_shape),
                           ("a1_scale", a1_scale), ("a2_scale", a2_scale)):
            if value is not None:
                _fail(fn, arg, "is an FP8 argument: pass use_fp8_w8a8=True (or drop it)")
        for arg, w in (("w13", w13), ("w2", w2)):
            if isinstance(w, torch.Tensor) and w.dtype == e4m3:
                _fail(fn, arg, "is float8_e4m3fn: FP8 experts need use_fp8_w8a8=True with w1_scale, w2_scale and "
                               "block_shape=[128, 128]")
        return _check_experts(fn, x, w13, w2)
    for arg, value in (("a1_scale", a1_scale), ("a2_scale", a2_scale)):
        if value is not None:
            _fail(fn, arg, "static activation scales are not supported: moekit quantizes activations on the device, "
                           "per token and 128 columns; pass None")
    if block_shape is None or not isinstance(block_shape, (list, tuple)) or \
            [b if isinstance(b, int) and not isinstance(b, bool) else None for b in block_shape] != [BLOCK, BLOCK]:
        _fail(fn, "block_shape", f"FP8 experts need block_shape=[{BLOCK}, {BLOCK}] (DeepSeek-V3's 128 x 128 weight "
                                 f"blocks; per-tensor and per-channel scales are not supported), got {block_shape!r}")
    T, H, F, E = _check_experts(fn, x, w13, w2, e4m3)
    _check_multiples_of_16(fn, H, F)
    fb, hb = blocks(F), blocks(H)
    for arg, alias, s, dims in (
            ("w13_scale", "w1_scale", w13_scale, (("E", E), ("2*ceil(F/128)", 2 * fb), ("ceil(H/128)", hb))),
            ("w2_scale", None, w2_scale, (("E", E), ("ceil(H/128)", hb), ("ceil(F/128)", fb)))):
        if s is None:
            also = f" (vLLM's name: '{alias}')" if alias else ""
            _fail(fn, arg, f"is required with use_fp8_w8a8=True{also}: the float32 block scales of the weights")
        _check(fn, arg, s, (torch.float32,), dims, x.device)
    return T, H, F, E
