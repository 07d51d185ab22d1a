"""Independent float32/float64 references for attention (decode): gather the pages, apply
the spec's score definition (RoPE, sm_scale, soft cap, ALiBi, sliding window), softmax and
base-2 LSE. Written from ../shared/spec/python-api.md §1.0, not from the kernels."""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch


def alibi_slopes(num_heads: int) -> torch.Tensor:
    n = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]
    slopes += [2.0 ** (-4.0 * (2 * k - 1) / n) for k in range(1, num_heads - n + 1)]
    return torch.tensor(slopes, dtype=torch.float64)


def rope_rotate_half(x: torch.Tensor, pos: torch.Tensor, rope_scale: float, rope_theta: float) -> torch.Tensor:
    """x [..., n, D] rotated at positions pos [n] (non-interleaved, full head_dim)."""
    d = x.shape[-1]
    half = d // 2
    inv_freq = (1.0 / rope_scale) * rope_theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / d)
    inv_freq = inv_freq.to(torch.float32).to(torch.float64)  # the kernels round inv_freq to fp32 once
    ang = (pos.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :]).to(torch.float64)  # fp32 angle
    cos, sin = torch.cos(ang).to(x.device), torch.sin(ang).to(x.device)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def decode_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, sm_scale: float, soft_cap: float = 0.0,
               window_left: int = -1, pos_encoding_mode: str = "NONE", rope_scale: float = 1.0,
               rope_theta: float = 1e4) -> Tuple[torch.Tensor, torch.Tensor]:
    """q [Hq, D], k/v [L, Hkv, D] (any float dtype) -> o [Hq, D] float64, lse [Hq] float64 (base 2)."""
    q = q.double()
    k = k.double()
    v = v.double()
    hq, d = q.shape
    kv_len, hkv, _ = k.shape
    if kv_len == 0:
        return torch.zeros(hq, d, dtype=torch.float64, device=q.device), torch.full(
            (hq,), -math.inf, dtype=torch.float64, device=q.device)
    group = hq // hkv
    if pos_encoding_mode == "ROPE_LLAMA":
        q = rope_rotate_half(q[None], torch.tensor([kv_len - 1]), rope_scale, rope_theta)[0]
        k = rope_rotate_half(k.transpose(0, 1), torch.arange(kv_len), rope_scale, rope_theta).transpose(0, 1)
    kk = k.repeat_interleave(group, dim=1)  # [L, Hq, D]
    vv = v.repeat_interleave(group, dim=1)
    s = torch.einsum("hd,lhd->hl", q, kk) * sm_scale
    if soft_cap > 0:
        s = soft_cap * torch.tanh(s / soft_cap)
    if pos_encoding_mode == "ALIBI":
        s = s + alibi_slopes(hq).to(s.device)[:, None] * torch.arange(kv_len, dtype=torch.float64, device=s.device)[None, :]
    if window_left >= 0:
        j = torch.arange(kv_len, device=s.device)
        s = s.masked_fill((j < kv_len - 1 - window_left)[None, :], -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    o = torch.einsum("hl,lhd->hd", p, vv)
    return o, lse / math.log(2.0)


def gather_pages(cache_k: torch.Tensor, cache_v: torch.Tensor, layout: str, indptr: List[int], indices: List[int],
                 last_page_len: List[int], b: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Keys/values of request b as [L, Hkv, D] from 4-D caches ([P, ps, H, D] NHD / [P, H, ps, D] HND)."""
    pages = indices[indptr[b]:indptr[b + 1]]
    if not pages:
        shape = (0, cache_k.shape[2] if layout == "NHD" else cache_k.shape[1], cache_k.shape[-1])
        return cache_k.new_zeros(shape), cache_v.new_zeros(shape)
    idx = torch.tensor(pages, device=cache_k.device, dtype=torch.long)
    k, v = cache_k[idx], cache_v[idx]
    if layout == "HND":
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [n, ps, H, D]
    k = k.reshape(-1, k.shape[2], k.shape[3])
    v = v.reshape(-1, v.shape[2], v.shape[3])
    page_size = cache_k.shape[1] if layout == "NHD" else cache_k.shape[2]
    length = (len(pages) - 1) * page_size + last_page_len[b]
    return k[:length], v[:length]


def assert_attention_close(out: torch.Tensor, ref: torch.Tensor, name: str = "o", rel_norm: float = 1e-2) -> None:
    """Relative-to-norm error within rel_norm, elementwise within a few output ulps, no NaN."""
    a = out.double()
    assert not torch.isnan(a).any(), f"{name}: NaN in output"
    err = (a - ref).norm() / ref.norm().clamp_min(1e-30)
    assert err <= rel_norm, f"{name}: relative error {err:.3e} > {rel_norm}"
    bound = 2e-2 * ref.abs() + 2e-2 * ref.abs().max().clamp_min(1e-6)
    bad = (a - ref).abs() > bound
    assert not bad.any(), f"{name}: {int(bad.sum())} elements off, worst {((a - ref).abs() - bound).max():.3e}"


def assert_lse_close(lse: torch.Tensor, ref: torch.Tensor, name: str = "lse") -> None:
    a = lse.double()
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(a), inf), f"{name}: -inf pattern differs"
    if (~inf).any():
        err = (a[~inf] - ref[~inf]).abs().max()
        assert err <= 2e-3 * (1 + ref[~inf].abs().max()), f"{name}: max error {err:.3e}"
