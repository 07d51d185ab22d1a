"""flashinfer: attention, sampling, normalization and activation kernels for LLM serving,
with FlashInfer's Python API. Importing it touches no CUDA API (the CUDA runtime is linked
statically into the extension modules), so it imports on machines without a GPU."""

__version__ = "0.7.2"

from . import activation, decode, norm, utils
from .activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul
from .decode import (
    BatchDecodeWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    fast_decode_plan,
    single_decode_with_kv_cache,
)
from .norm import fused_add_rmsnorm, gemma_fused_add_rmsnorm, gemma_rmsnorm, layernorm, rmsnorm
from . import page, rope
from . import cascade
from .cascade import merge_state, merge_state_in_place, merge_states
from .page import append_paged_kv_cache, get_batch_indices_positions, get_seq_lens
from . import sampling, topk
from .topk import TopKTieBreak, top_k
from .sampling import (
    chain_speculative_sampling,
    min_p_sampling_from_probs,
    sampling_from_logits,
    sampling_from_probs,
    softmax,
    top_k_mask_logits,
    top_k_renorm_prob,
    top_k_renorm_probs,
    top_k_sampling_from_probs,
    top_k_top_p_sampling_from_logits,
    top_k_top_p_sampling_from_probs,
    top_p_renorm_prob,
    top_p_renorm_probs,
    top_p_sampling_from_probs,
)
from .rope import (
    apply_llama31_rope,
    apply_llama31_rope_inplace,
    apply_llama31_rope_pos_ids,
    apply_llama31_rope_pos_ids_inplace,
    apply_rope,
    apply_rope_inplace,
    apply_rope_pos_ids,
    apply_rope_pos_ids_inplace,
    apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
)

__all__ = [
    "__version__",
    "activation",
    "decode",
    "single_decode_with_kv_cache",
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "fast_decode_plan",
    "norm",
    "utils",
    "rmsnorm",
    "fused_add_rmsnorm",
    "gemma_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "layernorm",
    "silu_and_mul",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "page",
    "rope",
    "append_paged_kv_cache",
    "get_batch_indices_positions",
    "get_seq_lens",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "cascade",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "sampling",
    "softmax",
    "sampling_from_logits",
    "sampling_from_probs",
    "top_p_sampling_from_probs",
    "top_k_sampling_from_probs",
    "min_p_sampling_from_probs",
    "top_k_top_p_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_p_renorm_probs",
    "top_p_renorm_prob",
    "top_k_renorm_probs",
    "top_k_renorm_prob",
    "top_k_mask_logits",
    "chain_speculative_sampling",
    "topk",
    "top_k",
    "TopKTieBreak",
]
