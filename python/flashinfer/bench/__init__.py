"""``python -m flashinfer.bench`` / ``flashinfer-bench``: the project's benchmark CLI.

Per case: GPU time (CUDA events around the op alone, L2 flushed before every rep, the host's
enqueue hidden behind a GPU sleep), host enqueue time per Python call, achieved TB/s or
TFLOP/s, the fraction of the measured H200 ceiling that binds (the larger of bandwidth / copy
ceiling and TFLOP/s / matmul ceiling), and the speed-up over PyTorch.
"""

from .timing import COPY_CEILING_GBPS, MATMUL_CEILING_TFLOPS, ceiling_fraction  # noqa: F401
