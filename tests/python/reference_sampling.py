"""Independent float64 references for flashinfer.sampling: the filtered sets and distributions by
their definitions (sorting is fine here), computed row by row on any device.

Definitions for one row p (non-negative; Z = sum of the positive entries, M = max):
  top-k set   {i : p_i > 0, #{j : p_j > p_i} < k}            (k <= 0 or k >= #positive: all positive)
  top-p set   {i : p_i > 0, sum_{p_j > p_i} p_j < top_p * Z}  (top_p >= 1: all positive)
  min-p set   {i : p_i > 0, p_i >= min_p * M}                 (min_p <= 0: all positive)
  every set also holds the maximum (so it is never empty)
  joint       top-k set & top-p set of p
  top_k_first top-p set of renorm(p restricted to its top-k set)
  renorm(p, S) = p * [i in S] / sum_{S} p
``margin`` classifies top-p membership with a relative tolerance: True/False/None (too close to
the boundary to insist on either; fp32 sums may round it either way).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

__all__ = [
    "top_k_mask",
    "top_p_mask",
    "min_p_mask",
    "joint_mask",
    "top_k_first_mask",
    "renorm",
    "filtered_dist",
    "chi_square",
    "chi_square_bound",
    "top_k_mask_logits",
    "counts_of",
]


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float64)


def _per_row(value, rows: int, like: torch.Tensor):
    if isinstance(value, torch.Tensor):
        return [v for v in value.detach().cpu().tolist()]
    return [value] * rows


def top_k_mask(p: torch.Tensor, k) -> torch.Tensor:
    """bool [R, V]: the top-k set of each row (ties at the k-th value all in)."""
    p = _f64(p)
    pos = p > 0
    out = torch.zeros_like(pos)
    for r, kr in enumerate(_per_row(k, p.shape[0], p)):
        kr = int(kr)
        n_pos = int(pos[r].sum())
        if kr <= 0 or kr >= n_pos:
            out[r] = pos[r]
            continue
        kth = torch.topk(p[r], kr).values[-1]
        out[r] = pos[r] & (p[r] >= kth)
    return out


def _mass_above(row: torch.Tensor) -> torch.Tensor:
    """For each entry, the sum of the entries strictly greater (positives only)."""
    vals = torch.where(row > 0, row, torch.zeros_like(row))
    desc, _ = torch.sort(vals, descending=True)
    prefix = torch.cat([torch.zeros(1, dtype=row.dtype, device=row.device), torch.cumsum(desc, 0)])
    # number of entries strictly greater than each value: searchsorted on the ascending negation
    n_greater = torch.searchsorted(-desc, -vals, right=False)
    return prefix[n_greater]


def top_p_mask(p: torch.Tensor, top_p, margin: float = 0.0, mass: Optional[torch.Tensor] = None):
    """The top-p set. With margin > 0, returns (surely_in, surely_out) masks instead."""
    p = _f64(p)
    pos = p > 0
    rows = p.shape[0]
    sure_in = torch.zeros_like(pos)
    sure_out = torch.zeros_like(pos)
    for r, tp in enumerate(_per_row(top_p, rows, p)):
        tp = float(tp)
        z = float(p[r][pos[r]].sum()) if mass is None else float(mass[r])
        if tp >= 1.0:
            sure_in[r] = pos[r]
            sure_out[r] = ~pos[r]
            continue
        above = _mass_above(p[r])
        is_max = p[r] == p[r].max()
        sure_in[r] = pos[r] & ((above < tp * z * (1 - margin)) | is_max)
        sure_out[r] = ~pos[r] | ((above >= tp * z * (1 + margin)) & ~is_max)
    if margin == 0.0:
        return sure_in
    return sure_in, sure_out


def min_p_mask(p: torch.Tensor, min_p) -> torch.Tensor:
    p = _f64(p)
    pos = p > 0
    out = torch.zeros_like(pos)
    for r, mp in enumerate(_per_row(min_p, p.shape[0], p)):
        mp = float(mp)
        mx = p[r].max()
        out[r] = pos[r] & ((p[r] >= mp * mx) | (p[r] == mx)) if mp > 0 else pos[r]
    return out


def joint_mask(p: torch.Tensor, k, top_p) -> torch.Tensor:
    return top_k_mask(p, k) & top_p_mask(p, top_p)


def top_k_first_mask(p: torch.Tensor, k, top_p) -> torch.Tensor:
    mk = top_k_mask(p, k)
    return mk & top_p_mask(torch.where(mk, _f64(p), torch.zeros_like(_f64(p))), top_p)


def renorm(p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    q = torch.where(mask, _f64(p), torch.zeros_like(_f64(p)))
    return q / q.sum(-1, keepdim=True)


def filtered_dist(p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return renorm(p, mask)


def top_k_mask_logits(logits: torch.Tensor, k) -> torch.Tensor:
    """float64 logits with everything below the k-th largest finite-or-inf value set to -inf."""
    x = _f64(logits)
    out = torch.full_like(x, -math.inf)
    for r, kr in enumerate(_per_row(k, x.shape[0], x)):
        kr = int(kr)
        real = ~torch.isnan(x[r]) & (x[r] > -math.inf)
        n = int(real.sum())
        if kr <= 0 or kr >= x.shape[1]:
            out[r] = x[r]
            continue
        if kr >= n:
            out[r] = torch.where(real, x[r], out[r])
            continue
        kth = torch.topk(torch.where(real, x[r], torch.full_like(x[r], -math.inf)), kr).values[-1]
        out[r] = torch.where(real & (x[r] >= kth), x[r], out[r])
    return out


def chi_square(counts: torch.Tensor, dist: torch.Tensor, min_expected: float = 5.0) -> tuple:
    """(statistic, degrees of freedom, draws on zero-probability categories) of counts [V]
    against dist [V]; categories expecting fewer than ``min_expected`` draws are pooled into one."""
    counts = counts.to(torch.float64).cpu()
    dist = dist.to(torch.float64).cpu()
    n = float(counts.sum())
    expected = dist * n
    live = expected > 0
    big = expected >= min_expected
    small = live & ~big
    obs = torch.cat([counts[big], counts[small].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[small].sum().reshape(1)])
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    return stat, int(keep.sum()) - 1, int(counts[~live].sum())


def chi_square_bound(df: int, sigmas: float = 6.0) -> float:
    """df + sigmas * sqrt(2 df): a chi-square statistic this large has probability well under
    1e-6 for df >= 1 (its mean is df and its standard deviation sqrt(2 df))."""
    df = max(df, 1)
    return df + sigmas * math.sqrt(2 * df) + 10.0


def counts_of(samples: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(samples.to(torch.int64).flatten(), minlength=vocab)
