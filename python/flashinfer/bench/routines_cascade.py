"""Bench routines for merging attention states: ``merge_state`` (two states) and
``merge_states`` (``--num-states`` per row). Shapes: ``--batch-size`` rows (seq_len) x
``--num-heads`` x ``--head-dim``.

Bytes = every state read once + the merged state written: merge_state reads v_a, v_b, s_a, s_b
and writes v, s (3 * N * H * D * elem + 3 * N * H * 4); merge_states reads v, s of K states and
writes one (K + 1) * N * H * D * elem + (K + 1) * N * H * 4. ``ours`` allocates its outputs (the
API has no out=); ``ours_out`` is merge_state_in_place for merge_state (no allocation: the same
bytes). The PyTorch reference is the eager spec formula in fp32.
"""

from __future__ import annotations

import argparse

import flashinfer

from .routines import Case, _dtype, register


def _add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("merge_state / merge_states")

    def add(flag, **kw):  # flags other families also define are added once
        if flag not in p._option_string_actions:
            g.add_argument(flag, **kw)

    add("--num-heads", type=int, default=32, help="merge_state(s): heads")
    add("--head-dim", type=int, default=128)
    add("--num-states", type=int, default=8, help="merge_states: states merged per row")


def merge_state(torch, args) -> Case:
    n, h, d = args.batch_size, args.num_heads, args.head_dim
    dt = _dtype(torch, args.dtype)
    v_a = torch.randn(n, h, d, dtype=dt, device="cuda")
    v_b = torch.randn(n, h, d, dtype=dt, device="cuda")
    s_a = torch.randn(n, h, dtype=torch.float32, device="cuda") * 4
    s_b = torch.randn(n, h, dtype=torch.float32, device="cuda") * 4
    v_ip, s_ip = v_a.clone(), s_a.clone()  # merged into repeatedly: values stay finite

    def ref():
        m = torch.maximum(s_a, s_b)
        wa, wb = torch.exp2(s_a - m), torch.exp2(s_b - m)
        tot = wa + wb
        v = ((wa / tot)[..., None] * v_a.float() + (wb / tot)[..., None] * v_b.float()).to(dt)
        return v, m + torch.log2(tot)

    e = v_a.element_size()
    return Case("merge_state", f"{n}x{h}x{d}", args.dtype, lambda: flashinfer.merge_state(v_a, s_a, v_b, s_b),
                lambda: flashinfer.merge_state_in_place(v_ip, s_ip, v_b, s_b), ref, "eager formula",
                bytes=3 * n * h * d * e + 3 * n * h * 4)


def merge_states(torch, args) -> Case:
    n, k, h, d = args.batch_size, args.num_states, args.num_heads, args.head_dim
    dt = _dtype(torch, args.dtype)
    v = torch.randn(n, k, h, d, dtype=dt, device="cuda")
    s = torch.randn(n, k, h, dtype=torch.float32, device="cuda") * 4

    def ref():
        m = s.amax(dim=1)
        w = torch.exp2(s - m[:, None])
        tot = w.sum(dim=1)
        out = ((w[..., None] * v.float()).sum(dim=1) / tot[..., None]).to(dt)
        return out, m + torch.log2(tot)

    e = v.element_size()
    return Case("merge_states", f"{n}x{k}x{h}x{d}", args.dtype, lambda: flashinfer.merge_states(v, s), None, ref,
                "eager formula", bytes=(k + 1) * n * h * d * e + (k + 1) * n * h * 4)


register(
    {"merge_state": merge_state, "merge_states": merge_states},
    [
        "--routine merge_state --batch-size 8192 --num-heads 32 --head-dim 128",
        "--routine merge_states --batch-size 2048 --num-states 8 --num-heads 32 --head-dim 128",
    ],
    _add_args,
)
