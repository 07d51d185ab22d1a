"""Host time (median us per call) of the RoPE, append and decode entry points, next to the
bare launch and their raw binding calls, on the GPU machine (see host_overhead.py)."""

import numpy as np
import torch

import flashinfer
from flashinfer import _cuda, _rope

from host_overhead import med_us


def main():
    dev = "cuda"
    bf = torch.bfloat16
    dl = torch._C._to_dlpack
    s = torch._C._cuda_getCurrentRawStream(0)
    q = torch.randn(1, 32, 128, dtype=bf, device=dev)
    k = torch.randn(1, 8, 128, dtype=bf, device=dev)
    pos = torch.zeros(1, dtype=torch.int32, device=dev)
    cache = torch.randn(4096, 128, dtype=torch.float32, device=dev)
    # append: 1 token into a 16-page cache
    kc = torch.zeros(16, 16, 8, 128, dtype=bf, device=dev)
    vc = torch.zeros_like(kc)
    ak, av = torch.randn(1, 8, 128, dtype=bf, device=dev), torch.randn(1, 8, 128, dtype=bf, device=dev)
    bi = torch.zeros(1, dtype=torch.int32, device=dev)
    kv_ind = torch.arange(16, dtype=torch.int32, device=dev)
    kv_indptr = torch.tensor([0, 16], dtype=torch.int32, device=dev)
    kv_last = torch.tensor([16], dtype=torch.int32, device=dev)
    # decode: batch 1 x 4096, 32/8 heads
    ps, L = 16, 4096
    kpg = torch.randn(L // ps, ps, 8, 128, dtype=bf, device=dev)
    vpg = torch.randn_like(kpg)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
    w.plan(torch.tensor([0, L // ps], dtype=torch.int32), torch.arange(L // ps, dtype=torch.int32),
           torch.tensor([ps], dtype=torch.int32), 32, 8, 128, ps, q_data_type=bf)
    qd = torch.randn(1, 32, 128, dtype=bf, device=dev)
    od = torch.empty_like(qd)
    rows = [
        ("_cuda.launch_empty(s) (bare launch)", lambda: _cuda.launch_empty(s)),
        ("apply_rope_pos_ids_inplace (1 token)", lambda: flashinfer.apply_rope_pos_ids_inplace(q, k, pos)),
        ("apply_rope_pos_ids (1 token)", lambda: flashinfer.apply_rope_pos_ids(q, k, pos)),
        ("apply_rope_with_cos_sin_cache_inplace", lambda: flashinfer.apply_rope_with_cos_sin_cache_inplace(
            pos, q.view(1, -1), k.view(1, -1), 128, cache)),
        ("2 x torch.empty_like", lambda: (torch.empty_like(q), torch.empty_like(k))),
        ("append_paged_kv_cache (1 token)", lambda: flashinfer.append_paged_kv_cache(
            ak, av, bi, pos, (kc, vc), kv_ind, kv_indptr, kv_last)),
        ("decode run(q, kv, out=o)", lambda: w.run(qd, (kpg, vpg), out=od)),
        ("decode run(q, kv)", lambda: w.run(qd, (kpg, vpg))),
        ("torch.empty_like(qd)", lambda: torch.empty_like(qd)),
    ]
    print(f"{'host call':<42} {'median us':>9}")
    for name, fn in rows:
        print(f"{name:<42} {med_us(fn, n=5000):9.2f}")


if __name__ == "__main__":
    main()
