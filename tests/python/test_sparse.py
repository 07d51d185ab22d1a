"""BlockSparseAttentionWrapper (spec §8.2).

GPU: random BSR problems (R, C in {1, 4, 16}, M, N in {64, 128, 256} and ragged M, heads 1 / 4 / 16
q over 1 / 4 KV, head_dim 128 / 256, intra-block mask on / off, packed or not) against the
float64 reference over the dense mask the BSR describes (reference_prefill.prefill_ref with
``mask``), and against ``single_prefill_with_kv_cache(custom_mask=dense)`` as FlashInfer's tests
do (atol 1e-2, rtol 1e-3). Also causal (bottom-right per block row over that row's gathered
keys, checked block row by block row), bf16 with the float16 default output, preallocated
out / lse, empty block rows (o 0, lse -inf) and the deprecated forward.

CPU: the composition end to end with the batch prefill kernel emulated in float64
(test_batch_prefill's ``emulated`` fixture), and every argument check.
"""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
flashinfer = pytest.importorskip("flashinfer", reason="flashinfer (with its bindings) is not importable",
                                 exc_type=ImportError)

from reference_prefill import assert_prefill_close, assert_prefill_lse_close, prefill_ref  # noqa: E402
from test_batch_prefill import emulated  # noqa: E402,F401  (a fixture: the batch prefill kernel in float64)

CUDA, CPU = "cuda", "cpu"
H, B = torch.float16, torch.bfloat16
gpu = pytest.mark.gpu
BSR = flashinfer.BlockSparseAttentionWrapper


class Problem:
    """A random BSR problem: ``M x N`` with R x C blocks, each block row keeping a random subset
    of block columns (density ``density``; ``empty`` block rows keep none), and with
    ``intra`` a random [nnz, R, C] mask inside the kept blocks."""

    def __init__(self, M, N, R, C, hq, hkv, d, dtype=H, *, density=0.5, intra=False, empty=(), dev=CUDA, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.M, self.N, self.R, self.C, self.hq, self.hkv, self.d = M, N, R, C, hq, hkv, d
        mb, nb = -(-M // R), N // C
        keep = torch.rand(mb, nb, generator=g) < density
        for i in empty:
            keep[i] = False
        self.block_keep = keep
        self.indptr = torch.zeros(mb + 1, dtype=torch.int32)
        self.indptr[1:] = torch.cumsum(keep.sum(1), 0)
        self.indices = torch.cat([torch.nonzero(keep[i]).flatten() for i in range(mb)]).int() if mb else \
            torch.zeros(0, dtype=torch.int32)
        self.nnz = int(self.indptr[-1])
        self.mask = (torch.rand(self.nnz, R, C, generator=g) < 0.7) if intra else None
        self.q = torch.randn(M, hq, d, generator=g).to(dtype).to(dev)
        self.k = torch.randn(N, hkv, d, generator=g).to(dtype).to(dev)
        self.v = torch.randn(N, hkv, d, generator=g).to(dtype).to(dev)
        self.dev = dev

    def dense(self):
        """The [M, N] bool mask the BSR describes."""
        mb = self.indptr.numel() - 1
        full = torch.zeros(mb * self.R, self.N, dtype=torch.bool)
        for i in range(mb):
            for p in range(int(self.indptr[i]), int(self.indptr[i + 1])):
                j = int(self.indices[p])
                blk = self.mask[p] if self.mask is not None else torch.ones(self.R, self.C, dtype=torch.bool)
                full[i * self.R:(i + 1) * self.R, j * self.C:(j + 1) * self.C] = blk
        return full[:self.M]

    def plan(self, w, *, packed=False, **kw):
        mask_kw = {}
        if self.mask is not None:
            if packed:
                bits = np.packbits(self.mask.reshape(-1).numpy(), bitorder="little")
                mask_kw["packed_mask"] = torch.from_numpy(bits).to(self.dev)
            else:
                mask_kw["mask"] = self.mask.to(self.dev)
        w.plan(self.indptr.to(self.dev), self.indices.to(self.dev), self.M, self.N, self.R, self.C, self.hq,
               self.hkv, self.d, **mask_kw, **kw)

    def ref(self, causal=False, **kw):
        """float64 (o, lse): the dense mask; causal: block row by block row over its gathered keys."""
        if not causal or self.mask is not None:  # (a custom mask replaces causal, as in the batch wrappers)
            return prefill_ref(self.q, self.k, self.v, mask=self.dense().to(self.q.device), **kw)
        o = torch.zeros(self.M, self.hq, self.d, dtype=torch.float64, device=self.q.device)
        lse = torch.full((self.M, self.hq), -float("inf"), dtype=torch.float64, device=self.q.device)
        for i in range(self.indptr.numel() - 1):
            cols = self.indices[int(self.indptr[i]):int(self.indptr[i + 1])].tolist()
            if not cols:
                continue
            rows = slice(i * self.R, min((i + 1) * self.R, self.M))
            keys = torch.cat([torch.arange(j * self.C, (j + 1) * self.C) for j in cols]).to(self.q.device)
            o[rows], lse[rows] = prefill_ref(self.q[rows], self.k[keys], self.v[keys], causal=True, **kw)
        return o, lse


def workspace(dev=CUDA):
    return torch.empty(32 << 20, dtype=torch.uint8, device=dev)


def check(o, lse, ref_o, ref_lse, rel=1e-2):
    empty = torch.isinf(ref_lse)
    assert_prefill_close(o, ref_o, rel=rel, atol=1e-3, empty_rows=empty)
    assert_prefill_lse_close(lse, ref_lse, tol=2e-3)


# ---- GPU ----

GRID = [  # M, N, R, C, hq, hkv, d, intra
    (64, 64, 1, 1, 1, 1, 128, False), (128, 256, 4, 4, 4, 1, 128, True), (256, 128, 16, 16, 16, 4, 128, False),
    (128, 128, 16, 1, 4, 4, 256, True), (256, 256, 1, 16, 16, 4, 256, True), (64, 256, 4, 16, 16, 16, 128, True),
    (100, 128, 16, 4, 4, 1, 128, True), (37, 64, 4, 16, 16, 4, 256, False),
]


@gpu
@pytest.mark.parametrize("case", GRID, ids=lambda c: "M{}N{}R{}C{}h{}-{}d{}{}".format(*c[:7], "m" if c[7] else ""))
@pytest.mark.parametrize("dtype", [H, B], ids=["f16", "bf16"])
def test_bsr_against_dense_reference(case, dtype):
    M, N, R, C, hq, hkv, d, intra = case
    pb = Problem(M, N, R, C, hq, hkv, d, dtype, intra=intra, seed=M + N + R + C + d)
    w = BSR(workspace())
    pb.plan(w, q_data_type=dtype, kv_data_type=dtype)
    o, lse = w.run(pb.q, pb.k, pb.v, return_lse=True)
    assert o.dtype == H, "o_data_type defaults to float16 whatever q's dtype"
    check(o, lse, *pb.ref())
    # as FlashInfer's test: against single prefill with the dense mask (atol 1e-2, rtol 1e-3)
    dense = pb.dense().to(CUDA)
    want = flashinfer.single_prefill_with_kv_cache(pb.q, pb.k, pb.v, custom_mask=dense)
    rows = dense.any(1)  # rows with no key: FlashInfer's single prefill is not specified there
    torch.testing.assert_close(o[rows].float(), want[rows].float(), atol=1e-2, rtol=1e-3)


@gpu
@pytest.mark.parametrize("packed", [False, True], ids=["mask", "packed"])
def test_bsr_masks_causal_and_outputs(packed):
    pb = Problem(200, 256, 16, 16, 8, 2, 128, H, intra=True, empty=(3,), seed=7)
    w = BSR(workspace())
    pb.plan(w, packed=packed, o_data_type=H)
    out = torch.empty(200, 8, 128, dtype=H, device=CUDA)
    lse = torch.empty(200, 8, dtype=torch.float32, device=CUDA)
    o, lse2 = w.run(pb.q, pb.k, pb.v, out=out, lse=lse, return_lse=True)
    assert o.data_ptr() == out.data_ptr() and lse2.data_ptr() == lse.data_ptr()
    ref_o, ref_lse = pb.ref()
    assert bool(torch.isinf(ref_lse[48:64]).all()), "block row 3 is empty"
    check(o, lse, ref_o, ref_lse)


@gpu
@pytest.mark.parametrize("R,C", [(16, 16), (4, 1), (1, 4)])
def test_bsr_causal_per_block_row(R, C):
    pb = Problem(128, 256, R, C, 4, 2, 128, B, density=0.6, seed=R * 10 + C)
    w = BSR(workspace())
    pb.plan(w, causal=True, q_data_type=B, o_data_type=B, logits_soft_cap=30.0)
    o, lse = w.run(pb.q, pb.k, pb.v, return_lse=True)
    assert o.dtype == B
    check(o, lse, *pb.ref(causal=True, soft_cap=30.0))


@gpu
def test_bsr_numpy_mask_is_a_type_error_naming_it():
    pb = Problem(64, 128, 4, 4, 4, 4, 128, H, intra=True, seed=5)
    w = BSR(workspace())
    args = (pb.indptr.to(CUDA), pb.indices.to(CUDA), pb.M, pb.N, pb.R, pb.C, pb.hq, pb.hkv, pb.d)
    with pytest.raises(TypeError, match="plan: mask must be a torch tensor; got numpy.ndarray"):
        w.plan(*args, mask=pb.mask.numpy())
    with pytest.raises(TypeError, match="plan: packed_mask must be a torch tensor; got numpy.ndarray"):
        w.plan(*args, packed_mask=np.packbits(pb.mask.reshape(-1).numpy(), bitorder="little"))


@gpu
def test_bsr_forward_and_sm_scale():
    pb = Problem(64, 128, 4, 4, 4, 4, 128, H, seed=3)
    w = BSR(workspace())
    pb.plan(w, sm_scale=0.05)
    o = w.run(pb.q, pb.k, pb.v)
    assert_prefill_close(o, pb.ref(sm_scale=0.05)[0])
    o2 = w.forward(pb.q, pb.k, pb.v, sm_scale=0.1)
    assert_prefill_close(o2, pb.ref(sm_scale=0.1)[0])


# ---- CPU: the composition with the kernel emulated ----

@pytest.mark.parametrize("case", [(40, 64, 16, 8, False, False), (33, 48, 4, 16, True, False),
                                  (64, 64, 1, 4, True, True), (20, 32, 8, 1, False, True)],
                         ids=["plain", "mask", "packed", "causal"])
def test_emulated_bsr(emulated, case):  # noqa: F811 (the fixture)
    M, N, R, C, intra, packed_or_causal = case
    causal = packed_or_causal and not intra
    pb = Problem(M, N, R, C, 4, 2, 64, H, intra=intra, empty=(1,), dev=CPU, seed=M)
    w = BSR(workspace(CPU))
    pb.plan(w, packed=packed_or_causal and intra, causal=causal)
    o, lse = w.run(pb.q, pb.k, pb.v, return_lse=True)
    assert emulated.calls == 1 and o.dtype == H
    check(o, lse, *pb.ref(causal=causal))
    # the batch the wrapper planned: one request per block row, pages = block columns
    inner = w._inner
    rows = [min(i * R, M) for i in range(-(-M // R) + 1)]
    assert inner._qo_indptr_buf.tolist() == rows
    assert inner._paged_kv_indptr_buf.tolist() == pb.indptr.tolist()
    assert inner._paged_kv_indices_buf.tolist() == pb.indices.tolist()
    assert inner._page_size == C


def test_signatures():
    plan = inspect.signature(BSR.plan).parameters
    assert list(plan)[1:10] == ["indptr", "indices", "M", "N", "R", "C", "num_qo_heads", "num_kv_heads", "head_dim"]
    assert plan["o_data_type"].default == "float16" and plan["q_data_type"].default == "float16"
    assert plan["causal"].default is False and plan["non_blocking"].default is True
    run = inspect.signature(BSR.run).parameters
    assert list(run)[1:7] == ["q", "k", "v", "scale_q", "scale_k", "scale_v"]
    assert run["return_lse"].default is False
    assert BSR.begin_forward is BSR.plan
    assert flashinfer.sparse.BlockSparseAttentionWrapper is BSR and "BlockSparseAttentionWrapper" in flashinfer.__all__


def test_plan_and_run_checks(emulated):  # noqa: F811 (the fixture)
    pb = Problem(32, 64, 8, 16, 4, 2, 64, H, dev=CPU)
    w = BSR(workspace(CPU))
    with pytest.raises(RuntimeError, match="plan"):
        w.run(pb.q, pb.k, pb.v)
    args = (pb.indptr, pb.indices, 32, 64, 8, 16, 4, 2, 64)
    with pytest.raises(ValueError, match="multiple of the block column size"):
        w.plan(pb.indptr, pb.indices, 32, 60, 8, 16, 4, 2, 64)
    with pytest.raises(ValueError, match=r"ceil\(M / R\) \+ 1 = 5"):
        w.plan(pb.indptr[:-1], pb.indices, 32, 64, 8, 16, 4, 2, 64)
    bad = pb.indices.clone()
    if bad.numel():
        bad[0] = 4
        with pytest.raises(ValueError, match=r"\[0, N / C = 4\)"):
            w.plan(pb.indptr, bad, 32, 64, 8, 16, 4, 2, 64)
    with pytest.raises(ValueError, match="indptr\\[-1\\]"):
        w.plan(pb.indptr, torch.cat([pb.indices, pb.indices[:1]]), 32, 64, 8, 16, 4, 2, 64)
    for name in ("block_mask", "kv_block_lens", "q2k_indices", "kv_splits", "q_scale"):
        with pytest.raises(NotImplementedError, match=name):
            w.plan(*args, **{name: torch.zeros(1)})
    with pytest.raises(ValueError, match=r"mask must be \[nnz, R, C\]"):
        w.plan(*args, mask=torch.ones(pb.nnz + 1, 8, 16, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask must be bool"):
        w.plan(*args, mask=torch.ones(pb.nnz, 8, 16))
    with pytest.raises(ValueError, match="packed_mask must be uint8"):
        w.plan(*args, packed_mask=torch.ones(pb.nnz * 16, dtype=torch.int32))
    with pytest.raises(ValueError, match="head_dim"):
        w.plan(pb.indptr, pb.indices, 32, 64, 8, 16, 4, 2, 96)
    w.plan(*args)
    with pytest.raises(ValueError, match=r"k must be \[N, num_kv_heads, head_dim\]"):
        w.run(pb.q, pb.k[:48], pb.v)
    with pytest.raises(NotImplementedError, match="scale_q"):
        w.run(pb.q, pb.k, pb.v, torch.ones(4))
    with pytest.raises(ValueError, match="q.shape"):
        w.run(pb.q[:31], pb.k, pb.v)
