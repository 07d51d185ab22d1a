"""Host enqueue time of BatchPrefillWithRaggedKVCacheWrapper.run() (1 request x 64 rows x 16384
keys, 32 / 8 heads x 128, causal) with split-KV and without (disable_split_kv), and of a two-level
MultiLevelCascadeAttentionWrapper.run() (64 x 1 row, prefix 32768 + 256): each batch of calls is
queued behind a GPU sleep, so no launch waits for a full queue. Median us per call."""
import statistics
import time

import torch

import flashinfer


def timed(fn, batches=40, per_batch=20):
    fn()
    torch.cuda.synchronize()
    xs = []
    for _ in range(batches):
        torch.cuda._sleep(20_000_000)  # (~10 ms of GPU time ahead of the batch)
        for _ in range(per_batch):
            t0 = time.perf_counter()
            fn()
            xs.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(xs)


def ragged(split):
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    i32 = dict(dtype=torch.int32, device="cuda")
    w.plan(torch.tensor([0, 64], **i32), torch.tensor([0, 16384], **i32), 32, 8, 128, causal=True,
           q_data_type=torch.bfloat16, disable_split_kv=not split)
    q = torch.randn(64, 32, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(16384, 8, 128, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    return w._num_chunks, timed(lambda: w.run(q, k, v))


def cascade():
    b, kv, sfx, ps = 64, 32768, 256, 16
    pre, per = kv // ps, sfx // ps
    cache = torch.randn(pre + b * per, 2, ps, 8, 128, dtype=torch.bfloat16, device="cuda")
    i32 = dict(dtype=torch.int32, device="cuda")
    perm = torch.randperm(pre + b * per, device="cuda").int()
    w = flashinfer.MultiLevelCascadeAttentionWrapper(2, torch.empty(128 << 20, dtype=torch.uint8, device="cuda"))
    w.plan([torch.tensor([0, b], **i32), torch.arange(b + 1, **i32)],
           [torch.tensor([0, pre], **i32), torch.arange(b + 1, **i32) * per],
           [perm[:pre].contiguous(), perm[pre:].contiguous()],
           [torch.tensor([ps], **i32), torch.full((b,), ps, **i32)], 32, 8, 128, ps, causal=True,
           q_data_type=torch.bfloat16)
    q = torch.randn(b, 32, 128, dtype=torch.bfloat16, device="cuda")
    return timed(lambda: w.run(q, cache))


if __name__ == "__main__":
    for split in (False, True, False, True):
        chunks, us = ragged(split)
        print(f"ragged 1 x 64 x 16384 chunks={chunks}: {us:.2f} us host per run()")
    print(f"cascade 64 x 1, prefix 32768 + 256: {cascade():.2f} us host per run()")
