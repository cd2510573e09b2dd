"""moekit.reference — the layer in plain PyTorch FP32: the oracle of the Python tests and the
check the benchmark runs before it times anything.

The FFN is docs/design.md's naive loop, `for e: y[idx_e] += w_e · (silu(x·W_gateᵀ) ⊙ (x·W_upᵀ))·W2ᵀ`,
in FP32 with TF32 off; routing follows the same contract as moekit's router (softmax or sigmoid
in FP32, optional score-correction bias and grouped top-k, renormalize, scaling). Ties between
equal scores are left to torch.topk here: compare routings as sets of equal scores (see
`routing_matches`), not id by id. Both are differentiable (autograd in FP32: the oracle of the
backward's tests), with routing_weights_reference for the weights of a given selection.
"""
from __future__ import annotations

from typing import Optional

from ._requires import require

require("moekit.reference")

import torch
from torch import Tensor

__all__ = ["route_reference", "routing_weights_reference", "experts_reference", "rel_norm_error", "routing_matches"]


def _scores(logits: Tensor, scoring_func: str, bias: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    logits = logits.float()
    scores = torch.softmax(logits, dim=-1) if scoring_func == "softmax" else torch.sigmoid(logits)
    choice = scores if bias is None else scores + bias.float()
    return scores, choice


def route_reference(logits: Tensor, top_k: int, renormalize: bool = False, scoring_func: str = "softmax",
                    num_expert_group: Optional[int] = None, topk_group: Optional[int] = None,
                    e_score_correction_bias: Optional[Tensor] = None,
                    routed_scaling_factor: float = 1.0) -> tuple[Tensor, Tensor]:
    """(topk_weights [T, k] float32, topk_ids [T, k] int32) from logits [T, E]."""
    scores, choice = _scores(logits, scoring_func, e_score_correction_bias)
    T, E = choice.shape
    if num_expert_group:
        G = num_expert_group
        grouped = choice.view(T, G, E // G)
        # DeepSeek-V3: a group scores the sum of its top two (biased) scores; without a bias, its best.
        if e_score_correction_bias is not None and E // G >= 2:
            group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)
        else:
            group_score = grouped.max(dim=-1).values
        keep = torch.zeros_like(group_score, dtype=torch.bool)
        keep.scatter_(1, group_score.topk(topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(E // G, dim=1), float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * routed_scaling_factor, ids.to(torch.int32)


def routing_weights_reference(logits: Tensor, topk_ids: Tensor, renormalize: bool = False,
                              scoring_func: str = "softmax", routed_scaling_factor: float = 1.0) -> Tensor:
    """topk_weights [T, k] float32 of the experts `topk_ids` chose, from logits [T, E], differentiable
    in the logits: the backward's view of the router, whose selection (top-k, groups, the score bias)
    is a constant and whose gradient flows only through the chosen experts' scores."""
    scores, _ = _scores(logits, scoring_func, None)
    weights = scores.gather(1, topk_ids.long())
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * routed_scaling_factor


def routing_matches(logits: Tensor, topk_weights: Tensor, topk_ids: Tensor, top_k: int, renormalize: bool = False,
                    scoring_func: str = "softmax", num_expert_group: Optional[int] = None,
                    topk_group: Optional[int] = None, e_score_correction_bias: Optional[Tensor] = None,
                    routed_scaling_factor: float = 1.0, atol: float = 1e-5, rtol: float = 1e-5) -> Optional[str]:
    """Checks a routing against the reference; returns None if it matches, else what differs.

    The chosen experts must be *a* top-k under the reference scores: their selection scores,
    sorted, equal the reference's top-k selection scores within atol (so ties and near-ties may
    pick either expert, no other difference is allowed). The weights must equal the reference's
    weights of the chosen experts within rtol.
    """
    ref_w, ref_ids = route_reference(logits, top_k, renormalize, scoring_func, num_expert_group, topk_group,
                                     e_score_correction_bias, routed_scaling_factor)
    scores, choice = _scores(logits, scoring_func, e_score_correction_bias)
    ids = topk_ids.long()
    got_choice = choice.gather(1, ids).sort(dim=-1, descending=True).values
    want_choice = choice.gather(1, ref_ids.long()).sort(dim=-1, descending=True).values
    bad = ((got_choice - want_choice).abs() > atol).any(dim=-1)
    if bad.any():
        t = int(bad.nonzero()[0, 0])
        return (f"{int(bad.sum())} token(s) chose experts that are not a top-{top_k}; first: token {t} chose "
                f"{topk_ids[t].tolist()}, reference {ref_ids[t].tolist()}")
    if (ids.sort(dim=-1).values[:, :-1] == ids.sort(dim=-1).values[:, 1:]).any():
        return "a token chose the same expert twice"
    want_w = scores.gather(1, ids)
    if renormalize:
        want_w = want_w / want_w.sum(dim=-1, keepdim=True)
    want_w = want_w * routed_scaling_factor
    if not torch.allclose(topk_weights.float(), want_w, rtol=rtol, atol=1e-7):
        err = ((topk_weights.float() - want_w).abs() / want_w.abs().clamp_min(1e-30)).max()
        return f"topk_weights differ from the reference's by up to {float(err):.3g} (relative)"
    return None


def experts_reference(x: Tensor, w13: Tensor, w2: Tensor, topk_weights: Tensor, topk_ids: Tensor) -> Tensor:
    """y [T, H] float32 = Σ_j topk_weights[t, j] · FFN_{topk_ids[t, j]}(x[t]), the naive loop in FP32.
    Ids outside [0, E) are skipped (as moekit's kernels do). Syncs the host: a reference only."""
    T, H = x.shape
    E, F2, _ = w13.shape
    F = F2 // 2
    xf = x.float()
    y = torch.zeros((T, H), dtype=torch.float32, device=x.device)
    ids = topk_ids.long()
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # a true FP32 reference
    try:
        for e in torch.unique(ids).tolist():
            if not 0 <= e < E:
                continue
            tok, slot = (ids == e).nonzero(as_tuple=True)
            w13e = w13[e].float()
            xe = xf[tok]
            act = torch.nn.functional.silu(xe @ w13e[:F].t()) * (xe @ w13e[F:].t())
            out = act @ w2[e].float().t()
            y.index_add_(0, tok, out * topk_weights[tok, slot].float().unsqueeze(1))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    return y


def rel_norm_error(got: Tensor, want: Tensor) -> float:
    """‖got − want‖ / ‖want‖ in float64 (want is the reference)."""
    got, want = got.double(), want.double()
    den = want.norm()
    return float((got - want).norm() / den) if den > 0 else float((got - want).norm())
