"""Bench routines for prefill attention: ``single_prefill`` (one request, contiguous K/V) and
``batch_prefill`` (BatchPrefillWithPagedKVCacheWrapper: ``--batch-size`` requests of ``--qo-len``
query tokens over ``--kv-len`` keys each, in a paged cache of ``--page-size`` (16) pages in random
order, or with ``--ragged`` BatchPrefillWithRaggedKVCacheWrapper over the same keys stored
contiguously; plan once, time ``run``), e.g. ``--routine batch_prefill --batch-size 4 --qo-len 1024
--kv-len 1024 --causal``. batch_prefill is registered but not in the default suite. Its
``--kv-dtype`` (the flag the decode routines define: ``same`` = ``--dtype``, bfloat16 by
default, or ``float8_e4m3fn`` / ``float8_e5m2``) stores the cache (or ragged K / V) in fp8; the
SDPA reference then runs on the dequantized values in q's dtype. Bytes = K and V read (their
element size: 1 for fp8) + q read + o written, each once.

FLOPs = 2 * (head_dim_qk + head_dim_vo) * num_qo_heads * (visible query-key pairs): QK^T and PV,
a multiply-add counting 2; without a mask every pair is visible (4 * qo_len * kv_len * H * D
when the head dims are equal), with ``--causal`` (bottom-right) row i sees min(kv_len, i +
kv_len - qo_len + 1) keys, about half the pairs when qo_len == kv_len. ``block_sparse``
(BlockSparseAttentionWrapper: ``--qo-len`` x ``--kv-len`` with ``--block-r`` x ``--block-c``
blocks, a random ``--density`` of them kept) counts the pairs its mask keeps; its reference is
SDPA with the dense bool mask. Reported as TFLOP/s and
as the fraction of the 775 TFLOP/s bf16 GEMM ceiling (timing.MATMUL_CEILING_TFLOPS). The
PyTorch reference is ``F.scaled_dot_product_attention(..., enable_gqa=True)`` on [1, H, L, D]
copies made beforehand (not timed), ``is_causal`` when qo_len == kv_len, else the bottom-right
mask as a boolean ``attn_mask``; for batch_prefill on the batched [B, H, L, D] copies (K / V
gathered from the pages beforehand), FLOPs summed over the requests.
"""

from __future__ import annotations

import argparse

import flashinfer

from .routines import Case, _dtype, register
from .routines_decode import _kv


def _add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("single_prefill")

    def add(flag, **kw):  # flags other families also define are added once
        if flag not in p._option_string_actions:
            g.add_argument(flag, **kw)

    add("--qo-len", type=int, default=4096, help="single_prefill: query rows")
    add("--kv-len", type=int, default=4096)
    add("--num-qo-heads", type=int, default=32)
    add("--num-kv-heads", type=int, default=8)
    add("--head-dim", type=int, default=128)
    add("--head-dim-vo", type=int, default=0, help="single_prefill: head_dim of v and o (0: --head-dim)")
    add("--causal", action="store_true", help="single_prefill: bottom-right causal mask")
    add("--kv-layout", default="NHD", choices=["NHD", "HND"])
    add("--pos-encoding-mode", choices=["NONE", "ROPE_LLAMA", "ALIBI"], default="NONE")
    add("--ragged", action="store_true", help="batch_prefill: contiguous (ragged) K/V instead of a paged cache")
    add("--kv-dtype", choices=["same", "float8_e4m3fn", "float8_e5m2"], default="same",
        help="KV cache element type (same: the --dtype)")
    add("--suffix-len", type=int, default=256, help="cascade: unique keys per request (the shared prefix: --kv-len)")
    add("--no-split", action="store_true", help="batch_prefill / cascade: plan with disable_split_kv (no split-KV)")
    add("--block-r", type=int, default=64, help="block_sparse: rows per block (R); M = --qo-len, N = --kv-len")
    add("--block-c", type=int, default=64, help="block_sparse: keys per block (C)")
    add("--density", type=float, default=0.25, help="block_sparse: fraction of the blocks kept (random)")


def visible_pairs(qo_len: int, kv_len: int, causal: bool) -> int:
    """(query row, key) pairs the attention computes: all of them, or under the bottom-right causal
    mask sum_i clamp(i + kv_len - qo_len + 1, 0, kv_len) (row i < qo_len never passes kv_len)."""
    if not causal:
        return qo_len * kv_len
    delta = kv_len - qo_len
    lo = max(0, -delta)  # rows before lo see no key; row i >= lo sees i + delta + 1
    n = qo_len - lo
    return n * (lo + delta + 1) + n * (n - 1) // 2


def _sdpa_ref(torch, qs, ks, vs, qo: int, kv: int, causal: bool):
    """SDPA over [B, H, L, D] inputs: is_causal when qo == kv, else the bottom-right mask."""
    F = torch.nn.functional
    if causal and qo != kv:
        mask = torch.ones(qo, kv, dtype=torch.bool, device="cuda").tril(kv - qo)
        return lambda: F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)
    return lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, enable_gqa=True)


def single_prefill(torch, args) -> Case:
    qo, kv = args.qo_len, args.kv_len
    hq, hkv, d = args.num_qo_heads, args.num_kv_heads, args.head_dim
    dvo = args.head_dim_vo or d
    causal, layout, pos = args.causal, args.kv_layout, args.pos_encoding_mode
    dt = _dtype(torch, args.dtype)
    q = torch.randn(qo, hq, d, dtype=dt, device="cuda")
    k = torch.randn(kv, hkv, d, dtype=dt, device="cuda")
    v = torch.randn(kv, hkv, dvo, dtype=dt, device="cuda")
    # reference inputs [1, H, L, D], contiguous
    qs, ks, vs = (x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v))
    if layout == "HND":
        k, v = ks[0], vs[0]
    ref = _sdpa_ref(torch, qs, ks, vs, qo, kv, causal)

    def ours():
        return flashinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, kv_layout=layout, pos_encoding_mode=pos)

    flops = 2 * (d + dvo) * hq * visible_pairs(qo, kv, causal)
    tag = (" causal" if causal else "") + (" HND" if layout == "HND" else "")
    tag += "" if pos == "NONE" else " " + pos.lower()
    dims = f"{d}" if dvo == d else f"{d}/{dvo}"
    return Case("single_prefill", f"{qo}x{kv} {hq}/{hkv}x{dims}{tag}", args.dtype, ours, None, ref,
                "SDPA enable_gqa", flops=flops)


_BATCH_PREFILL_MAX_TOKENS = 1 << 20


def batch_prefill(torch, args) -> Case:
    b, qo, kv = args.batch_size, args.qo_len, args.kv_len
    ps = getattr(args, "page_size", 16)
    hq, hkv, d = args.num_qo_heads, args.num_kv_heads, args.head_dim
    dvo = args.head_dim_vo or d
    causal, layout = args.causal, args.kv_layout
    if b * max(qo, kv) > _BATCH_PREFILL_MAX_TOKENS:
        raise SystemExit(f"batch_prefill: --batch-size {b} x {max(qo, kv)} tokens is over {_BATCH_PREFILL_MAX_TOKENS}; "
                         "pass a smaller --batch-size (its default, 4096, is the row count of the row-wise routines)")
    dt = _dtype(torch, args.dtype)
    pages_per = (kv + ps - 1) // ps
    total = b * pages_per
    hnd = layout == "HND"
    shape = (lambda dd: (total, hkv, ps, dd)) if hnd else (lambda dd: (total, ps, hkv, dd))
    (k_cache, kvtag), (v_cache, _) = (_kv(torch, args, torch.randn(shape(dd), dtype=dt, device="cuda"))
                                      for dd in (d, dvo))
    kv_dt = k_cache.dtype
    indices = torch.randperm(total, device="cuda").int()
    kv_indptr = torch.arange(b + 1, dtype=torch.int32, device="cuda") * pages_per
    last = torch.full((b,), kv - (pages_per - 1) * ps, dtype=torch.int32, device="cuda")
    qo_indptr = torch.arange(b + 1, dtype=torch.int32, device="cuda") * qo
    q = torch.randn(b * qo, hq, d, dtype=dt, device="cuda")
    out = torch.empty(b * qo, hq, dvo, dtype=dt, device="cuda")
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, layout)
    w.plan(qo_indptr, kv_indptr, indices, last, hq, hkv, d, ps, head_dim_vo=dvo, causal=causal, q_data_type=dt,
           kv_data_type=kv_dt, disable_split_kv=args.no_split)
    cache = (k_cache, v_cache)
    run, run_out = (lambda: w.run(q, cache)), (lambda: w.run(q, cache, out=out))
    # reference inputs [B, H, L, D], contiguous, q's dtype: K / V gathered from the pages
    def gather(c):
        pages = c.to(dt)[indices.long().view(b, pages_per)]  # [B, pages, ps, H, D] or [B, pages, H, ps, D]
        if hnd:
            pages = pages.transpose(2, 3)
        return pages.reshape(b, pages_per * ps, hkv, -1)[:, :kv].transpose(1, 2).contiguous()

    qs, ks, vs = q.view(b, qo, hq, d).transpose(1, 2).contiguous(), gather(k_cache), gather(v_cache)
    if args.ragged:  # the same keys, contiguous per request: [B * kv, H, D]
        kr, vr = (x.transpose(1, 2).reshape(b * kv, hkv, -1).contiguous().to(kv_dt) for x in (ks, vs))
        kv_rows = torch.arange(b + 1, dtype=torch.int32, device="cuda") * kv
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
        w.plan(qo_indptr, kv_rows, hq, hkv, d, head_dim_vo=dvo, causal=causal, q_data_type=dt, kv_data_type=kv_dt,
               disable_split_kv=args.no_split)
        run, run_out = (lambda: w.run(q, kr, vr)), (lambda: w.run(q, kr, vr, out=out))
    ref = _sdpa_ref(torch, qs, ks, vs, qo, kv, causal)

    flops = b * 2 * (d + dvo) * hq * visible_pairs(qo, kv, causal)
    nbytes = b * kv * hkv * (d + dvo) * k_cache.element_size() + b * qo * hq * (d + dvo) * q.element_size()
    tag = (" causal" if causal else "") + (" ragged" if args.ragged else (" HND" if hnd else "") + f" ps{ps}") + kvtag
    tag += " nosplit" if args.no_split else ""
    dims = f"{d}" if dvo == d else f"{d}/{dvo}"
    return Case("batch_prefill", f"{b}x{qo}x{kv} {hq}/{hkv}x{dims}{tag}", args.dtype, run, run_out, ref,
                "SDPA enable_gqa", bytes=nbytes, flops=flops,
                extra={"m_tiles": w._m_tiles, "work_items": w._num_items, "chunks": w._num_chunks})


def cascade(torch, args) -> Case:
    """MultiLevelCascadeAttentionWrapper over two levels (the peer figures' case): --batch-size
    requests of --qo-len query rows (decode: 1) share a prefix of --kv-len keys (level 0: one
    request holding every row) and have --suffix-len keys of their own (level 1, causal), pages of
    --page-size in random order. Bytes: the prefix's K / V once, the suffixes', q and o. No
    PyTorch reference (per-request SDPA would gather the prefix once per request)."""
    b, qo, kv, sfx = args.batch_size, args.qo_len, args.kv_len, args.suffix_len
    ps = getattr(args, "page_size", 16)
    hq, hkv, d = args.num_qo_heads, args.num_kv_heads, args.head_dim
    dt = _dtype(torch, args.dtype)
    pre_pages, sfx_pages = -(-kv // ps), -(-sfx // ps)
    total = pre_pages + b * sfx_pages
    cache = torch.randn(total, 2, ps, hkv, d, dtype=dt, device="cuda")
    perm = torch.randperm(total, device="cuda").int()
    i32 = dict(dtype=torch.int32, device="cuda")
    qo_arr = [torch.tensor([0, b * qo], **i32), torch.arange(b + 1, **i32) * qo]
    kv_arr = [torch.tensor([0, pre_pages], **i32), torch.arange(b + 1, **i32) * sfx_pages]
    idx_arr = [perm[:pre_pages].contiguous(), perm[pre_pages:].contiguous()]
    last_arr = [torch.tensor([kv - (pre_pages - 1) * ps], **i32), torch.full((b,), sfx - (sfx_pages - 1) * ps, **i32)]
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
    w.plan(qo_arr, kv_arr, idx_arr, last_arr, hq, hkv, d, ps, causal=True, q_data_type=dt)
    if args.no_split:  # (the cascade wrapper has no such option: its levels are re-planned)
        for i, lw in enumerate(w._batch_prefill_wrappers):
            lw.plan(qo_arr[i], kv_arr[i], idx_arr[i], last_arr[i], hq, hkv, d, ps, causal=i == 1, q_data_type=dt,
                    disable_split_kv=True)
    q = torch.randn(b * qo, hq, d, dtype=dt, device="cuda")
    e = q.element_size()
    nbytes = (kv + b * sfx) * hkv * 2 * d * e + 2 * b * qo * hq * d * e
    flops = 4 * d * hq * b * qo * (kv + sfx)
    levels = w._batch_prefill_wrappers
    tag = " nosplit" if args.no_split else ""
    return Case("cascade", f"{b}x{qo} prefix {kv} + {sfx} {hq}/{hkv}x{d} ps{ps}{tag}", args.dtype, lambda: w.run(q, cache),
                None, None, "-", bytes=nbytes, flops=flops,
                extra={"prefix_chunks": levels[0]._num_chunks, "prefix_items": levels[0]._num_items})


def block_sparse(torch, args) -> Case:
    m, n, r, c = args.qo_len, args.kv_len, args.block_r, args.block_c
    hq, hkv, d = args.num_qo_heads, args.num_kv_heads, args.head_dim
    if n % c:
        raise SystemExit(f"block_sparse: --kv-len {n} must be a multiple of --block-c {c}")
    dt = _dtype(torch, args.dtype)
    mb, nb = -(-m // r), n // c
    g = torch.Generator().manual_seed(0)
    keep = torch.rand(mb, nb, generator=g) < args.density
    indptr = torch.zeros(mb + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(keep.sum(1), 0)
    indices = torch.nonzero(keep)[:, 1].int()  # row-major: block row by block row
    q = torch.randn(m, hq, d, dtype=dt, device="cuda")
    k = torch.randn(n, hkv, d, dtype=dt, device="cuda")
    v = torch.randn(n, hkv, d, dtype=dt, device="cuda")
    w = flashinfer.BlockSparseAttentionWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(indptr.cuda(), indices.cuda(), m, n, r, c, hq, hkv, d, q_data_type=dt, o_data_type=dt)
    out = torch.empty(m, hq, d, dtype=dt, device="cuda")
    dense = keep.repeat_interleave(r, 0)[:m].repeat_interleave(c, 1).cuda()  # [M, N]
    qs, ks, vs = (x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v))
    F = torch.nn.functional
    ref = lambda: F.scaled_dot_product_attention(qs, ks, vs, attn_mask=dense, enable_gqa=True)  # noqa: E731
    flops = 2 * 2 * d * hq * int(dense.sum())
    return Case("block_sparse", f"{m}x{n} R{r}C{c} {args.density:g} {hq}/{hkv}x{d}", args.dtype,
                lambda: w.run(q, k, v), lambda: w.run(q, k, v, out=out), ref, "SDPA dense mask", flops=flops,
                extra={"blocks": int(keep.sum())})


register(
    {"single_prefill": single_prefill, "batch_prefill": batch_prefill, "block_sparse": block_sparse, "cascade": cascade},
    [
        "--routine single_prefill --qo-len 4096 --kv-len 4096 --num-qo-heads 32 --num-kv-heads 8 --head-dim 128 "
        "--causal",
        "--routine single_prefill --qo-len 4096 --kv-len 4096 --num-qo-heads 32 --num-kv-heads 8 --head-dim 128",
    ],
    _add_args,
)
