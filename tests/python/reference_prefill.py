"""Independent float64 reference for single-request prefill attention, written from
../shared/spec/python-api.md §1.0 (not from the kernels): materialize the [H, qo_len, kv_len]
logits, apply RoPE, sm_scale, soft cap, ALiBi and the masks as the score definition states,
softmax, base-2 LSE; rows with no key give o = 0 and lse = -inf. Plus the comparisons.

Tolerances (assert_prefill_close). Each (row, head) of o must be within 1e-2 of that row's
largest |ref| (plus 1e-5 absolute): the 16-bit output and the 16-bit probabilities that feed
the PV product put a correct kernel within ~0.4% (bf16) of it, while a wrong row, a key
counted twice or dropped in a short row, or a window / causal boundary off by one moves a row
by far more. Checking per row, not against the tensor's max, matters: a causal row with one
key is ~30x larger than a row that averages a thousand. Rows with no key must be exactly 0.
LSE: |lse - ref| <= 1e-3 * (1 + |ref|) elementwise, the same -inf pattern.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from reference_attention import alibi_slopes, rope_rotate_half

__all__ = ["prefill_ref", "prefill_scalar_ref", "assert_prefill_close", "assert_prefill_lse_close", "alibi_slopes"]


def prefill_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                sm_scale: Optional[float] = None, window_left: int = -1, soft_cap: float = 0.0, alibi: bool = False,
                mask: Optional[torch.Tensor] = None, rope: bool = False, rope_scale: float = 1.0,
                rope_theta: float = 1e4, rope_dtype: Optional[torch.dtype] = None,
                v_scale: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """q [qo_len, Hq, Dqk], k [kv_len, Hkv, Dqk], v [kv_len, Hkv, Dvo] (NHD views, any float dtype
    and device) -> (o [qo_len, Hq, Dvo], lse [qo_len, Hq]) float64, lse base 2.

    ``mask`` bool [qo_len, kv_len] replaces causal (the window still applies). ``rope``: q row i
    rotated at position i + kv_len - qo_len, key j at j (rotate-half over the whole head_dim);
    ``rope_dtype`` rounds the rotated q and k to that dtype, as kernels that rotate 16-bit tiles
    in place do. ``sm_scale`` default 1/sqrt(Dqk) (fold k_scale into it); ``v_scale`` scales o.
    """
    qo_len, hq, dqk = q.shape
    kv_len, hkv, _ = k.shape
    dev = q.device
    q64, k64, v64 = q.double(), k.double(), v.double()
    if rope:
        q64 = rope_rotate_half(q64.transpose(0, 1), torch.arange(qo_len) + (kv_len - qo_len), rope_scale,
                               rope_theta).transpose(0, 1)
        k64 = rope_rotate_half(k64.transpose(0, 1), torch.arange(kv_len), rope_scale, rope_theta).transpose(0, 1)
        if rope_dtype is not None:
            q64, k64 = q64.to(rope_dtype).double(), k64.to(rope_dtype).double()
    group = hq // hkv
    kk = k64.repeat_interleave(group, dim=1)  # [kv_len, Hq, Dqk]: q head h reads kv head h // group
    vv = v64.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(dqk) if sm_scale is None else sm_scale
    s = scale * torch.einsum("ihd,jhd->hij", q64, kk)  # [Hq, qo_len, kv_len]
    if soft_cap > 0:
        s = soft_cap * torch.tanh(s / soft_cap)
    i = torch.arange(qo_len, device=dev)[:, None]
    j = torch.arange(kv_len, device=dev)[None, :]
    if alibi:
        s = s + alibi_slopes(hq).to(dev)[:, None, None] * (j - i).double()[None]
    delta = kv_len - qo_len
    keep = torch.ones(qo_len, kv_len, dtype=torch.bool, device=dev)
    if mask is not None:
        keep &= mask.to(device=dev, dtype=torch.bool).reshape(qo_len, kv_len)
    elif causal:
        keep &= j <= i + delta
    if window_left >= 0:
        keep &= j >= i + delta - window_left
    s = s.masked_fill(~keep[None], -math.inf)
    lse_e = torch.logsumexp(s, dim=-1)  # [Hq, qo_len]; -inf for a row with no key
    empty = torch.isinf(lse_e) & (lse_e < 0)
    p = torch.exp(s - lse_e[..., None]).masked_fill(empty[..., None], 0.0)
    o = torch.einsum("hij,jhd->ihd", p, vv) * v_scale
    return o, (lse_e / math.log(2.0)).transpose(0, 1)


def prefill_scalar_ref(q, k, v, *, causal=False, sm_scale=None, window_left=-1, soft_cap=0.0, alibi=False,
                       mask=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The score definition evaluated one (head, row, key) at a time in Python floats: a second,
    loop-based reading of the spec that checks prefill_ref on tiny shapes (CPU)."""
    qo_len, hq, dqk = q.shape
    kv_len, hkv, dvo = v.shape
    group = hq // hkv
    scale = 1.0 / math.sqrt(dqk) if sm_scale is None else sm_scale
    n = 2 ** int(math.floor(math.log2(hq)))
    slopes = [2.0 ** (-8.0 * m / n) for m in range(1, n + 1)] + [2.0 ** (-4.0 * (2 * m - 1) / n)
                                                                 for m in range(1, hq - n + 1)]
    o = torch.zeros(qo_len, hq, dvo, dtype=torch.float64)
    lse = torch.full((qo_len, hq), -math.inf, dtype=torch.float64)
    for h in range(hq):
        kh = h // group
        for i in range(qo_len):
            scores = []
            for j in range(kv_len):
                if mask is not None:
                    if not bool(mask[i, j]):
                        continue
                elif causal and j > i + kv_len - qo_len:
                    continue
                if window_left >= 0 and j < i + kv_len - qo_len - window_left:
                    continue
                x = sum(float(q[i, h, d]) * float(k[j, kh, d]) for d in range(dqk))
                s = scale * x
                if soft_cap > 0:
                    s = soft_cap * math.tanh(s / soft_cap)
                if alibi:
                    s += slopes[h] * (j - i)
                scores.append((j, s))
            if not scores:
                continue
            m = max(s for _, s in scores)
            z = sum(math.exp(s - m) for _, s in scores)
            lse[i, h] = (m + math.log(z)) / math.log(2.0)
            for j, s in scores:
                o[i, h] += math.exp(s - m) / z * v[j, kh].double()
    return o, lse


def assert_prefill_close(out: torch.Tensor, ref: torch.Tensor, name: str = "o", rel: float = 1e-2,
                         atol: float = 1e-5, empty_rows: Optional[torch.Tensor] = None) -> None:
    """out [qo_len, H, D] (any dtype) against the float64 reference: no NaN; per (row, head)
    max |out - ref| <= rel * max |ref of that row| + atol; ``empty_rows`` [qo_len, H] bool (rows with
    no key, e.g. ``isinf(ref_lse)``) exactly 0."""
    assert tuple(out.shape) == tuple(ref.shape), f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    a = out.detach().double()
    e = ref.detach().to(device=a.device, dtype=torch.float64)
    n_nan = int(torch.isnan(a).sum())
    assert n_nan == 0, f"{name}: {n_nan} of {a.numel()} elements are NaN"
    if a.numel() == 0:
        return
    if empty_rows is not None and bool(empty_rows.any()):
        rows = empty_rows.to(a.device)
        assert torch.equal(a[rows], torch.zeros_like(a[rows])), f"{name}: rows with no key must be exactly 0"
    err = (a - e).abs().amax(dim=-1)  # [qo_len, H]
    bound = rel * e.abs().amax(dim=-1) + atol
    bad = err > bound
    if bool(bad.any()):
        worst = int(torch.argmax(err / bound))
        i, h = divmod(worst, a.shape[1])
        raise AssertionError(f"{name}: {int(bad.sum())} of {bad.numel()} (row, head) pairs off by more than {rel:g} * "
                             f"max|ref row| + {atol:g}; worst row {i} head {h}: max err {err[i, h].item():.4g}, "
                             f"row max |ref| {e[i, h].abs().max().item():.4g}")


def assert_prefill_lse_close(lse: torch.Tensor, ref: torch.Tensor, name: str = "lse", tol: float = 1e-3) -> None:
    """lse [qo_len, H] float32 against the float64 reference: |lse - ref| <= tol * (1 + |ref|), -inf
    exactly where the reference has it."""
    assert tuple(lse.shape) == tuple(ref.shape), f"{name}: shape {tuple(lse.shape)} != {tuple(ref.shape)}"
    assert lse.dtype == torch.float32, f"{name}: dtype {lse.dtype}, expected float32"
    a = lse.detach().double()
    e = ref.detach().to(device=a.device, dtype=torch.float64)
    assert not bool(torch.isnan(a).any()), f"{name}: NaN"
    inf = torch.isinf(e)
    assert torch.equal(torch.isinf(a), inf) and bool((a[inf] < 0).all()), (
        f"{name}: -inf pattern differs ({int(torch.isinf(a).sum())} vs {int(inf.sum())} entries)")
    fin = ~inf
    if bool(fin.any()):
        err = (a[fin] - e[fin]).abs()
        bound = tol * (1 + e[fin].abs())
        bad = err > bound
        assert not bool(bad.any()), (f"{name}: {int(bad.sum())} of {err.numel()} entries off by more than "
                                     f"{tol:g} * (1 + |ref|); worst excess {(err - bound).max().item():.4g}")
