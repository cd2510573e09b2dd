"""moekit._baseline — what the benchmarks share (python -m moekit.bench, its --backward steps in
moekit.bench_train): the presets' random weights, the torch pipeline a PyTorch user writes today
(torch routing, torch._grouped_mm experts), and the L2-flushed CUDA-event timer."""
from __future__ import annotations

import statistics
from typing import Callable

from ._requires import require

require("moekit.bench")
import torch  # noqa: E402

from . import _moekit as _C  # noqa: E402
from .presets import Preset  # noqa: E402
from .reference import route_reference  # noqa: E402

__all__ = ["make_weights", "torch_route", "grouped_mm_experts", "Timer", "fmt_ms", "fmt_x", "row_cells"]


def make_weights(p: Preset, device, seed: int = 0) -> dict:
    """Random bf16 weights of a preset, scaled so activations stay O(1) (as trained weights do)."""
    g = torch.Generator(device=device).manual_seed(seed)
    H, F, E = p.hidden, p.inter, p.experts
    w = dict(
        w_gate=torch.empty((E, H), dtype=torch.bfloat16, device=device).normal_(0, H ** -0.5, generator=g),
        w13=torch.empty((E, 2 * F, H), dtype=torch.bfloat16, device=device).normal_(0, H ** -0.5, generator=g),
        w2=torch.empty((E, H, F), dtype=torch.bfloat16, device=device).normal_(0, F ** -0.5, generator=g),
        e_score_correction_bias=None,
    )
    if p.score_bias:  # std 0.01, as the C++ bench's (tools/moekit/layer.hpp says why: balanced loads)
        w["e_score_correction_bias"] = torch.empty(E, dtype=torch.float32, device=device).normal_(0, 0.01, generator=g)
    return w


def torch_route(x, w_gate, bias, p: Preset):
    """Torch routing as models write it: bf16 logits GEMM, then FP32 scoring and top-k."""
    logits = torch.nn.functional.linear(x, w_gate).float()
    return route_reference(logits, p.top_k, e_score_correction_bias=bias, **p.routing)


def grouped_mm_experts(x, w13, w2, topk_weights, topk_ids):
    """The experts in torch: sort, gather, grouped GEMM, SwiGLU, grouped GEMM, weighted sum."""
    T, H = x.shape
    E, F2, _ = w13.shape
    F, k = F2 // 2, topk_ids.shape[1]
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # assignments a = t·k + j in expert order
    counts = torch.zeros(E, dtype=torch.int32, device=x.device).scatter_add_(0, flat.long(), torch.ones_like(flat))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)  # group ends on the device: no host sync
    xs = x.index_select(0, order // k)
    h = torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs)  # [T·k, 2F]
    act = torch.nn.functional.silu(h[:, :F]) * h[:, F:]
    out = torch._grouped_mm(act, w2.transpose(1, 2), offs=offs)  # [T·k, H]
    out = out.float() * topk_weights.reshape(-1)[order].unsqueeze(1)
    rows = torch.empty_like(out).index_copy_(0, order, out)  # back to assignment order
    return rows.view(T, k, H).sum(dim=1).to(x.dtype)


class Timer:
    """Median CUDA-event time of single calls, the L2 flushed before each call."""

    def __init__(self, device, warmup: int, iters: int):
        self.warmup, self.iters = warmup, iters
        l2 = _C.query_device(device.index).l2_bytes
        self.flush = torch.empty(max(2 * l2, 1 << 20), dtype=torch.uint8, device=device)

    def __call__(self, fn: Callable[[], object], graph: bool) -> float:
        run = fn
        if graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up outside the capture (allocator, lazy init)
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            run = g.replay
        for _ in range(self.warmup):
            run()
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(self.iters)]
        for start, end in pairs:
            self.flush.zero_()
            start.record()
            run()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in pairs)

    def each(self, variants: dict, graph: bool, row: dict, release: bool = False) -> None:
        """row[<name>_<graph|eager>_ms] for each variant; one that cannot run here gets None and a
        note, not an exception. release: empty the allocator's cache after each (a captured
        training step's pool holds its gradients)."""
        for name, fn in variants.items():
            for mode in (("graph", "eager") if graph else ("eager",)):
                try:
                    row[f"{name}_{mode}_ms"] = self(fn, mode == "graph")
                except Exception as e:  # a baseline that cannot run here is reported, not fatal
                    row[f"{name}_{mode}_ms"] = None
                    row.setdefault("notes", []).append(f"{name} {mode}: {type(e).__name__}: {e}"[:300])
                if release:
                    torch.cuda.empty_cache()


def fmt_ms(v) -> str:
    """A time in ms for the tables, 6 wide ("-": not measured)."""
    return "     -" if v is None else f"{v:6.3f}" if v < 100 else f"{v:6.1f}"


def fmt_x(a, b) -> str:
    """b / a for the tables, 5 wide ("-": either missing)."""
    return "    -" if not a or not b else f"{b / a:5.2f}"


def row_cells(r: dict, graph: bool) -> str:
    """A table row's start: preset, T, block_m, then moekit / torch / x for the layer and the experts."""
    mode = "graph" if graph else "eager"
    mk, tc = r.get(f"moekit_{mode}_ms"), r.get(f"torch_{mode}_ms")
    mke, tce = r.get(f"moekit_experts_{mode}_ms"), r.get(f"torch_experts_{mode}_ms")
    return (f"{r['preset']:<14} {r['tokens']:>5} {r['block_m']:>3} | {fmt_ms(mk)} {fmt_ms(tc)} {fmt_x(mk, tc)} | "
            f"{fmt_ms(mke)} {fmt_ms(tce)} {fmt_x(mke, tce)}")
