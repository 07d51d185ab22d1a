"""flashinfer: attention, sampling, normalization and activation kernels for LLM serving,
with FlashInfer's Python API. Importing it touches no CUDA API (the CUDA runtime is linked
statically into the extension modules), so it imports on machines without a GPU."""

__version__ = "0.7.2"

from . import activation, norm, utils
from .activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul
from .norm import fused_add_rmsnorm, gemma_fused_add_rmsnorm, gemma_rmsnorm, layernorm, rmsnorm

__all__ = [
    "__version__",
    "activation",
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
]
