"""python -m moekit.bench — moekit.fused_moe against a torch._grouped_mm pipeline, same run.

  python -m moekit.bench [--presets mixtral-8x7b,qwen3-30b-a3b,deepseek-v3] [--tokens 1,16,256,4096]
                         [--iters 50] [--warmup 10] [--seed 0] [--no-graph] [--backward] [--json FILE]

--backward times a training step (forward + backward, the gradients of x and the weights) against
the same step through the torch pipeline's autograd instead: moekit/bench_train.py.

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
import sys
from typing import Optional

from ._requires import missing, require

if __name__ == "__main__" and missing("moekit.bench"):
    # `python -m moekit.bench ...` (--help too) without torch: one line and exit code 2, no traceback.
    print(missing("moekit.bench"), file=sys.stderr)
    sys.exit(2)
require("moekit.bench")  # imported as a module: the same line, as a ModuleNotFoundError
import torch  # noqa: E402

from . import __version__
from . import _moekit as _C
from ._baseline import Timer, grouped_mm_experts, make_weights, row_cells, torch_route  # noqa: F401 (re-exported)
from .presets import LAYERS, MODELS, PRESETS, Preset
from .reference import experts_reference, rel_norm_error, routing_matches
from .torch import fused_experts, fused_moe, route
from .bench_train import GRAD_BOUND, TRAIN_HEADER, bench_train_preset

# bf16 operands and intermediates against an FP32 reference: a few bf16 ulps (2^-8) of relative
# norm error is expected; 1e-2 leaves room for the accumulation order and flags a wrong result.
ERROR_BOUND = 1e-2
CHECK_TOKENS = 128  # the reference loop is slow: check the first tokens (rows are independent)


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
        timer.each(variants, graph, row)
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


HEADER = (f"{'preset':<14} {'T':>5} {'bm':>3} | {'moekit':>6} {'torch':>6} {'x':>5} | {'moekit':>6} {'torch':>6} "
          f"{'x':>5} | {'TB/s':>5} {'TFLOP/s':>7} | {'err':>7}")


def print_row(r: dict, graph: bool):
    tb = r.get("moekit_TBps")
    print(f"{row_cells(r, graph)} | {tb or 0:5.2f} {r.get('moekit_TFLOPps') or 0:7.1f} | {r['err_moekit'] or 0:7.1e}",
          flush=True)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moekit.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default=",".join(PRESETS),
                    help="comma-separated: " + ", ".join(PRESETS) + "; or models beyond them: " + ", ".join(MODELS))
    ap.add_argument("--tokens", default="1,16,256,4096", help="comma-separated token counts T")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-graph", action="store_true", help="time eager calls only")
    ap.add_argument("--backward", action="store_true",
                    help="time a training step (forward + backward) against torch._grouped_mm autograd instead")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON")
    args = ap.parse_args(argv)
    try:
        tokens = [int(t) for t in args.tokens.split(",") if t]
    except ValueError:
        ap.error(f"--tokens: expected comma-separated integers, got {args.tokens!r}")
    names = [n for n in args.presets.split(",") if n]
    for n in names:
        if n not in LAYERS:
            ap.error(f"--presets: unknown preset {n!r}; expected one of {', '.join(LAYERS)}")
    if not torch.cuda.is_available() or _C.device_count() == 0:
        print("moekit.bench: no CUDA GPU: the benchmark needs an NVIDIA Hopper GPU (sm_90a)", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    info = _C.query_device(device.index)
    graph = not args.no_graph
    bench_fn, header, what, bound = bench_preset, HEADER, "", ERROR_BOUND
    if args.backward:
        bench_fn, header, what, bound = bench_train_preset, TRAIN_HEADER, "training steps (forward + backward), ", GRAD_BOUND
    print(f"moekit {__version__} vs torch {torch.__version__} on {info.name} ({info.sm_count} SMs); {what}times in "
          f"ms, median of {args.iters}, {'CUDA-graph replay' if graph else 'eager'}, L2 flushed; "
          f"left: whole layer (routing included), right: experts given the routing; x = torch / moekit")
    print(header)
    timer = Timer(device, args.warmup, args.iters)
    rows = []
    for n in names:
        rows += bench_fn(LAYERS[n], tokens, timer, graph, args.seed, device)
        torch.cuda.empty_cache()  # the preset's weights are gone: give their memory back
    failed = [r for r in rows if "failed" in r]
    if args.json:
        doc = dict(command="python -m moekit.bench " + " ".join(sys.argv[1:] if argv is None else argv),
                   date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   gpu=info.name, sm_count=info.sm_count, torch=torch.__version__, cuda=torch.version.cuda,
                   moekit=__version__, iters=args.iters, warmup=args.warmup, graph=graph, l2_flush=True,
                   mode="train-step" if args.backward else "forward", error_bound=bound, results=rows)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    if failed:
        print(f"moekit.bench: {len(failed)} case(s) failed their check (not timed)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
