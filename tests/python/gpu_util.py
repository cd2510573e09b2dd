"""Helpers of the GPU tests: seeded inputs, poisoned outputs, the error bound and graph capture."""
import torch

# bf16 operands and bf16 intermediates (act, the weighted rows, y) against an FP32 reference on
# the same bf16 inputs: each rounding adds ~2^-9 relative, a handful of them stay well under
# 1e-2, while a wrong row, expert or weight is O(1). Written once, used by every GPU test.
BOUND = 1e-2


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def randn(*shape, seed: int, dtype=torch.bfloat16, std: float = 1.0) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="cuda").normal_(0, std, generator=gen(seed))


def poisoned(*shape, dtype=torch.bfloat16) -> torch.Tensor:
    """An output buffer of NaN (pass it as out=): a row the kernel skips stays NaN and fails every
    comparison, where a fresh torch.empty might hold a stale right answer or zeros."""
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def poison_(buf: torch.Tensor) -> torch.Tensor:
    """Fills a byte buffer (a Workspace) with 0xff: NaN as bf16 and float32, -1 as int32."""
    return buf.fill_(0xFF)


def small_layer(H=1024, F=512, E=16, seed=0) -> dict:
    return dict(w_gate=randn(E, H, seed=seed, std=H ** -0.5), w13=randn(E, 2 * F, H, seed=seed + 1, std=H ** -0.5),
                w2=randn(E, H, F, seed=seed + 2, std=F ** -0.5))


def capture(fn):
    """torch.cuda.graph capture of fn() after a warm-up on a side stream (the documented recipe)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out
