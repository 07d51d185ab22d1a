"""Bench routine ``mla``: BatchMLAPagedAttentionWrapper (DeepSeek MLA with matrix absorption),
``--batch-size`` requests of ``--qo-len`` query tokens x ``--num-heads`` heads over ``--kv-len``
latent keys each (``--head-dim-kpe`` 64 or 0), pages of ``--page-size`` in random order; plan
once, time ``run``. E.g. ``--routine mla --batch-size 64 --qo-len 1 --kv-len 4096 --num-heads 128``:
pass ``--batch-size``, ``--qo-len`` and ``--num-heads`` (flags shared with other routines take
those routines' defaults: 4096 rows, 4096 query rows, 32 heads).

Bytes = the ckv + kpe keys read once per request + q read + o written. FLOPs = 2 * num_heads *
(512 + head_dim_kpe + 512) * (visible query-key pairs): QK^T over 576 and PV over 512; causal
(bottom-right) counts the pairs exactly (routines_prefill.visible_pairs: for qo_len 1 every key).
The bandwidth column is against the 4273 GB/s copy ceiling; TFLOP/s against 775 (bf16 GEMM).
The PyTorch reference is matmul -> softmax -> matmul in the input dtype on [B, H, qo, kv] over K / V
gathered contiguous beforehand (not timed), with the causal mask as a boolean ``masked_fill``.
"""

from __future__ import annotations

import argparse
import math

import flashinfer

from .routines import Case, _dtype, register
from .routines_prefill import visible_pairs


def _add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("mla")

    def add(flag, **kw):  # flags other families also define are added once
        if flag not in p._option_string_actions:
            g.add_argument(flag, **kw)

    add("--num-heads", type=int, default=128, help="mla: query heads (all read one latent KV head)")
    add("--head-dim-kpe", type=int, default=64, choices=[64, 0], help="mla: rope part of q / K (64, or 0: none)")
    add("--page-size", type=int, default=16)
    add("--kv-len", type=int, default=4096)
    add("--qo-len", type=int, default=1)
    add("--causal", action="store_true")


_MLA_MAX_TOKENS = 1 << 20


def mla(torch, args) -> Case:
    b, qo, kv, ps = args.batch_size, args.qo_len, args.kv_len, args.page_size
    h, dkpe = args.num_heads, args.head_dim_kpe
    causal = args.causal
    if b * max(qo, kv) > _MLA_MAX_TOKENS:
        raise SystemExit(f"mla: --batch-size {b} x {max(qo, kv)} tokens is over {_MLA_MAX_TOKENS}; pass --batch-size "
                         "and --qo-len explicitly (their defaults are other routines' row counts)")
    dt = _dtype(torch, args.dtype)
    dev = "cuda"
    pages_per = (kv + ps - 1) // ps
    total = b * pages_per
    ckv = torch.randn(total, ps, 512, dtype=dt, device=dev)
    kpe = torch.randn(total, ps, dkpe, dtype=dt, device=dev) if dkpe else None
    q_nope = torch.randn(b * qo, h, 512, dtype=dt, device=dev)
    q_pe = torch.randn(b * qo, h, dkpe, dtype=dt, device=dev) if dkpe else None
    indices = torch.randperm(total, device=dev).int()
    i32 = dict(dtype=torch.int32, device=dev)
    w = flashinfer.BatchMLAPagedAttentionWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=dev))
    sm_scale = 1.0 / math.sqrt(128 + 64)
    w.plan(torch.arange(b + 1, **i32) * qo, torch.arange(b + 1, **i32) * pages_per, indices,
           torch.full((b,), kv, **i32), h, 512, dkpe, ps, causal, sm_scale, dt, dt)
    out = torch.empty(b * qo, h, 512, dtype=dt, device=dev)

    # reference inputs: K = [ckv || kpe] [B, 1, kv, 576], V = ckv [B, 1, kv, 512], gathered contiguous
    def gather(c):
        return c[indices.long().view(b, pages_per)].reshape(b, pages_per * ps, -1)[:, :kv].unsqueeze(1).contiguous()

    vs = gather(ckv)
    ks = vs if kpe is None else torch.cat([vs, gather(kpe)], -1).contiguous()
    q = q_nope if q_pe is None else torch.cat([q_nope, q_pe], -1)
    qs = q.view(b, qo, h, -1).transpose(1, 2).contiguous()  # [B, H, qo, 576]
    hidden = torch.ones(qo, kv, dtype=torch.bool, device=dev).triu(kv - qo + 1) if causal else None

    def ref():
        s = torch.matmul(qs, ks.transpose(-1, -2)) * sm_scale  # [B, H, qo, kv]
        if hidden is not None:
            s = s.masked_fill(hidden, float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), vs)

    e = q_nope.element_size()
    dqk = 512 + dkpe
    nbytes = (b * kv * dqk + b * qo * h * dqk + b * qo * h * 512) * e
    flops = b * 2 * h * (dqk + 512) * visible_pairs(qo, kv, causal)
    tag = (" causal" if causal else "") + ("" if dkpe else " nokpe") + f" ps{ps}"
    return Case("mla", f"{b}x{qo}x{kv} h{h}{tag}", args.dtype, lambda: w.run(q_nope, q_pe, ckv, kpe),
                lambda: w.run(q_nope, q_pe, ckv, kpe, out=out), ref, "matmul-softmax-matmul (contiguous KV)",
                bytes=nbytes, flops=flops, extra={"work_items": w._num_items})


register({"mla": mla}, [], _add_args)
