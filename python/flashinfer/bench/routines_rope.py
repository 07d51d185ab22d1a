"""Bench routines for RoPE and the paged-KV append: ``rope`` (pos_ids form, computed cos/sin),
``rope_cos_sin_cache`` (vLLM/SGLang form) and ``append_paged_kv_cache``.

Bytes. RoPE: q and k read + written, 2 * nnz * (Hq + Hk) * D * elem (as the peer figures count
it; positions and the cos/sin rows add < 3%). Append: K and V rows read + written into the
cache, 4 * nnz * Hkv * D * elem. ``ours`` is the allocating call (RoPE) / the append;
``ours_out`` is the in-place RoPE variant (no allocation). The PyTorch references are the eager
formulas: cos/sin from the positions then rotate-half (RoPE), an index gather of the cos/sin
cache (vLLM's forward_native), and advanced-index scatter into the cache (append).
"""

from __future__ import annotations

import argparse

import flashinfer

from .routines import Case, _dtype, register


def _add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rope / append_paged_kv_cache")

    def add(flag, **kw):  # flags other families also define are added once
        if flag not in p._option_string_actions:
            g.add_argument(flag, **kw)

    add("--num-qo-heads", type=int, default=32)
    add("--num-kv-heads", type=int, default=8)
    add("--head-dim", type=int, default=128)
    add("--page-size", type=int, default=16)
    add("--rotary-dim", type=int, default=0, help="rope: rotary dimension (0: head_dim)")
    add("--interleave", action="store_true", help="rope: interleaved (GPT-J) pairs instead of NeoX")
    add("--max-position", type=int, default=131072, help="rope: positions drawn from [0, max-position)")
    add("--kv-layout", default="NHD", choices=["NHD", "HND"], help="append_paged_kv_cache layout")
    add("--num-requests", type=int, default=16, help="append_paged_kv_cache: requests the tokens split over")


def _rope_inputs(torch, args):
    n, hq, hk, d = args.batch_size, args.num_qo_heads, args.num_kv_heads, args.head_dim
    dt = _dtype(torch, args.dtype)
    q = torch.randn(n, hq, d, dtype=dt, device="cuda")
    k = torch.randn(n, hk, d, dtype=dt, device="cuda")
    pos = torch.randint(0, args.max_position, (n,), dtype=torch.int32, device="cuda")
    rd = args.rotary_dim or d
    return n, hq, hk, d, rd, q, k, pos


def _rotate_half(torch, x, cos, sin, rd, interleave):
    """Eager PyTorch RoPE of x [n, h, d] given cos/sin [n, 1, rd/2] (float32)."""
    if interleave:
        x1, x2 = x[..., 0:rd:2], x[..., 1:rd:2]
        rot = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        x1, x2 = x[..., :rd // 2], x[..., rd // 2:rd]
        rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((rot.to(x.dtype), x[..., rd:]), dim=-1)


def rope(torch, args) -> Case:
    n, hq, hk, d, rd, q, k, pos = _rope_inputs(torch, args)
    il = args.interleave
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, rd, 2, dtype=torch.float32, device="cuda") / rd))

    def ref():
        ang = (pos.float()[:, None] * inv_freq[None, :])[:, None, :]
        cos, sin = ang.cos(), ang.sin()
        return _rotate_half(torch, q, cos, sin, rd, il), _rotate_half(torch, k, cos, sin, rd, il)

    e = q.element_size()
    return Case("rope", f"{n} {hq}/{hk}x{d} rd{rd}", args.dtype,
                lambda: flashinfer.apply_rope_pos_ids(q, k, pos, rotary_dim=rd, interleave=il),
                lambda: flashinfer.apply_rope_pos_ids_inplace(q, k, pos, rotary_dim=rd, interleave=il), ref,
                "eager cos/sin + rotate-half", bytes=2 * n * (hq + hk) * d * e)


def rope_cos_sin_cache(torch, args) -> Case:
    n, hq, hk, d, rd, _, _, pos = _rope_inputs(torch, args)
    dt = _dtype(torch, args.dtype)
    neox = not args.interleave
    query = torch.randn(n, hq * d, dtype=dt, device="cuda")
    key = torch.randn(n, hk * d, dtype=dt, device="cuda")
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, rd, 2, dtype=torch.float32, device="cuda") / rd))
    t = torch.arange(args.max_position, dtype=torch.float32, device="cuda")
    freqs = torch.outer(t, inv_freq)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    pos64 = pos.long()

    def ref():  # vLLM RotaryEmbedding.forward_native
        cos, sin = cache.index_select(0, pos64).chunk(2, dim=-1)
        cos, sin = cos[:, None, :], sin[:, None, :]
        qo = _rotate_half(torch, query.view(n, hq, d), cos, sin, rd, not neox)
        ko = _rotate_half(torch, key.view(n, hk, d), cos, sin, rd, not neox)
        return qo.reshape(n, -1), ko.reshape(n, -1)

    e = query.element_size()
    return Case("rope_cos_sin_cache", f"{n} {hq}/{hk}x{d} rd{rd}", args.dtype,
                lambda: flashinfer.apply_rope_with_cos_sin_cache(pos, query, key, d, cache, neox),
                lambda: flashinfer.apply_rope_with_cos_sin_cache_inplace(pos, query, key, d, cache, neox), ref,
                "vLLM forward_native (eager)", bytes=2 * n * (hq + hk) * d * e)


def append_paged_kv_cache(torch, args) -> Case:
    n, hk, d, ps = args.batch_size, args.num_kv_heads, args.head_dim, args.page_size
    dt = _dtype(torch, args.dtype)
    reqs = max(1, min(args.num_requests, n))
    add = [n // reqs + (1 if r < n % reqs else 0) for r in range(reqs)]
    old = 37  # every request already holds 37 tokens: appends start inside a partly filled page
    pages = [(old + a + ps - 1) // ps for a in add]
    total_pages = sum(pages) + 8
    perm = torch.randperm(total_pages, device="cuda").int()
    indptr_l = [0]
    for p in pages:
        indptr_l.append(indptr_l[-1] + p)
    kv_indptr = torch.tensor(indptr_l, dtype=torch.int32, device="cuda")
    kv_indices = perm[:indptr_l[-1]].contiguous()
    kv_last = torch.tensor([(old + a) - (p - 1) * ps for a, p in zip(add, pages)], dtype=torch.int32, device="cuda")
    append_indptr = torch.tensor([0] + torch.cumsum(torch.tensor(add), 0).tolist(), dtype=torch.int32, device="cuda")
    seq_lens = flashinfer.get_seq_lens(kv_indptr, kv_last, ps)
    bi, pos = flashinfer.get_batch_indices_positions(append_indptr, seq_lens, n)
    nhd = args.kv_layout == "NHD"
    shape = (total_pages, ps, hk, d) if nhd else (total_pages, hk, ps, d)
    k_cache = torch.randn(shape, dtype=dt, device="cuda")
    v_cache = torch.randn(shape, dtype=dt, device="cuda")
    key = torch.randn(n, hk, d, dtype=dt, device="cuda")
    value = torch.randn(n, hk, d, dtype=dt, device="cuda")
    bi64, pos64, ind64, ptr64 = bi.long(), pos.long(), kv_indices.long(), kv_indptr.long()

    def ours():
        flashinfer.append_paged_kv_cache(key, value, bi, pos, (k_cache, v_cache), kv_indices, kv_indptr, kv_last,
                                         args.kv_layout)

    def ref():  # the same page-table arithmetic and an advanced-index scatter, eagerly
        page = ind64[ptr64[bi64] + pos64 // ps]
        slot = pos64 % ps
        if nhd:
            k_cache[page, slot] = key
            v_cache[page, slot] = value
        else:
            k_cache[page, :, slot] = key
            v_cache[page, :, slot] = value

    e = key.element_size()
    return Case("append_paged_kv_cache", f"{n} {hk}x{d} ps{ps} {args.kv_layout}", args.dtype, ours, None, ref,
                "index arithmetic + scatter (eager)", bytes=4 * n * hk * d * e)


register(
    {"rope": rope, "rope_cos_sin_cache": rope_cos_sin_cache, "append_paged_kv_cache": append_paged_kv_cache},
    [
        "--routine rope --batch-size 32768 --num-qo-heads 32 --num-kv-heads 8 --head-dim 128",
        "--routine rope --batch-size 4096 --num-qo-heads 32 --num-kv-heads 8 --head-dim 128",
        "--routine rope --batch-size 1 --num-qo-heads 32 --num-kv-heads 8 --head-dim 128",
        "--routine rope_cos_sin_cache --batch-size 32768 --num-qo-heads 32 --num-kv-heads 8 --head-dim 128",
        "--routine rope_cos_sin_cache --batch-size 1 --num-qo-heads 32 --num-kv-heads 8 --head-dim 128",
        "--routine append_paged_kv_cache --batch-size 65536 --num-kv-heads 8 --head-dim 128 --page-size 16",
        "--routine append_paged_kv_cache --batch-size 4096 --num-kv-heads 8 --head-dim 128 --page-size 16",
        "--routine append_paged_kv_cache --batch-size 64 --num-kv-heads 8 --head-dim 128 --page-size 16",
        "--routine append_paged_kv_cache --batch-size 1 --num-kv-heads 8 --head-dim 128 --page-size 16",
    ],
    _add_args,
)
