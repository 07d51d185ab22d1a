"""Block-sparse attention (spec §8.2): ``BlockSparseAttentionWrapper``.

A BSR mask over an ``M x N`` attention matrix is a paged batch prefill in disguise: block row
``i`` (q rows ``i*R .. min((i+1)*R, M)``) is one request whose pages are its column blocks,
``indices[indptr[i]:indptr[i+1]]``, of ``C`` keys each in ``k`` / ``v`` viewed as
``[N / C, C, H_kv, D]``. So ``plan`` plans a :class:`~flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper`
(page size ``C``, every page full) and ``run`` runs it; an intra-block ``mask [nnz, R, C]`` becomes
each block row's ``[rows, blocks * C]`` custom mask. Host work only: no kernel of its own.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .decode import _host_ints, _pos_code
from .prefill import BatchPrefillWithPagedKVCacheWrapper

__all__ = ["BlockSparseAttentionWrapper"]

_OP = "BlockSparseAttentionWrapper"


def _torch():
    import torch

    return torch


class BlockSparseAttentionWrapper:
    r"""Attention under a block-sparse (BSR) mask: ``q [M, num_qo_heads, head_dim]`` against
    ``k, v [N, num_kv_heads, head_dim]``; block ``(i, indices[p])`` for ``p`` in
    ``[indptr[i], indptr[i+1])`` is attended, optionally refined by ``mask [nnz, R, C]`` (or its
    little-endian ``packed_mask``); rows that see no key get 0 (LSE -inf). ``causal`` is
    bottom-right per block row over that row's gathered keys (as FlashInfer does). Output dtype
    ``o_data_type`` (default float16, whatever q's dtype). Head dims 64 / 128 / 256; float16 /
    bfloat16. Not supported (``NotImplementedError``): ``pos_encoding_mode="ROPE_LLAMA"``, fp8,
    per-head ``scale_*``, and the vendor-backend options ``block_mask``, ``kv_block_lens``,
    ``q2k_indices``, ``q2k_num``, ``kv_splits``, ``use_clc``, ``q_scale`` / ``k_scale`` /
    ``v_scale``."""

    def __init__(self, float_workspace_buffer, backend: str = "auto") -> None:
        self._inner = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, "NHD", backend=backend)
        self._planned = None  # (M, N, R, C, num_kv_heads, head_dim)

    @property
    def _float_workspace_buffer(self):
        return self._inner._float_workspace_buffer

    @property
    def _int_workspace_buffer(self):
        return self._inner._int_workspace_buffer

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer) -> None:
        self._inner.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    def plan(self, indptr, indices, M: int, N: int, R: int, C: int, num_qo_heads: int, num_kv_heads: int,
             head_dim: int, mask=None, packed_mask=None, causal: bool = False, pos_encoding_mode: str = "NONE",
             use_fp16_qk_reduction: bool = False, logits_soft_cap: Optional[float] = None,
             sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, q_data_type: Any = "float16", kv_data_type: Any = None,
             o_data_type: Any = "float16", non_blocking: bool = True, block_mask=None, kv_block_lens=None,
             q2k_indices=None, q2k_num=None, kv_splits=None, use_clc=None, q_scale=None, k_scale=None,
             v_scale=None) -> None:
        """Plans the BSR problem (host work; may synchronize). ``indptr [ceil(M / R) + 1]``,
        ``indices [nnz]`` (block columns, each in ``[0, N / C)``), ``N % C == 0``."""
        vendor = {"block_mask": block_mask, "kv_block_lens": kv_block_lens, "q2k_indices": q2k_indices,
                  "q2k_num": q2k_num, "kv_splits": kv_splits, "use_clc": use_clc, "q_scale": q_scale,
                  "k_scale": k_scale, "v_scale": v_scale}
        given = [k for k, v in vendor.items() if v is not None]
        if given:
            raise NotImplementedError(f"{_OP}.plan: {', '.join(given)} (vendor-backend options) are not supported")
        if _pos_code(pos_encoding_mode) == 1:  # (the inner wrapper would rotate each block row's keys from 0)
            raise NotImplementedError(f"{_OP}.plan: pos_encoding_mode='ROPE_LLAMA' is not supported")
        M, N, R, C = int(M), int(N), int(R), int(C)
        if M < 0 or N < 0 or R < 1 or C < 1:
            raise ValueError(f"{_OP}.plan: M, N must be >= 0 and R, C >= 1; got M={M}, N={N}, R={R}, C={C}")
        if N % C != 0:
            raise ValueError(f"{_OP}.plan: N ({N}) must be a multiple of the block column size C ({C})")
        mb, nb = -(-M // R), N // C
        indptr_h = _host_ints(indptr, "indptr")
        indices_h = _host_ints(indices, "indices")
        if indptr_h.size != mb + 1:
            raise ValueError(f"{_OP}.plan: indptr must have ceil(M / R) + 1 = {mb + 1} entries; got {indptr_h.size}")
        if indptr_h.size and (indptr_h[0] != 0 or np.any(np.diff(indptr_h) < 0)):
            raise ValueError(f"{_OP}.plan: indptr must start at 0 and be nondecreasing")
        nnz = int(indptr_h[-1]) if indptr_h.size else 0
        if indices_h.size != nnz:
            raise ValueError(f"{_OP}.plan: indices must have indptr[-1] = {nnz} entries; got {indices_h.size}")
        if nnz and (indices_h.min() < 0 or indices_h.max() >= nb):
            bad = int(indices_h.min()) if indices_h.min() < 0 else int(indices_h.max())
            raise ValueError(f"{_OP}.plan: indices must be block columns in [0, N / C = {nb}); got {bad}")
        blocks = np.diff(indptr_h)
        qo_h = np.minimum(np.arange(mb + 1, dtype=np.int64) * R, M)
        last_h = np.where(blocks > 0, C, 0)

        custom = None
        if mask is not None or packed_mask is not None:
            custom = self._request_masks(mask, packed_mask, indptr_h, qo_h, blocks, nnz, R, C)
        torch = _torch()
        self._inner.plan(torch.from_numpy(qo_h.astype(np.int32)), torch.from_numpy(indptr_h.astype(np.int32)),
                         torch.from_numpy(indices_h.astype(np.int32)), torch.from_numpy(last_h.astype(np.int32)),
                         num_qo_heads, num_kv_heads, head_dim, C, custom_mask=custom, causal=causal,
                         pos_encoding_mode=pos_encoding_mode, use_fp16_qk_reduction=use_fp16_qk_reduction,
                         sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, rope_scale=rope_scale,
                         rope_theta=rope_theta, q_data_type=q_data_type, kv_data_type=kv_data_type,
                         o_data_type=o_data_type, non_blocking=non_blocking)
        self._planned = (M, N, R, C, int(num_kv_heads), int(head_dim))

    begin_forward = plan

    def _request_masks(self, mask, packed_mask, indptr_h, qo_h, blocks, nnz, R, C):
        """The intra-block mask ``[nnz, R, C]`` as the batch wrapper's custom mask: block row
        i's ``[rows_i, blocks_i * C]`` (block p of the row at columns ``(p - indptr[i]) * C``),
        flattened and concatenated; rows past M (a short last block row) dropped."""
        torch = _torch()
        for name, m in (("packed_mask", packed_mask), ("mask", mask)):
            if m is not None and not isinstance(m, torch.Tensor):
                raise TypeError(f"{_OP}.plan: {name} must be a torch tensor; got {type(m).__module__}."
                                f"{type(m).__name__}")
        if packed_mask is not None:  # wins over mask, as in the batch wrappers
            if packed_mask.dtype != torch.uint8:
                raise ValueError(f"{_OP}.plan: packed_mask must be uint8 (bits packed little-endian); got "
                                 f"{packed_mask.dtype}")
            need = -(-nnz * R * C // 8)
            if packed_mask.numel() < need:
                raise ValueError(f"{_OP}.plan: packed_mask must hold ceil(nnz * R * C / 8) = {need} bytes; got "
                                 f"{packed_mask.numel()}")
            shifts = torch.arange(8, device=packed_mask.device, dtype=torch.uint8)
            bits = (packed_mask.reshape(-1)[:need, None] >> shifts) & 1
            mask = bits.reshape(-1)[:nnz * R * C].bool()
        if mask.dtype != torch.bool:
            raise ValueError(f"{_OP}.plan: mask must be bool; got {mask.dtype}")
        if mask.numel() != nnz * R * C:
            raise ValueError(f"{_OP}.plan: mask must be [nnz, R, C] = [{nnz}, {R}, {C}]; got shape {tuple(mask.shape)}")
        rows = np.diff(qo_h)
        kv = blocks * C
        seg = np.zeros(rows.size + 1, np.int64)
        np.cumsum(rows * kv, out=seg[1:])
        row_of_block = np.repeat(np.arange(rows.size), blocks)  # each block's block row
        col0 = (np.arange(nnz) - np.repeat(indptr_h[:-1], blocks)) * C
        dev = mask.device
        base = torch.from_numpy(seg[row_of_block] + col0).to(dev)  # [nnz]: row 0, column 0 of the block
        stride = torch.from_numpy(kv[row_of_block]).to(dev)  # [nnz]: the block row's row length
        r = torch.arange(R, device=dev)
        pos = base[:, None, None] + r[None, :, None] * stride[:, None, None] + torch.arange(C, device=dev)[None, None, :]
        keep = (r[None, :] < torch.from_numpy(rows[row_of_block]).to(dev)[:, None])[:, :, None].expand(nnz, R, C)
        out = torch.zeros(int(seg[-1]), dtype=torch.bool, device=dev)
        out[pos[keep]] = mask.reshape(nnz, R, C)[keep]
        return out

    def run(self, q, k, v, scale_q=None, scale_k=None, scale_v=None, out=None, lse=None, return_lse: bool = False,
            enable_pdl: Optional[bool] = None):
        """o ``[M, num_qo_heads, head_dim]`` (o_data_type), and with ``return_lse`` (or into a
        given ``lse``) the base-2 LSE ``[M, num_qo_heads]`` as ``(o, lse)``. ``k`` / ``v``
        ``[N, num_kv_heads, head_dim]`` (a view of C-key blocks, no copy when their rows are
        evenly strided)."""
        if self._planned is None:
            raise RuntimeError(f"{_OP}.run: call plan() first")
        if scale_q is not None or scale_k is not None or scale_v is not None:
            raise NotImplementedError(f"{_OP}.run: per-head scale_q / scale_k / scale_v (fp8 q) are not supported")
        M, N, R, C, hkv, d = self._planned
        for name, x in (("k", k), ("v", v)):
            if len(x.shape) != 3 or tuple(int(s) for s in x.shape) != (N, hkv, d):
                raise ValueError(f"{_OP}.run: {name} must be [N, num_kv_heads, head_dim] = [{N}, {hkv}, {d}] as "
                                 f"planned; got {tuple(x.shape)}")
        cache = (k.reshape(N // C, C, hkv, d), v.reshape(N // C, C, hkv, d))
        return self._inner.run(q, cache, out=out, lse=lse, return_lse=return_lse, enable_pdl=enable_pdl)

    def forward(self, q, k, v, scale_q=None, scale_k=None, scale_v=None, pos_encoding_mode: str = "NONE",
                use_fp16_qk_reduction: bool = False, logits_soft_cap: Optional[float] = None,
                sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                rope_theta: Optional[float] = None):
        """Deprecated: sets these options (they replace the planned ones; causal stays), then ``run``."""
        if self._planned is None:
            raise RuntimeError(f"{_OP}.forward: call plan() first")
        inner = self._inner
        inner._set_options(inner._causal, pos_encoding_mode, use_fp16_qk_reduction, -1, logits_soft_cap, sm_scale,
                           rope_scale, rope_theta)
        return self.run(q, k, v, scale_q, scale_k, scale_v)
