"""Where the host time of one flashinfer call goes, on the GPU machine: median microseconds
per call (each call timed alone, batches of 50 with a sync between batches) for the pieces
(bare launch, DLPack export, stream query, allocation) and for whole calls."""

import statistics
import time

import torch

import flashinfer
from flashinfer import _cuda, _ext, _norm, _rope


def med_us(fn, n=20000, batch=50):
    fn()
    torch.cuda.synchronize()
    xs = []
    pc = time.perf_counter
    for _ in range(n // batch):
        for _ in range(batch):
            t0 = pc()
            fn()
            xs.append(pc() - t0)
        torch.cuda.synchronize()
    return statistics.median(xs) * 1e6


def main():
    x = torch.randn(1, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    o = torch.empty_like(x)
    r = torch.randn_like(x)
    a = torch.randn(1, 2 * 4096, dtype=torch.bfloat16, device="cuda")
    ao = torch.empty(1, 4096, dtype=torch.bfloat16, device="cuda")
    dl = torch._C._to_dlpack
    s = torch._C._cuda_getCurrentRawStream(0)
    q = torch.randn(1, 32, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(1, 8, 128, dtype=torch.bfloat16, device="cuda")
    pos = torch.zeros(1, dtype=torch.int32, device="cuda")
    cache = torch.randn(4096, 128, dtype=torch.float32, device="cuda")
    qf, kf = q.flatten(1), k.flatten(1)
    rows = [
        ("empty lambda", lambda: None),
        ("_cuda.launch_empty(s) (bare launch)", lambda: _cuda.launch_empty(s)),
        ("_cuda.launch_empty(s, pdl=True)", lambda: _cuda.launch_empty(s, True)),
        ("_cuda.launch_empty(s, path=1) (<<<>>>)", lambda: _cuda.launch_empty(s, False, 1)),
        ("_cuda.launch_empty(s, path=2) (driver cuLaunchKernelEx)", lambda: _cuda.launch_empty(s, False, 2)),
        ("_cuda.launch_empty(s, True, path=2) (driver, pdl)", lambda: _cuda.launch_empty(s, True, 2)),
        ("_cuda.launch_empty(s, True, path=3) (1 KiB of parameters, pdl)", lambda: _cuda.launch_empty(s, True, 3)),
        ("torch._C._to_dlpack(x)", lambda: dl(x)),
        ("3 x _to_dlpack", lambda: (dl(x), dl(w), dl(o))),
        ("_cuda.probe_tensors(3 capsules) (import, no launch)", lambda: _cuda.probe_tensors(dl(x), dl(w), dl(o))),
        ("_cuda.probe_tensors(3 tensors) (exchange table, no launch)", lambda: _cuda.probe_tensors(x, w, o)),
        ("_cuda.probe_ints(3 x data_ptr()) (no launch)",
         lambda: _cuda.probe_ints(x.data_ptr(), w.data_ptr(), o.data_ptr())),
        ("x.data_ptr()", lambda: x.data_ptr()),
        ("x.stride()", lambda: x.stride()),
        ("x.shape", lambda: x.shape),
        ("x.dtype is torch.bfloat16", lambda: x.dtype is torch.bfloat16),
        ("framework_of(x).stream(x)", lambda: _ext.framework_of(x).stream(x)),
        ("torch.empty_like(x)", lambda: torch.empty_like(x)),
        ("torch.empty(shape, dtype, device)", lambda: torch.empty((1, 4096), dtype=x.dtype, device=x.device)),
        ("x.new_empty(shape)", lambda: x.new_empty((1, 4096))),
        ("_norm.rmsnorm(3 capsules) direct", lambda: _norm.rmsnorm(dl(x), dl(w), dl(o), 1e-6, s, True)),
        ("_norm.rmsnorm(3 tensors) direct", lambda: _norm.rmsnorm(x, w, o, 1e-6, s, True)),
        ("rmsnorm(x, w, out=o)", lambda: flashinfer.rmsnorm(x, w, out=o)),
        ("rmsnorm(x, w, out=o, enable_pdl=False)", lambda: flashinfer.rmsnorm(x, w, out=o, enable_pdl=False)),
        ("rmsnorm(x, w)", lambda: flashinfer.rmsnorm(x, w)),
        ("fused_add_rmsnorm(x, r, w)", lambda: flashinfer.fused_add_rmsnorm(x, r, w)),
        ("silu_and_mul(a, out=ao)", lambda: flashinfer.silu_and_mul(a, out=ao)),
        ("silu_and_mul(a)", lambda: flashinfer.silu_and_mul(a)),
        ("apply_rope_pos_ids_inplace(q, k, pos) 1 token", lambda: flashinfer.apply_rope_pos_ids_inplace(q, k, pos)),
        ("apply_rope_pos_ids(q, k, pos)", lambda: flashinfer.apply_rope_pos_ids(q, k, pos)),
        ("apply_rope_with_cos_sin_cache_inplace", lambda: flashinfer.apply_rope_with_cos_sin_cache_inplace(
            pos, qf, kf, 128, cache, True)),
        ("_rope.apply_rope direct, in place", lambda: _rope.apply_rope(
            "apply_rope_pos_ids_inplace", dl(q), dl(k), None, None, dl(pos), None, None, None, False, 1.0, 1e4, False,
            1.0, 4.0, 8192.0, s, None)),
        ("torch F.rms_norm (reference)", lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-6)),
    ]
    i32 = dict(dtype=torch.int32, device="cuda")
    kc, vc = (torch.zeros(256, 16, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    ak, av = torch.randn(1, 8, 128, dtype=torch.bfloat16, device="cuda"), torch.randn_like(k)
    bi, ps = torch.zeros(1, **i32), torch.full((1,), 4095, **i32)
    ind, ptr, last = torch.arange(256, **i32), torch.tensor([0, 256], **i32), torch.tensor([16], **i32)
    rows += [("append_paged_kv_cache 1 token", lambda: flashinfer.append_paged_kv_cache(
        ak, av, bi, ps, (kc, vc), ind, ptr, last))]
    wrapper, dq, dcache, dout = decode_case()
    rows += [("decode run(q, cache) 1 x 4096", lambda: wrapper.run(dq, dcache)),
             ("decode run(q, cache, out=o)", lambda: wrapper.run(dq, dcache, out=dout))]
    print(f"torch tensors reach the bindings through DLPack's C exchange table: "
          f"{_cuda.takes_exchange_api(torch.Tensor)}")
    print(f"{'host call':<42} {'median us':>9}")
    for name, fn in rows:
        print(f"{name:<42} {med_us(fn):9.2f}")
    # An A/B of the three routes in one process, interleaved per row (two rounds, each route in
    # turn; host time drifts within a run, so sections timed one after the other do not compare):
    # direct (the tensors as they are, FRAMEWORK_STREAM: the default with the exchange table);
    # general (_ext.export_args: each tensor through its framework's exporter, here the identity,
    # and the stream through its query; the route of calls that mix frameworks); capsule
    # (torch._C._to_dlpack and the stream asked in Python: the route without the exchange table).
    fw = _ext.framework_of(x)
    table_route, table_stream = fw.to_dlpack, fw.__dict__.get("stream")
    table_raw, direct = wrapper._raw_stream, fw.direct

    def route(kind):  # (not `k`: the rope rows' lambdas close over main's k)
        fw.direct = wrapper._direct = direct and kind == "direct"
        capsule = kind == "capsule"
        fw.to_dlpack = wrapper._to_dlpack = torch._C._to_dlpack if capsule else table_route
        wrapper._raw_stream = torch._C._cuda_getCurrentRawStream if capsule else table_raw
        fw.__dict__.pop("stream", None)
        if table_stream is not None and not capsule:
            fw.stream = table_stream  # (capsule: the class's Python query)

    kinds = ("direct", "general", "capsule")
    print(f"-- routes, interleaved, median us (round 1 / round 2): {' | '.join(kinds)}")
    for name, fn in rows:
        if name.startswith(("rmsnorm", "fused_add", "silu", "apply_rope", "append", "decode")):
            t = {kind: [] for kind in kinds}
            for _ in range(2):
                for kind in kinds:
                    route(kind)
                    t[kind].append(med_us(fn, n=5000))
            print(f"{name:<42} " + " | ".join(f"{t[kind][0]:6.2f} / {t[kind][1]:6.2f}" for kind in kinds))
    route("direct")


def decode_case():
    """A planned BatchDecodeWithPagedKVCacheWrapper: 1 request x 4096 keys, 32 / 8 heads x 128,
    page 16, bf16, tensor cores (the bench's goal shape)."""
    i32 = dict(dtype=torch.int32, device="cuda")
    pages = 4096 // 16
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"),
                                                      "NHD", use_tensor_cores=True)
    w.plan(torch.tensor([0, pages], **i32), torch.arange(pages, **i32), torch.tensor([16], **i32), 32, 8, 128, 16,
           q_data_type=torch.bfloat16)
    q = torch.randn(1, 32, 128, dtype=torch.bfloat16, device="cuda")
    cache = torch.randn(pages, 2, 16, 8, 128, dtype=torch.bfloat16, device="cuda")
    return w, q, cache, torch.empty_like(q)


if __name__ == "__main__":
    main()
