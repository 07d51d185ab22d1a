"""Bench routines for sorting-free sampling: ``sampling_from_probs``, ``top_p_sampling_from_probs``,
``min_p_sampling_from_probs``, ``top_k_sampling_from_probs`` and ``top_k_top_p_sampling_from_probs``
(top-k-first, scalar or ``--per-row`` parameters), on fp32 probabilities softmax(randn) of
``--batch-size`` rows by ``--vocab-size``.

Bytes: one read of the probabilities, B * V * 4 (the kernels pass over a row a few times, from
HBM or the shared-memory cache; the per-row rounds and passes are printed to stderr and kept in
Case.extra). The PyTorch references are what engines run without FlashInfer: torch.multinomial
(plain), topk + multinomial (top-k), max mask + multinomial (min-p), and the vLLM-style sorted
pipeline sort -> top-k mask -> renormalize -> cumsum top-p mask -> multinomial (top-p, top-k/top-p).
"""

from __future__ import annotations

import argparse
import sys

import flashinfer
from flashinfer import sampling as fs

from .routines import Case, register


def _add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")

    def add(flag, **kw):  # flags other families also define are added once
        if flag not in p._option_string_actions:
            g.add_argument(flag, **kw)

    add("--vocab-size", type=int, default=128256, help="sampling: vocabulary size")
    add("--top-k", type=int, default=50, help="sampling: top-k")
    add("--top-p", type=float, default=0.9, help="sampling: top-p")
    add("--min-p", type=float, default=0.1, help="sampling: min-p")
    add("--per-row", action="store_true", help="sampling: top-k / top-p as per-row tensors")
    add("--dist", default="randn", choices=["randn", "peaked"],
        help="sampling: probabilities softmax(randn) or softmax(4 * randn) (peaked)")


_SCALE = {"randn": 1.0, "peaked": 4.0}


def _probs(torch, args, dist=None):
    scale = _SCALE[dist or getattr(args, "dist", "randn")]
    return torch.softmax(scale * torch.randn(args.batch_size, args.vocab_size, device="cuda"), -1)


def _param(torch, args, value, dtype):
    if not args.per_row:
        return value
    return torch.full((args.batch_size,), value, dtype=dtype, device="cuda")


def _sorted_pipeline(torch, probs, k, p):
    """sort -> top-k mask -> renormalize -> cumsum top-p mask -> multinomial (vLLM-style)."""
    sp, idx = torch.sort(probs, dim=-1, descending=True)
    if k is not None:
        kk = k if isinstance(k, int) else k[:, None]
        sp = sp.masked_fill(torch.arange(sp.shape[-1], device=sp.device)[None, :] >= kk, 0.0)
    sp = sp / sp.sum(-1, keepdim=True)
    if p is not None:
        pp = p if isinstance(p, float) else p[:, None]
        cum = sp.cumsum(-1)
        sp = sp.masked_fill(cum - sp > pp, 0.0)
    choice = torch.multinomial(sp, 1)
    return idx.gather(-1, choice).squeeze(-1)


def _rounds(probs, args, **filters):
    """Mean / max draws (rejection rounds) and passes over the row, measured once on the bench's
    probabilities and once on each distribution kind (softmax(randn), peaked softmax(4 randn))."""
    import torch

    extra = {}
    for name, p in [("", probs)] + [(f"{d}_", _probs(torch, args, d)) for d in _SCALE]:
        _, stats = fs._sample_with_stats(p, seed=1, offset=0, **filters)
        d, n = stats[:, 0].float(), stats[:, 1].float()
        extra.update({f"{name}rounds_mean": float(d.mean()), f"{name}rounds_max": float(d.max()),
                      f"{name}passes_mean": float(n.mean()), f"{name}passes_max": float(n.max())})
    print(f"  [{args.routine} {args.batch_size}x{args.vocab_size}] rounds per row mean {extra['rounds_mean']:.2f} "
          f"max {extra['rounds_max']:.0f} (randn {extra['randn_rounds_mean']:.2f}/{extra['randn_rounds_max']:.0f}, "
          f"peaked {extra['peaked_rounds_mean']:.2f}/{extra['peaked_rounds_max']:.0f}); passes over the row mean "
          f"{extra['passes_mean']:.2f} max {extra['passes_max']:.0f}", file=sys.stderr)
    return extra


def _case(torch, args, name, ours, ref, ref_name, probs, **filters) -> Case:
    b, v = args.batch_size, args.vocab_size
    shape = f"{b}x{v}" + (" per-row" if args.per_row else "") + (" peaked" if args.dist == "peaked" else "")
    return Case(name, shape, "float32", ours, None, ref, ref_name, bytes=b * v * 4,
                extra=_rounds(probs, args, **filters))


def sampling_from_probs(torch, args) -> Case:
    probs = _probs(torch, args)
    return _case(torch, args, "sampling_from_probs", lambda: flashinfer.sampling_from_probs(probs),
                 lambda: torch.multinomial(probs, 1), "torch.multinomial", probs)


def top_p_sampling(torch, args) -> Case:
    probs = _probs(torch, args)
    p = _param(torch, args, args.top_p, torch.float32)
    return _case(torch, args, "top_p_sampling_from_probs", lambda: flashinfer.top_p_sampling_from_probs(probs, p),
                 lambda: _sorted_pipeline(torch, probs, None, p), "sort + cumsum + multinomial", probs, top_p=p)


def min_p_sampling(torch, args) -> Case:
    probs = _probs(torch, args)
    mp = _param(torch, args, args.min_p, torch.float32)

    def ref():
        thr = probs.max(-1, keepdim=True).values * (mp if isinstance(mp, float) else mp[:, None])
        return torch.multinomial(probs.masked_fill(probs < thr, 0.0), 1)

    return _case(torch, args, "min_p_sampling_from_probs", lambda: flashinfer.min_p_sampling_from_probs(probs, mp),
                 ref, "max mask + multinomial", probs, min_p=mp)


def top_k_sampling(torch, args) -> Case:
    probs = _probs(torch, args)
    k = _param(torch, args, args.top_k, torch.int32)

    def ref():
        vals, idx = torch.topk(probs, args.top_k, dim=-1)
        return idx.gather(-1, torch.multinomial(vals, 1))

    return _case(torch, args, "top_k_sampling_from_probs", lambda: flashinfer.top_k_sampling_from_probs(probs, k),
                 ref, "topk + multinomial", probs, top_k=k)


def top_k_top_p_sampling(torch, args) -> Case:
    probs = _probs(torch, args)
    k = _param(torch, args, args.top_k, torch.int32)
    p = _param(torch, args, args.top_p, torch.float32)
    return _case(torch, args, "top_k_top_p_sampling_from_probs",
                 lambda: flashinfer.top_k_top_p_sampling_from_probs(probs, k, p),
                 lambda: _sorted_pipeline(torch, probs, k, p), "sort-based (vLLM-style)", probs, top_k=k, top_p=p,
                 filter_apply_order="top_k_first")


ROUTINES = {
    "sampling_from_probs": sampling_from_probs,
    "top_p_sampling_from_probs": top_p_sampling,
    "min_p_sampling_from_probs": min_p_sampling,
    "top_k_sampling_from_probs": top_k_sampling,
    "top_k_top_p_sampling_from_probs": top_k_top_p_sampling,
}

SUITE = [f"--routine {r} --batch-size {b} --vocab-size 128256" for r in ROUTINES for b in (1, 64, 256)]
SUITE += [f"--routine top_k_top_p_sampling_from_probs --batch-size {b} --vocab-size 128256 --per-row"
          for b in (1, 64, 256)]

register(ROUTINES, SUITE, _add_args)
