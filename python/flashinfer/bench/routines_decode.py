"""Bench routines for decode attention: ``single_decode`` and ``batch_decode`` (paged,
pages in random order). Bytes = K and V read + q read + o written; the PyTorch reference is
SDPA with enable_gqa=True on K/V gathered contiguous beforehand (not timed). ``--kv-dtype``
float8_e4m3fn / float8_e5m2 stores the cache in fp8 (the bytes count its one-byte elements;
SDPA then runs on the dequantized values in q's dtype)."""

from __future__ import annotations

import argparse
import math

import flashinfer

from .routines import Case, _dtype, register


def _add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decode")
    g.add_argument("--kv-len", type=int, default=4096)
    g.add_argument("--page-size", type=int, default=16)
    g.add_argument("--num-qo-heads", type=int, default=32)
    g.add_argument("--num-kv-heads", type=int, default=8)
    g.add_argument("--head-dim", type=int, default=128)
    g.add_argument("--use-tensor-cores", action="store_true")
    g.add_argument("--kv-layout", choices=["NHD", "HND"], default="NHD", help="paged cache layout (batch_decode)")
    g.add_argument("--pos-encoding-mode", choices=["NONE", "ROPE_LLAMA", "ALIBI"], default="NONE",
                   help="batch_decode: position encoding applied in the kernel (the SDPA baseline has none)")
    g.add_argument("--kv-dtype", choices=["same", "float8_e4m3fn", "float8_e5m2"], default="same",
                   help="KV cache element type (same: the --dtype)")
    g.add_argument("--q-len-per-req", type=int, default=1,
                   help="batch_decode: query tokens per request (multi-token decode, causal; needs tensor cores)")


def _kv(torch, args, x):
    """x in the cache's element type (fp8 casts), and its tag for the case name."""
    if args.kv_dtype == "same":
        return x, ""
    return x.to(getattr(torch, args.kv_dtype)), " kv" + args.kv_dtype[5:]


def _sdpa(torch, q, k, v):
    # q [B, Hq, D] -> [B, Hq, 1, D]; k/v [B, Hkv, L, D]
    F = torch.nn.functional
    return lambda: F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True)


def batch_decode(torch, args) -> Case:
    b, L, ps = args.batch_size, args.kv_len, args.page_size
    hq, hkv, d = args.num_qo_heads, args.num_kv_heads, args.head_dim
    dt = _dtype(torch, args.dtype)
    pages_per = (L + ps - 1) // ps
    total = b * pages_per
    hnd = args.kv_layout == "HND"
    k = torch.randn(total, hkv, ps, d, dtype=dt, device="cuda") if hnd else torch.randn(total, ps, hkv, d, dtype=dt,
                                                                                         device="cuda")
    v = torch.randn_like(k)
    (k, kvtag), (v, _) = _kv(torch, args, k), _kv(torch, args, v)
    indices = torch.randperm(total, device="cuda").int()
    indptr = torch.arange(b + 1, dtype=torch.int32) * pages_per
    last = torch.full((b,), L - (pages_per - 1) * ps, dtype=torch.int32)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, args.kv_layout, use_tensor_cores=args.use_tensor_cores)
    n = args.q_len_per_req
    w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=dt, kv_data_type=k.dtype,
           pos_encoding_mode=args.pos_encoding_mode, q_len_per_req=n)
    q = torch.randn(b * n, hq, d, dtype=dt, device="cuda")
    o = torch.empty_like(q)
    # reference inputs: the same keys gathered contiguous [B, Hkv, L, D]
    idx = indices.long().view(b, pages_per)
    kn, vn = (k.transpose(1, 2), v.transpose(1, 2)) if hnd else (k, v)  # [pages, ps, hkv, d] views
    kc = kn[idx].reshape(b, pages_per * ps, hkv, d)[:, :L].transpose(1, 2).contiguous().to(dt)
    vc = vn[idx].reshape(b, pages_per * ps, hkv, d)[:, :L].transpose(1, 2).contiguous().to(dt)
    e = q.element_size()
    nbytes = 2 * b * L * hkv * d * k.element_size() + 2 * b * n * hq * d * e  # (pages once)
    tc = " tc" if args.use_tensor_cores else ""
    lay = (" HND" if hnd else "") + ("" if args.pos_encoding_mode == "NONE" else " " + args.pos_encoding_mode.lower())
    lay += kvtag + (f" q{n}" if n > 1 else "")
    if n > 1:  # SDPA on [b, hq, n, d] with the bottom-right causal mask
        F = torch.nn.functional
        qs = q.view(b, n, hq, d).transpose(1, 2)
        mask = torch.ones(n, L, dtype=torch.bool, device="cuda").tril(L - n)
        ref = lambda: F.scaled_dot_product_attention(qs, kc, vc, attn_mask=mask, enable_gqa=True)  # noqa: E731
    else:
        ref = _sdpa(torch, q, kc, vc)
    return Case("batch_decode" + tc, f"{b}x{L} {hq}/{hkv}x{d} ps{ps}{lay}", args.dtype, lambda: w.run(q, (k, v)),
                lambda: w.run(q, (k, v), out=o), ref, "SDPA enable_gqa (contiguous KV)", bytes=nbytes)


def single_decode(torch, args) -> Case:
    L, hq, hkv, d = args.kv_len, args.num_qo_heads, args.num_kv_heads, args.head_dim
    dt = _dtype(torch, args.dtype)
    q = torch.randn(hq, d, dtype=dt, device="cuda")
    k = torch.randn(L, hkv, d, dtype=dt, device="cuda")
    v = torch.randn_like(k)
    (k, kvtag), (v, _) = _kv(torch, args, k), _kv(torch, args, v)
    kc, vc = (x.transpose(0, 1).unsqueeze(0).contiguous().to(dt) for x in (k, v))
    e = q.element_size()
    tc = args.use_tensor_cores
    return Case("single_decode" + (" tc" if tc else ""), f"{L} {hq}/{hkv}x{d}{kvtag}", args.dtype,
                lambda: flashinfer.single_decode_with_kv_cache(q, k, v, use_tensor_cores=tc), None, _sdpa(torch, q.unsqueeze(0), kc, vc),
                "SDPA enable_gqa", bytes=2 * L * hkv * d * k.element_size() + 2 * hq * d * e)


register(
    {"batch_decode": batch_decode, "single_decode": single_decode},
    [
        "--routine batch_decode --batch-size 1 --kv-len 32768",
        "--routine batch_decode --batch-size 16 --kv-len 4096",
        "--routine batch_decode --batch-size 64 --kv-len 2048",
        "--routine batch_decode --batch-size 256 --kv-len 1024",
        "--routine batch_decode --batch-size 128 --kv-len 8192",
        "--routine batch_decode --batch-size 1 --kv-len 4096",
        "--routine batch_decode --batch-size 1 --kv-len 32768 --use-tensor-cores",
        "--routine batch_decode --batch-size 16 --kv-len 4096 --use-tensor-cores",
        "--routine batch_decode --batch-size 64 --kv-len 2048 --use-tensor-cores",
        "--routine batch_decode --batch-size 256 --kv-len 1024 --use-tensor-cores",
        "--routine batch_decode --batch-size 128 --kv-len 8192 --use-tensor-cores",
        "--routine batch_decode --batch-size 1 --kv-len 4096 --use-tensor-cores",
        "--routine single_decode --kv-len 32768",
        "--routine single_decode --kv-len 32768 --use-tensor-cores",
    ],
    _add_args,
)
