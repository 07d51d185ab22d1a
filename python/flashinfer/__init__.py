"""flashinfer: attention, sampling, normalization and activation kernels for LLM serving,
with FlashInfer's Python API. Importing it touches no CUDA API (the CUDA runtime is linked
statically into the extension modules), so it imports on machines without a GPU."""

__version__ = "0.7.2"

from . import activation, cascade, decode, mla, norm, page, prefill, quantization, rope, sampling, sparse, topk, utils
from .activation import *  # noqa: F401,F403 (each module's __all__ is its public API)
from .cascade import *  # noqa: F401,F403
from .decode import *  # noqa: F401,F403
from .mla import *  # noqa: F401,F403
from .norm import *  # noqa: F401,F403
from .page import *  # noqa: F401,F403
from .prefill import *  # noqa: F401,F403
from .quantization import *  # noqa: F401,F403
from .rope import *  # noqa: F401,F403
from .sampling import *  # noqa: F401,F403
from .sparse import *  # noqa: F401,F403
from .topk import *  # noqa: F401,F403

__all__ = ["__version__", "activation", "cascade", "decode", "mla", "norm", "page", "prefill", "quantization", "rope",
           "sampling", "sparse", "topk", "utils"]
for _m in (activation, cascade, decode, mla, norm, page, prefill, quantization, rope, sampling, sparse, topk):
    __all__ += _m.__all__
del _m
