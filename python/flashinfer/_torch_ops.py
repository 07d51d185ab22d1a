"""torch custom ops over flashinfer calls, so that torch.compile traces each as one graph node
(``fullgraph=True``; ``mode="reduce-overhead"`` captures it in a CUDA graph like any op). Imported
only when torch is loaded (flashinfer/decode.py): importing flashinfer never imports torch.

The ops run the same code as an eager call; their fake (meta) functions give the output shapes.
"""

from typing import Optional, Tuple

import torch

from . import decode


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
