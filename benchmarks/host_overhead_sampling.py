"""Where the host time of one sampling call goes, on the GPU machine: median microseconds per
call (batches of 50 with a sync between) for the pieces of the short Python path (allocation,
generator update, DLPack exports, the binding) and for whole calls, general and short path."""

import torch

import flashinfer.sampling as fs
from flashinfer import _cuda, _sampling

from host_overhead import med_us  # (run from benchmarks/)


def main():
    p = torch.softmax(torch.randn(1, 128256, device="cuda"), -1)
    out = torch.empty(1, dtype=torch.int32, device="cuda")
    gen = torch.cuda.default_generators[0]
    dl = torch._C._to_dlpack
    s = torch._C._cuda_getCurrentRawStream(0)
    k = torch.full((1,), 50, dtype=torch.int32, device="cuda")
    tp = torch.full((1,), 0.9, device="cuda")
    p0 = torch.empty(0, 128256, device="cuda")
    out0 = torch.empty(0, dtype=torch.int32, device="cuda")
    p64 = torch.softmax(torch.randn(64, 128256, device="cuda"), -1)
    out64 = torch.empty(64, dtype=torch.int32, device="cuda")

    def gen_update():
        seed, off = gen.initial_seed(), gen.get_offset()
        gen.set_offset(off + 32)

    dev = p.device
    rows = [
        ("p.device", lambda: p.device),
        ("p.get_device()", lambda: p.get_device()),
        ("gen.initial_seed()", lambda: gen.initial_seed()),
        ("gen.get_offset()", lambda: gen.get_offset()),
        ("gen.set_offset(gen.get_offset())", lambda: gen.set_offset(gen.get_offset())),
        ("torch.empty((1,), dtype, device=dev) (dev cached)", lambda: torch.empty((1,), dtype=torch.int32, device=dev)),
        ("torch.empty(1, dtype, device=0)", lambda: torch.empty(1, dtype=torch.int32, device=0)),
        ("raw stream query", lambda: s and torch._C._cuda_getCurrentRawStream(0)),
        ("p.new_empty((1,), dtype=int32)", lambda: p.new_empty((1,), dtype=torch.int32)),
        ("torch.empty(1, dtype, device=p.device)", lambda: torch.empty(1, dtype=torch.int32, device=p.device)),
        ("generator seed/offset update", gen_update),
        ("2 x _to_dlpack", lambda: (dl(p), dl(out))),
        ("_cuda.probe_tensors(p0, out0, out0) (import only)", lambda: _cuda.probe_tensors(dl(p0), dl(out0), dl(out0))),
        ("_sampling.sample_probs direct, 0 rows (no launch)",
         lambda: _sampling.sample_probs("x", dl(p0), dl(out0), 8, None, 50, None, 0.9, None, 0.0, 1, 0, -1, s)),
        ("_sampling.sample_probs direct, 64 rows (one-block kernel)",
         lambda: _sampling.sample_probs("x", dl(p64), dl(out64), 8, None, 50, None, 0.9, None, 0.0, 1, 0, -1, s)),
        ("_cuda.launch_empty(s)", lambda: _cuda.launch_empty(s)),
        ("_sampling.sample_probs direct (top-k/top-p)",
         lambda: _sampling.sample_probs("x", dl(p), dl(out), 8, None, 50, None, 0.9, None, 0.0, 1, 0, -1, s)),
        ("sampling_from_probs(p)", lambda: fs.sampling_from_probs(p)),
        ("top_p_sampling_from_probs(p, 0.9)", lambda: fs.top_p_sampling_from_probs(p, 0.9)),
        ("min_p_sampling_from_probs(p, 0.1)", lambda: fs.min_p_sampling_from_probs(p, 0.1)),
        ("top_k_sampling_from_probs(p, 50)", lambda: fs.top_k_sampling_from_probs(p, 50)),
        ("top_k_top_p_sampling_from_probs(p, 50, 0.9)", lambda: fs.top_k_top_p_sampling_from_probs(p, 50, 0.9)),
        ("  ... per-row int32 / float32 tensors", lambda: fs.top_k_top_p_sampling_from_probs(p, k, tp)),
        ("  ... seed=, offset= (general path)", lambda: fs.top_k_top_p_sampling_from_probs(p, 50, 0.9, seed=1, offset=0)),
    ]
    print(f"{'host call':<46} {'median us':>9}")
    for name, fn in rows:
        print(f"{name:<46} {med_us(fn):9.2f}")
    # Does the launch path (cluster vs one block) or the GPU time set the host time? The same
    # call at 1 row (cluster kernel by default), forced onto the one-block kernel, and at 64 rows.
    p1 = torch.softmax(torch.randn(1, 128256, device="cuda"), -1)
    with fs._force_cluster(1):
        print(f"{'top_p(p, 0.9), 1 row, one-block kernel':<46} {med_us(lambda: fs.top_p_sampling_from_probs(p1, 0.9)):9.2f}")
    print(f"{'top_p(p, 0.9), 1 row, cluster kernel':<46} {med_us(lambda: fs.top_p_sampling_from_probs(p1, 0.9)):9.2f}")
    print(f"{'top_p(p, 0.9), 64 rows':<46} {med_us(lambda: fs.top_p_sampling_from_probs(p64, 0.9)):9.2f}")
    print(f"{'sampling_from_probs(p), 64 rows':<46} {med_us(lambda: fs.sampling_from_probs(p64)):9.2f}")


if __name__ == "__main__":
    main()
