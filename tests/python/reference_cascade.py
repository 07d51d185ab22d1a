"""Independent float64 references for the state-merge kernels (flashinfer.cascade).

A state (v, s) over a key set: v the softmax-weighted values, s = log2(sum_j exp(logit_j)),
the base-2 LSE. Definitions (spec §2):

  merge_state(a, b): m = max(s_a, s_b); w_a = 2^(s_a - m); w_b = 2^(s_b - m)
                     v = (w_a v_a + w_b v_b) / (w_a + w_b);  s = m + log2(w_a + w_b)
  merge_states(v[:, k], s[:, k] for k < K): the same with m = max_k s_k, w_k = 2^(s_k - m)
  empty states (s = -inf) have zero weight; if every state is empty: v = 0, s = -inf.
  attention_state(q, K, V, scale): logits l_j = scale * q.k_j; v = softmax(l) V;
                     s = logsumexp(l) / ln 2 (the state a kernel's partial attention returns)

Every function computes in float64 on the inputs' device from these formulas (no flashinfer
code) and returns float64 tensors.
"""

from __future__ import annotations

import math
from typing import Tuple

import torch

__all__ = ["merge_state", "merge_states", "attention_state"]

LN2 = math.log(2.0)


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float64)


def merge_states(v: torch.Tensor, s: torch.Tensor, chunk_rows: int = 64) -> Tuple[torch.Tensor, torch.Tensor]:
    """v [seq, K, H, D], s [seq, K, H] -> (v [seq, H, D], s [seq, H]); rows in chunks to bound
    the float64 temporaries (100 states x 32 heads x 128 dims is 3 MiB per row)."""
    seq, k, h, d = v.shape
    out_v = torch.empty(seq, h, d, dtype=torch.float64, device=v.device)
    out_s = torch.empty(seq, h, dtype=torch.float64, device=v.device)
    for r0 in range(0, seq, chunk_rows):
        r1 = min(seq, r0 + chunk_rows)
        vv, ss = _f64(v[r0:r1]), _f64(s[r0:r1])  # [n, K, H, D], [n, K, H]
        if k == 0:
            out_v[r0:r1] = 0.0
            out_s[r0:r1] = -math.inf
            continue
        m = ss.amax(dim=1)  # [n, H]
        empty = torch.isneginf(m)
        m_safe = torch.where(empty, torch.zeros_like(m), m)
        w = torch.exp2(ss - m_safe[:, None, :])  # exp2(-inf) = 0 for empty states
        den = w.sum(dim=1)  # [n, H]
        num = (w[..., None] * vv).sum(dim=1)  # [n, H, D]
        den_safe = torch.where(empty, torch.ones_like(den), den)
        out_v[r0:r1] = torch.where(empty[..., None], torch.zeros_like(num), num / den_safe[..., None])
        out_s[r0:r1] = torch.where(empty, torch.full_like(m, -math.inf), m_safe + torch.log2(den_safe))
    return out_v, out_s


def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor,
                s_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """v_* [seq, H, D], s_* [seq, H] -> the merged state, float64."""
    return merge_states(torch.stack([_f64(v_a), _f64(v_b)], dim=1), torch.stack([_f64(s_a), _f64(s_b)], dim=1))


def attention_state(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """q [H, D], k [n, H, D], v [n, H, D] -> (o [H, D], lse2 [H]) of one query row over n keys;
    n = 0 gives the empty state (0, -inf)."""
    h, d = q.shape
    if k.shape[0] == 0:
        return (torch.zeros(h, d, dtype=torch.float64, device=q.device),
                torch.full((h,), -math.inf, dtype=torch.float64, device=q.device))
    logits = torch.einsum("hd,nhd->hn", _f64(q), _f64(k)) * scale  # [H, n]
    lse = torch.logsumexp(logits, dim=1)  # natural log
    p = torch.exp(logits - lse[:, None])
    o = torch.einsum("hn,nhd->hd", p, _f64(v))
    return o, lse / LN2
