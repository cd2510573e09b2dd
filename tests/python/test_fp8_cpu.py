"""CPU tests of moekit.fp8's reference quantizer (DeepSeek-V3's 128 x 128 blocks, amax / 448),
against a scalar transcription of the library's host oracle (src/reference/fp8.cpp: to_e4m3,
quantize_weight_blocks) in NumPy float32, one IEEE operation at a time: the reference the GPU
test compares the library's quantizer with bit for bit. Needs PyTorch and NumPy, not a GPU."""
import math

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

from moekit.fp8 import (BLOCK, dequantize_fp8_weights, dequantize_weight_blocks,  # noqa: E402
                        quantize_fp8_weights_reference, quantize_weight_blocks_reference, to_e4m3)

f32 = np.float32


def e4m3_oracle(f: float) -> int:
    """ref::to_e4m3: round to nearest even, saturate past ±448 (and ±Inf), NaN -> 0x7F."""
    if f != f:
        return 0x7F
    sign = 0x80 if math.copysign(1.0, f) < 0 else 0
    a = abs(f)
    if a >= 448.0:
        return sign | 0x7E
    if a < 2.0 ** -6:
        return sign | int(np.rint(f32(a) * f32(512.0)))  # exact scaling; rint rounds half to even
    _, ex = math.frexp(a)
    e = ex - 1
    m = int(np.rint(math.ldexp(a, 3 - e)))
    return sign | (((e + 7) << 3) + m - 8)


def block_oracle(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ref::quantize_weight_blocks of one [P, R, C] float32 array, block by block, in NumPy float32."""
    P, R, C = v.shape
    rb, cb = -(-R // BLOCK), -(-C // BLOCK)
    q = np.zeros(v.shape, np.uint8)
    scale = np.zeros((P, rb, cb), np.float32)
    for p in range(P):
        for i in range(rb):
            for j in range(cb):
                blk = v[p, i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
                amax = f32(np.nan) if np.isnan(blk).any() else f32(np.abs(blk).max())
                a = amax if amax != amax else max(amax, f32(2.0 ** -100))
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    inv, s = f32(448.0) / a, a / f32(448.0)
                    prod = (blk * inv).astype(np.float32)  # one FP32 rounding of each product
                    q[p, i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = \
                        np.vectorize(e4m3_oracle, otypes=[np.uint8])(prod)
                scale[p, i, j] = s
    scale_bits = scale.view(np.uint32)
    scale_bits[np.isnan(scale)] = 0x7FFFFFFF  # the GPU's NaN
    return q, scale


def bits(t: torch.Tensor) -> np.ndarray:
    return t.view({1: torch.uint8, 4: torch.int32}[t.element_size()]).numpy()


def test_e4m3_conversion_matches_the_oracle_on_every_bf16_value_and_every_tie():
    """Every bf16 value (as float32), every midpoint between neighbouring e4m3 values and the
    floats one step either side of it: ties to even, subnormals, saturation, signed zero, NaN."""
    all_bf16 = (torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)).float()
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[grid.isfinite()].unique()  # sorted, -448 .. 448
    mids = (grid[1:].double() + grid[:-1].double()) / 2  # exact in float32 (e4m3 has 3 mantissa bits)
    past = torch.tensor([464.0, -464.0, 480.0, 1e30, math.inf, -math.inf], dtype=torch.float64)  # saturation
    mids = torch.cat([mids, past])
    m32 = mids.float()
    near = torch.cat([m32, torch.nextafter(m32, torch.full_like(m32, math.inf)),
                      torch.nextafter(m32, torch.full_like(m32, -math.inf))])
    values = torch.cat([all_bf16, near])
    got = bits(to_e4m3(values))
    want = np.array([e4m3_oracle(float(f)) for f in values.tolist()], np.uint8)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, \
        f"{bad.size} values differ; first {values[bad[0]].item()!r}: {got[bad[0]]:#x}, oracle {want[bad[0]]:#x}"


@pytest.mark.parametrize("shape", [(2, 256, 256), (3, 130, 144), (1, 16, 48)])  # partial blocks: 130, 144, 16, 48
def test_block_quantizer_matches_the_oracle(shape):
    g = torch.Generator().manual_seed(sum(shape))
    w = torch.randn(shape, generator=g) * torch.logspace(-3, 3, shape[1])[None, :, None]  # blocks of many scales
    w = w.to(torch.bfloat16)
    q, scale = quantize_weight_blocks_reference(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == shape
    assert scale.dtype == torch.float32 and scale.shape == (shape[0], -(-shape[1] // BLOCK), -(-shape[2] // BLOCK))
    want_q, want_s = block_oracle(w.float().numpy())
    assert np.array_equal(bits(q), want_q)
    assert np.array_equal(bits(scale), want_s.view(np.int32))


def test_block_quantizer_edge_cases_match_the_oracle():
    """docs/design.md's edge cases, one block each: zeros (and -0), tiny (amax < 2^-100), the bf16
    maximum, a NaN, an Inf; then the rounding: q·scale within half an e4m3 step of w."""
    w = torch.zeros(1, 256, 384)
    w[0, 0, 1] = -0.0
    w[0, :128, 128:256] = 2.0 ** -110                       # tiny
    w[0, 5, 130] = -(2.0 ** -112)
    w[0, :128, 256:] = torch.finfo(torch.bfloat16).max      # huge
    w[0, 128:, :128] = torch.linspace(-1, 1, 128 * 128).view(128, 128)
    w[0, 200, 7] = float("nan")                             # NaN: the whole block
    w[0, 128:, 128:256] = 0.5
    w[0, 130, 140] = -float("inf")                          # Inf: scale Inf, that q NaN, the others 0
    q, scale = quantize_weight_blocks_reference(w)
    want_q, want_s = block_oracle(w.numpy())
    assert np.array_equal(bits(q), want_q) and np.array_equal(bits(scale), want_s.view(np.int32))
    qb, sb = bits(q)[0], bits(scale)[0]
    assert qb[0, 1] == 0x80 and (qb[:128, :128] & 0x7F == 0).all()
    assert scale[0, 0, 0].item() == f32(2.0 ** -100) / f32(448) and math.isfinite(scale[0, 0, 2].item())
    assert (qb[128:, :128] == 0x7F).all() and sb[1, 0] == 0x7FFFFFFF
    assert scale[0, 1, 1].item() == math.inf and qb[130, 140] == 0x7F and (qb[128:, 128:256].sum() == 0x7F)
    # Rounding of the finite blocks: relative 2^-4 for normal e4m3, 2^-10·scale for subnormal ones.
    d = dequantize_weight_blocks(q, scale)
    ok = torch.ones_like(w, dtype=torch.bool)
    ok[0, 128:] = False
    s_e = scale.repeat_interleave(BLOCK, 1).repeat_interleave(BLOCK, 2)
    assert ((d - w).abs() <= torch.maximum(w.abs() / 16, s_e / 1024))[ok].all()


def test_w13_quantizes_gate_and_up_apart():
    """w13 [E, 2F, H] is 2E projections: gate's blocks, then up's, also when F is not a multiple
    of 128 (no block straddles the two)."""
    E, F, H = 2, 144, 272
    g = torch.Generator().manual_seed(3)
    w13 = torch.randn(E, 2 * F, H, generator=g)
    w13[:, F:] *= 1000.0  # up's scales differ from gate's by about 1000
    w2 = torch.randn(E, H, F, generator=g)
    q13, s13, q2, s2 = quantize_fp8_weights_reference(w13.bfloat16(), w2.bfloat16())
    fb, hb = 2, 3
    assert s13.shape == (E, 2 * fb, hb) and s2.shape == (E, hb, fb) and q13.shape == (E, 2 * F, H)
    for half, rows in ((0, slice(0, F)), (1, slice(F, 2 * F))):
        q, s = quantize_weight_blocks_reference(w13[:, rows].bfloat16())
        assert np.array_equal(bits(q13)[:, rows], bits(q))
        assert torch.equal(s13[:, half * fb:(half + 1) * fb], s)
    assert (s13[:, fb:] > 100 * s13[:, :fb]).all()
    q, s = quantize_weight_blocks_reference(w2.bfloat16())
    assert np.array_equal(bits(q2), bits(q)) and torch.equal(s2, s)
    d13, d2 = dequantize_fp8_weights(q13, s13, q2, s2)
    assert d13.shape == w13.shape and d2.shape == w2.shape
    assert ((d13 - w13.bfloat16().float()).norm() / w13.norm()) < 2 ** -4
