"""python -m moekit.bench — moekit.fused_moe against a torch._grouped_mm pipeline, same run.

  python -m moekit.bench [--presets mixtral-8x7b,qwen3-30b-a3b,deepseek-v3] [--tokens 1,16,256,4096]
                         [--iters 50] [--warmup 10] [--seed 0] [--no-graph] [--json FILE]

The baseline is what a PyTorch user writes today: torch routing (logits, softmax/sigmoid, top-k),
then sort the assignments by expert, gather the rows, grouped GEMM (gate+up), SwiGLU, grouped
GEMM (down), weight and sum each token's k rows in slot order. Both sides are checked against the
FP32 reference (moekit.reference) before anything is timed. Times are medians of CUDA-event
pairs around single calls, the L2 flushed before each (weights are the bytes that matter);
"graph" replays a captured CUDA graph (GPU time alone), "eager" includes each side's Python and
launch overhead. Prints a table; --json writes it with the command, date and GPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from typing import Callable, Optional

from ._requires import missing, require

if __name__ == "__main__" and missing("moekit.bench"):
    # `python -m moekit.bench ...` (--help too) without torch: one line and exit code 2, no traceback.
    print(missing("moekit.bench"), file=sys.stderr)
    sys.exit(2)
require("moekit.bench")  # imported as a module: the same line, as a ModuleNotFoundError
import torch  # noqa: E402

from . import __version__
from . import _moekit as _C
from .presets import PRESETS, Preset
from .reference import experts_reference, rel_norm_error, route_reference, routing_matches
from .torch import fused_experts, fused_moe, route

# bf16 operands and intermediates against an FP32 reference: a few bf16 ulps (2^-8) of relative
# norm error is expected; 1e-2 leaves room for the accumulation order and flags a wrong result.
ERROR_BOUND = 1e-2
CHECK_TOKENS = 128  # the reference loop is slow: check the first tokens (rows are independent)


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
    if p.score_bias:
        w["e_score_correction_bias"] = torch.empty(E, dtype=torch.float32, device=device).normal_(0, 0.02, generator=g)
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


def check(p: Preset, w: dict, x, errors: list) -> Optional[str]:
    """moekit and the torch pipeline against the FP32 reference, on the first tokens."""
    n = min(x.shape[0], CHECK_TOKENS)
    xs = x[:n].contiguous()
    bias = w["e_score_correction_bias"]
    topk_w, topk_ids = route(xs, w["w_gate"], top_k=p.top_k, e_score_correction_bias=bias, **p.routing)
    logits = torch.nn.functional.linear(xs.float(), w["w_gate"].float())
    # rtol 1e-4: the FP32 logits are summed in another order than torch's (see tests/python).
    why = routing_matches(logits, topk_w, topk_ids, p.top_k, e_score_correction_bias=bias, rtol=1e-4, **p.routing)
    if why:
        return f"moekit routing: {why}"
    want = experts_reference(xs, w["w13"], w["w2"], topk_w, topk_ids)
    got = fused_moe(xs, w["w13"], w["w2"], w_gate=w["w_gate"], top_k=p.top_k, e_score_correction_bias=bias,
                    **p.routing)
    errors.append(rel_norm_error(got, want))
    errors.append(rel_norm_error(grouped_mm_experts(xs, w["w13"], w["w2"], topk_w, topk_ids), want))
    if errors[0] > ERROR_BOUND:
        return f"moekit error {errors[0]:.2e} > {ERROR_BOUND}"
    if errors[1] > ERROR_BOUND:
        return f"torch pipeline error {errors[1]:.2e} > {ERROR_BOUND}"
    return None


def bench_preset(p: Preset, tokens: list, timer: Timer, graph: bool, seed: int, device) -> list:
    w = make_weights(p, device, seed)
    bias = w["e_score_correction_bias"]
    rows = []
    for T in tokens:
        x = torch.empty((T, p.hidden), dtype=torch.bfloat16, device=device).normal_(
            0, 1, generator=torch.Generator(device=device).manual_seed(seed + T))
        row = dict(preset=p.name, tokens=T, block_m=_C.plan_forward(T, p.hidden, p.inter, p.experts, p.top_k,
                                                                    device=device.index).block_m)
        errors: list = []
        why = check(p, w, x, errors)
        row.update(err_moekit=errors[0] if errors else None, err_torch=errors[1] if len(errors) > 1 else None)
        if why:
            row["failed"] = why
            rows.append(row)
            print(f"  {p.name} T={T}: CHECK FAILED, not timed: {why}", file=sys.stderr)
            continue
        topk_w, topk_ids = route(x, w["w_gate"], top_k=p.top_k, e_score_correction_bias=bias, **p.routing)
        variants = {
            "moekit": lambda: fused_moe(x, w["w13"], w["w2"], w_gate=w["w_gate"], top_k=p.top_k,
                                        e_score_correction_bias=bias, **p.routing),
            "torch": lambda: grouped_mm_experts(x, w["w13"], w["w2"], *torch_route(x, w["w_gate"], bias, p)),
            "moekit_experts": lambda: fused_experts(x, w["w13"], w["w2"], topk_w, topk_ids),
            "torch_experts": lambda: grouped_mm_experts(x, w["w13"], w["w2"], topk_w, topk_ids),
        }
        for name, fn in variants.items():
            for mode in (("graph", "eager") if graph else ("eager",)):
                try:
                    row[f"{name}_{mode}_ms"] = timer(fn, mode == "graph")
                except Exception as e:  # a baseline that cannot run here is reported, not fatal
                    row[f"{name}_{mode}_ms"] = None
                    row.setdefault("notes", []).append(f"{name} {mode}: {type(e).__name__}: {e}"[:300])
        touched = int(torch.unique(topk_ids).numel())
        counts = torch.bincount(topk_ids.reshape(-1).long(), minlength=p.experts).float()
        best = row.get("moekit_graph_ms") or row.get("moekit_eager_ms")
        row.update(experts_touched=touched, weight_bytes=touched * p.expert_bytes(), flops=p.flops(T),
                   tokens_per_expert_max=float(counts.max()), tokens_per_expert_mean=float(counts.mean()))
        if best:
            row["moekit_TBps"] = row["weight_bytes"] / (best * 1e-3) / 1e12
            row["moekit_TFLOPps"] = row["flops"] / (best * 1e-3) / 1e12
        rows.append(row)
        print_row(row, graph)
    return rows


def _ms(v) -> str:
    return "     -" if v is None else f"{v:6.3f}" if v < 100 else f"{v:6.1f}"


def _x(a, b) -> str:
    return "    -" if not a or not b else f"{b / a:5.2f}"


HEADER = (f"{'preset':<14} {'T':>5} {'bm':>3} | {'moekit':>6} {'torch':>6} {'x':>5} | {'moekit':>6} {'torch':>6} "
          f"{'x':>5} | {'TB/s':>5} {'TFLOP/s':>7} | {'err':>7}")


def print_row(r: dict, graph: bool):
    mode = "graph" if graph else "eager"
    mk, tc = r.get(f"moekit_{mode}_ms"), r.get(f"torch_{mode}_ms")
    mke, tce = r.get(f"moekit_experts_{mode}_ms"), r.get(f"torch_experts_{mode}_ms")
    tb = r.get("moekit_TBps")
    print(f"{r['preset']:<14} {r['tokens']:>5} {r['block_m']:>3} | {_ms(mk)} {_ms(tc)} {_x(mk, tc)} | {_ms(mke)} "
          f"{_ms(tce)} {_x(mke, tce)} | {tb or 0:5.2f} {r.get('moekit_TFLOPps') or 0:7.1f} | "
          f"{r['err_moekit'] or 0:7.1e}", flush=True)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moekit.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default=",".join(PRESETS), help="comma-separated: " + ", ".join(PRESETS))
    ap.add_argument("--tokens", default="1,16,256,4096", help="comma-separated token counts T")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-graph", action="store_true", help="time eager calls only")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    args = ap.parse_args(argv)
    try:
        tokens = [int(t) for t in args.tokens.split(",") if t]
    except ValueError:
        ap.error(f"--tokens: expected comma-separated integers, got {args.tokens!r}")
    names = [n for n in args.presets.split(",") if n]
    for n in names:
        if n not in PRESETS:
            ap.error(f"--presets: unknown preset {n!r}; expected one of {', '.join(PRESETS)}")
    if not torch.cuda.is_available() or _C.device_count() == 0:
        print("moekit.bench: no CUDA GPU: the benchmark needs an NVIDIA Hopper GPU (sm_90a)", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    info = _C.query_device(device.index)
    graph = not args.no_graph
    print(f"moekit {__version__} vs torch {torch.__version__} on {info.name} ({info.sm_count} SMs); times in ms, "
          f"median of {args.iters}, {'CUDA-graph replay' if graph else 'eager'}, L2 flushed; "
          f"left: whole layer (routing included), right: experts given the routing; x = torch / moekit")
    print(HEADER)
    timer = Timer(device, args.warmup, args.iters)
    rows = []
    for n in names:
        rows += bench_preset(PRESETS[n], tokens, timer, graph, args.seed, device)
        torch.cuda.empty_cache()  # the preset's weights are gone: give their memory back
    failed = [r for r in rows if "failed" in r]
    if args.json:
        doc = dict(command="python -m moekit.bench " + " ".join(sys.argv[1:] if argv is None else argv),
                   date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   gpu=info.name, sm_count=info.sm_count, torch=torch.__version__, cuda=torch.version.cuda,
                   moekit=__version__, iters=args.iters, warmup=args.warmup, graph=graph, l2_flush=True,
                   error_bound=ERROR_BOUND, results=rows)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    if failed:
        print(f"moekit.bench: {len(failed)} case(s) failed their check (not timed)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
