"""torch custom ops over flashinfer calls, so that torch.compile traces each as one graph node
(``fullgraph=True``; ``mode="reduce-overhead"`` captures it in a CUDA graph like any op). Imported
only when torch is loaded (flashinfer/decode.py): importing flashinfer never imports torch.

The ops run the same code as an eager call; their fake (meta) functions give the output shapes.
"""

from typing import Optional, Tuple

import torch

from . import decode, prefill


@torch.library.custom_op("flashinfer::single_decode_with_kv_cache", mutates_args=())
def single_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layout: str, pos_encoding_mode: str,
                  use_tensor_cores: bool, q_scale: Optional[float], k_scale: Optional[float],
                  v_scale: Optional[float], window_left: int, logits_soft_cap: Optional[float],
                  sm_scale: Optional[float], rope_scale: Optional[float], rope_theta: Optional[float],
                  return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    out = decode._single_decode(q, k, v, kv_layout, pos_encoding_mode, use_tensor_cores, q_scale, k_scale, v_scale,
                                window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta, return_lse)
    if return_lse:
        return out
    return out, q.new_empty((0,), dtype=torch.float32)  # (an op returns a fixed number of tensors)


@single_decode.register_fake
def _(q, k, v, kv_layout, pos_encoding_mode, use_tensor_cores, q_scale, k_scale, v_scale, window_left,
      logits_soft_cap, sm_scale, rope_scale, rope_theta, return_lse):
    return torch.empty_like(q), q.new_empty((q.shape[0] if return_lse else 0,), dtype=torch.float32)


@torch.library.custom_op("flashinfer::single_prefill_with_kv_cache", mutates_args=())
def single_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, custom_mask: Optional[torch.Tensor],
                   packed_custom_mask: Optional[torch.Tensor], causal: bool, kv_layout: str, pos_encoding_mode: str,
                   sm_scale: Optional[float], window_left: int, logits_soft_cap: Optional[float],
                   rope_scale: Optional[float], rope_theta: Optional[float], backend: str, return_lse: bool,
                   k_scale: Optional[float], v_scale: Optional[float],
                   o_dtype: Optional[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    out = prefill._single_prefill(q, k, v, None, None, None, o_dtype, custom_mask, packed_custom_mask, causal,
                                  kv_layout, pos_encoding_mode, False, sm_scale, window_left, logits_soft_cap,
                                  rope_scale, rope_theta, backend, return_lse, None, k_scale, v_scale)
    if return_lse:
        return out
    return out, q.new_empty((0,), dtype=torch.float32)


@single_prefill.register_fake
def _(q, k, v, custom_mask, packed_custom_mask, causal, kv_layout, pos_encoding_mode, sm_scale, window_left,
      logits_soft_cap, rope_scale, rope_theta, backend, return_lse, k_scale, v_scale, o_dtype):
    dt = q.dtype if o_dtype is None else getattr(torch, o_dtype)
    o = q.new_empty((q.shape[0], q.shape[1], v.shape[-1]), dtype=dt)
    return o, q.new_empty((q.shape[0], q.shape[1]) if return_lse else (0,), dtype=torch.float32)
