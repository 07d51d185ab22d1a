"""flashinfer.mla.BatchMLAPagedAttentionWrapper (spec §8.1): DeepSeek MLA with matrix absorption.

GPU: results against the float64 reference (reference_mla.mla_ref) over a grid modeled on
FlashInfer's test_deepseek_mla, not its full cross product: every value of every axis appears
(batch {1, 3, 17, 157}, kv_len {0, 1, 17, 512, 3000, 8736}, qo_len {1, 2, 17} and ragged qo
lengths, heads {16, 64, 128}, page_size {1, 16, 32}, head_dim_kpe {64, 0}, causal on / off,
fp16 / bf16) and the risky combinations are crossed (empty requests, causal rows above the
diagonal, 128 heads x 17 tokens, page_size 1 x long KV, no kpe x causal); preallocated out / lse,
base-e LSE, CUDA-graph capture / re-plan / replay, tail slots and unowned pages full of NaN,
surplus pages, caches and q as views of one buffer, no host sync and no allocation in run (given out /
lse), CuPy.

CPU (no GPU needed): the signatures and module surface, every argument check, the reference
against reference_prefill, and the wrapper's host side end to end (plan's lengths and last-page
lengths, index copies, work items, CUDA-graph buffers and padding, LSE base, outputs) with
``_prefill.mla_run`` emulated in float64 from its binding contract (``mla_kernel`` fixture).
"""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
flashinfer = pytest.importorskip("flashinfer", reason="flashinfer (with its _prefill binding) is not importable",
                                 exc_type=ImportError)

import flashinfer.mla as fmla  # noqa: E402
import flashinfer.prefill as fprefill  # noqa: E402
from reference_mla import mla_one, mla_ref, request_kv  # noqa: E402
from reference_page import make_page_table  # noqa: E402
from reference_prefill import prefill_ref  # noqa: E402
from test_batch_prefill import _cpu_ws, _from_dl, check, emulated, indptr_of, workspace  # noqa: E402,F401 (a fixture)

CUDA, CPU = "cuda", "cpu"
B, H = torch.bfloat16, torch.float16
gpu = pytest.mark.gpu
MLA = flashinfer.mla.BatchMLAPagedAttentionWrapper
SM_SCALE = 1.0 / math.sqrt(192)  # FlashInfer's tests: the head dim before matrix absorption
I32 = torch.int32


class MLABatch:
    """One batch's inputs: q_nope / q_pe, the caches with each request's pages in random order
    among ``spare_pages`` pages nobody owns, and the plan's arguments. ``surplus[b]`` extra pages
    past request b's keys (kv_len < (pages - 1) * page_size + 1 is allowed)."""

    def __init__(self, qo_lens, kv_lens, heads, page_size, kpe, dtype, dev=CUDA, spare_pages=3, surplus=None):
        self.qo_lens, self.kv_lens = list(qo_lens), list(kv_lens)
        self.heads, self.page_size, self.kpe, self.dtype = heads, page_size, kpe, dtype
        surplus = surplus or [0] * len(kv_lens)
        table = make_page_table([kv + s * page_size for kv, s in zip(kv_lens, surplus)], page_size, CPU, spare_pages)
        self.kv_indptr, self.kv_indices = table.indptr.tolist(), table.indices.tolist()
        self.qo_indptr = indptr_of(qo_lens)
        n, pages = self.qo_indptr[-1], table.num_pages
        self.q_nope = torch.randn(n, heads, 512, dtype=dtype, device=dev)
        self.q_pe = torch.randn(n, heads, kpe, dtype=dtype, device=dev) if kpe else None
        self.ckv = torch.randn(pages, page_size, 512, dtype=dtype, device=dev)
        self.kpe_cache = torch.randn(pages, page_size, kpe, dtype=dtype, device=dev) if kpe else None

    def plan_args(self, dev=None):
        dev = self.q_nope.device if dev is None else dev
        t = lambda x: torch.tensor(x, dtype=I32, device=dev)  # noqa: E731
        return (t(self.qo_indptr), t(self.kv_indptr), t(self.kv_indices), t(self.kv_lens), self.heads, 512, self.kpe,
                self.page_size)

    def plan(self, w, causal, dev=None, **kw):
        w.plan(*self.plan_args(dev), causal, SM_SCALE, self.dtype, self.dtype, **kw)

    def run_args(self):
        return self.q_nope, self.q_pe, self.ckv, self.kpe_cache

    def ref(self, causal):
        return mla_ref(self.q_nope, self.q_pe, self.ckv, self.kpe_cache, self.qo_indptr, self.kv_indptr,
                       self.kv_indices, self.kv_lens, causal, SM_SCALE)

    def check_run(self, causal):
        """A fresh wrapper on q's device: plan, run with the LSE, compare with the reference."""
        w = MLA(workspace(self.q_nope.device.type))
        self.plan(w, causal)
        o, lse = w.run(*self.run_args(), return_lse=True)
        assert o.shape == (self.qo_indptr[-1], self.heads, 512) and o.dtype == self.dtype
        check(o, lse, *self.ref(causal))
        return w

    def fill_unused(self, value):
        """Every cache slot that holds no key of the plan (tails of last pages, surplus and unowned
        pages) set to ``value``."""
        used = torch.zeros(self.ckv.shape[:2], dtype=torch.bool)
        for b, kv in enumerate(self.kv_lens):
            pages = torch.tensor(self.kv_indices[self.kv_indptr[b]:self.kv_indptr[b + 1]], dtype=torch.long)
            used.view(-1)[(pages[:, None] * self.page_size + torch.arange(self.page_size)).view(-1)[:kv]] = True
        for c in (self.ckv, self.kpe_cache):
            if c is not None:
                c[~used.to(c.device)] = value


# ==================================================================================================
# GPU: the grid
# ==================================================================================================

MIX17 = [0, 1, 17, 512, 3000, 1, 17, 512, 0, 33, 3000, 17, 1, 512, 96, 97, 64]
QMIX17 = [1, 2, 17, 0, 1, 17, 2, 1, 17, 2, 1, 1, 17, 2, 0, 1, 17]
MIX157 = [(1, 17, 512, 33, 0, 128, 97, 3000)[i % 8] if i % 31 else 600 for i in range(157)]

# (batch kv_lens, qo_len (int, or per-request list), heads, page_size, head_dim_kpe, causal, dtype)
CASES = [
    ([512], 1, 16, 1, 64, False, B),
    ([512], 17, 128, 32, 64, True, H),
    ([8736], 1, 128, 16, 64, False, B),  # long decode
    ([8736], 17, 64, 1, 0, True, B),  # long, page_size 1, no kpe
    ([0], 2, 16, 16, 64, True, H),  # no keys at all
    ([1], 17, 64, 16, 64, True, B),  # causal with qo_len > kv_len: 16 rows see no key
    ([17, 0, 3000], 1, 128, 1, 64, True, B),
    ([17, 0, 3000], 2, 16, 16, 0, False, H),
    ([1, 512, 17], 17, 64, 32, 64, True, H),
    ([3000, 1, 512], 17, 128, 16, 0, True, B),
    ([512, 17, 0], 2, 64, 1, 64, False, B),
    (MIX17, 1, 128, 16, 64, False, B),
    (MIX17, 1, 16, 32, 0, True, H),
    (MIX17, 2, 64, 1, 64, True, B),
    (MIX17, 17, 16, 16, 64, True, H),
    (MIX17, 17, 128, 32, 64, False, B),
    (MIX17, 2, 128, 16, 0, True, B),
    (MIX17, QMIX17, 64, 16, 64, True, B),  # ragged qo lengths, empty query blocks
    (MIX17, QMIX17, 128, 1, 0, False, H),
    (MIX157, 1, 128, 16, 64, False, B),
    (MIX157, 1, 16, 1, 64, True, H),
    (MIX157, 2, 64, 32, 0, True, B),
]


def _case_id(c):
    kv, qo, heads, ps, kpe, causal, dt = c
    q = "qmix" if isinstance(qo, list) else f"q{qo}"
    return (f"b{len(kv)}-kv{max(kv)}-{q}-h{heads}-ps{ps}-kpe{kpe}-{'causal' if causal else 'full'}-"
            f"{'bf16' if dt == B else 'fp16'}")


def _qo_lens(kv, qo):
    return qo if isinstance(qo, list) else [qo] * len(kv)


@gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_mla(case):
    kv, qo, heads, ps, kpe, causal, dtype = case
    MLABatch(_qo_lens(kv, qo), kv, heads, ps, kpe, dtype).check_run(causal)


@gpu
@pytest.mark.parametrize("batch,kv,kpe,causal", [(1, [4096], 64, False), (2, [4096, 300], 0, True),
                                                 (16, [2000] * 15 + [0], 64, True)])
def test_split_kv(batch, kv, kpe, causal):
    """Decode batches too small to fill the SMs: plan cuts the keys into chunks (split-KV) and the
    merged result matches the reference; with a float workspace too small for the partial states,
    fewer chunks (here none) give the same answer."""
    bt = MLABatch([1] * batch, kv, 128, 16, kpe, B)
    w = bt.check_run(causal)
    assert w._num_chunks > 1
    small = MLA(torch.empty(4096, dtype=torch.uint8, device=CUDA))
    bt.plan(small, causal)
    assert small._num_chunks == 1
    o, lse = small.run(*bt.run_args(), return_lse=True)
    check(o, lse, *bt.ref(causal))


@gpu
def test_smoke_flashinfer_example():
    """FlashInfer's docstring example shape (decode, 128 heads, page_size 1), index arrays on the host."""
    bt = MLABatch([1] * 6, [999, 1, 64, 0, 300, 17], 128, 1, 64, B)
    w = MLA(workspace(), backend="fa2")
    bt.plan(w, False, dev=CPU)
    o = w.run(*bt.run_args(), return_lse=False)
    check(o, None, *bt.ref(False))


@gpu
@pytest.mark.parametrize("kpe", [64, 0])
def test_preallocated_outputs_and_lse_base(kpe):
    bt = MLABatch([1, 17, 2], [97, 512, 0], 64, 16, kpe, H)
    w = MLA(workspace())
    bt.plan(w, True)
    ref_o, ref_lse = bt.ref(True)
    n = sum(bt.qo_lens)
    out = torch.empty(n, 64, 512, dtype=H, device=CUDA)
    lse = torch.empty(n, 64, dtype=torch.float32, device=CUDA)
    o2, lse2 = w.run(*bt.run_args(), out=out, lse=lse, return_lse=True)
    assert o2 is out and lse2 is lse
    check(out, lse, ref_o, ref_lse)
    lse.fill_(0)
    out2 = w.run(*bt.run_args(), lse=lse)  # a given lse is written without return_lse
    assert torch.is_tensor(out2) and torch.equal(out2, out)
    check(out2, lse, ref_o, ref_lse)
    o_e, lse_e = w.run(*bt.run_args(), return_lse=True, return_lse_base_on_e=True)
    assert torch.equal(o_e, out)
    check(o_e, lse_e, ref_o, ref_lse * math.log(2.0), " (base e)")
    if kpe == 0:  # FlashInfer passes empty q_pe / kpe_cache
        e = w.run(bt.q_nope, bt.q_nope[..., :0], bt.ckv, bt.ckv[..., :0])
        assert torch.equal(e, out)


@gpu
@pytest.mark.parametrize("kpe", [64, 0])
def test_cuda_graph_replan_and_replay(kpe):
    """FlashInfer's flow: plan with empty KV, warm up, capture run, then re-plan with new lengths and
    page tables (same batch size and query rows) and replay: the new plan's results."""
    batch, heads, ps, dtype = 4, 64, 16, B
    qo_plans = [[1, 2, 17, 1], [17, 1, 1, 2]]
    kv_plans = [[512, 0, 3000, 17], [1, 3000, 17, 512]]
    bufs = dict(qo_indptr=torch.empty(batch + 1, dtype=I32, device=CUDA),
                kv_indptr=torch.empty(batch + 1, dtype=I32, device=CUDA),
                kv_indices=torch.empty(4096, dtype=I32, device=CUDA), kv_len_arr=torch.empty(batch, dtype=I32,
                                                                                             device=CUDA))
    w = MLA(workspace(), True, **bufs)
    assert w.is_cuda_graph_enabled and w._fixed_batch_size == batch
    batches = [MLABatch(qo, kv, heads, ps, kpe, dtype, spare_pages=20) for qo, kv in zip(qo_plans, kv_plans)]
    P = max(bt.ckv.shape[0] for bt in batches)
    ckv = torch.zeros(P, ps, 512, dtype=dtype, device=CUDA)
    kpe_cache = torch.zeros(P, ps, kpe, dtype=dtype, device=CUDA) if kpe else None
    n = 21
    q_nope = torch.zeros(n, heads, 512, dtype=dtype, device=CUDA)
    q_pe = torch.zeros(n, heads, kpe, dtype=dtype, device=CUDA) if kpe else None
    warm = MLABatch(qo_plans[0], [0] * batch, heads, ps, kpe, dtype)
    warm.plan(w, True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            w.run(q_nope, q_pe, ckv, kpe_cache, return_lse=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = w.run(q_nope, q_pe, ckv, kpe_cache, return_lse=True)
    for bt in batches:
        q_nope.copy_(bt.q_nope)
        ckv.zero_()
        ckv[:bt.ckv.shape[0]].copy_(bt.ckv)
        if kpe:
            q_pe.copy_(bt.q_pe)
            kpe_cache.zero_()
            kpe_cache[:bt.kpe_cache.shape[0]].copy_(bt.kpe_cache)
        bt.plan(w, True)
        assert bufs["kv_len_arr"].tolist() == bt.kv_lens and bufs["kv_indptr"].tolist() == bt.kv_indptr
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        bt.ckv, bt.kpe_cache = ckv, kpe_cache
        check(out, lse, *bt.ref(True), f" ({bt.qo_lens}, {bt.kv_lens})")
        eager, eager_lse = w.run(q_nope, q_pe, ckv, kpe_cache, return_lse=True)
        assert torch.equal(eager, out) and torch.equal(eager_lse, lse)
    with pytest.raises(ValueError, match="cannot exceed"):
        MLABatch([17, 17, 1, 1], [1] * 4, heads, ps, kpe, dtype).plan(w, True)
    with pytest.raises(ValueError, match="batch size"):
        MLABatch([1] * 3, [1] * 3, heads, ps, kpe, dtype).plan(w, True)


@gpu
@pytest.mark.parametrize("ps,causal", [(16, True), (32, False), (1, True)])
def test_unused_slots_are_never_read(ps, causal):
    """NaN in every slot that holds no key (last pages' tails, unowned pages): o and lse stay
    finite and right (FlashInfer's test_batch_mla_oob_kv_nan)."""
    bt = MLABatch([3, 17, 7, 1], [17, 33, 197, 75], 16, ps, 64, H, spare_pages=4)
    bt.fill_unused(float("nan"))
    bt.check_run(causal)


@gpu
def test_surplus_pages():
    """kv_len_arr shorter than the pages given (the rest of the pages unused, even whole pages):
    last_page_len = kv_len - (pages - 1) * page_size may be <= 0; the keys are the first kv_len."""
    bt = MLABatch([2, 1, 17, 1], [17, 0, 40, 16], 64, 16, 64, B, surplus=[2, 1, 1, 0])
    bt.fill_unused(float("nan"))
    bt.check_run(True)


@gpu
@pytest.mark.parametrize("kpe", [64, 0])
def test_views_of_one_buffer(kpe):
    """The caches as views of one [pages, page_size, 576] buffer (as engines store them), q_nope /
    q_pe as views of one [n, heads, 576] buffer: strided rows."""
    bt = MLABatch([1, 17, 2], [300, 17, 1000], 16, 16, 64, B)
    w = MLA(workspace())
    bt.plan(w, False)
    q_all = torch.cat([bt.q_nope, bt.q_pe], -1)
    kv_all = torch.cat([bt.ckv, bt.kpe_cache], -1)
    if kpe == 0:
        bt.q_pe = bt.kpe_cache = None
        bt.kpe = 0
        bt.plan(w, False)
    q_nope, ckv = q_all[..., :512], kv_all[..., :512]
    q_pe, kpe_cache = (q_all[..., 512:], kv_all[..., 512:]) if kpe else (None, None)
    assert not q_nope.is_contiguous() and not ckv.is_contiguous()
    o, lse = w.run(q_nope, q_pe, ckv, kpe_cache, return_lse=True)
    check(o, lse, *bt.ref(False))


@gpu
@pytest.mark.parametrize("kpe", [64, 0])
def test_run_neither_syncs_nor_allocates(kpe):
    bt = MLABatch([1] * 8, [4096] * 8, 128, 16, kpe, B)
    w = MLA(workspace())
    bt.plan(w, False)
    out = torch.empty(8, 128, 512, dtype=B, device=CUDA)
    lse = torch.empty(8, 128, dtype=torch.float32, device=CUDA)
    w.run(*bt.run_args(), out=out, lse=lse)  # warm-up
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    torch.cuda.set_sync_debug_mode("error")
    try:
        w.run(*bt.run_args(), out=out, lse=lse, return_lse_base_on_e=True)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    allocated = torch.cuda.memory_stats()["allocation.all.allocated"] - before
    assert allocated == 0, f"run allocated {allocated} blocks (out and lse were given)"


@gpu
def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    bt = MLABatch([1, 17], [512, 97], 16, 16, 64, H)
    w = MLA(workspace())
    bt.plan(w, True)
    args = [cupy.from_dlpack(x) for x in bt.run_args()]
    o, lse = w.run(*args, return_lse=True)
    assert isinstance(o, cupy.ndarray) and isinstance(lse, cupy.ndarray)
    cupy.cuda.get_current_stream().synchronize()
    check(torch.from_dlpack(o), torch.from_dlpack(lse), *bt.ref(True))


@gpu
def test_checks_on_device():
    bt = MLABatch([1, 2], [17, 40], 16, 16, 64, B)
    ws = workspace()
    w = MLA(ws)
    bt.plan(w, True)
    with pytest.raises(ValueError, match="pages"):
        w.run(bt.q_nope, bt.q_pe, bt.ckv[:1], bt.kpe_cache[:1])
    with pytest.raises(ValueError, match="device"):
        w.run(*bt.run_args(), out=torch.empty(3, 16, 512, dtype=B))
    bufs = dict(qo_indptr=torch.empty(3, dtype=I32, device=CUDA), kv_indptr=torch.empty(3, dtype=I32, device=CUDA),
                kv_indices=torch.empty(2, dtype=I32, device=CUDA), kv_len_arr=torch.empty(2, dtype=I32, device=CUDA))
    with pytest.raises(ValueError, match="int32"):
        MLA(ws, True, **{**bufs, "kv_len_arr": torch.empty(2, device=CUDA)})
    g = MLA(ws, True, **bufs)
    with pytest.raises(ValueError, match="exceeds the allocated buffer"):
        bt.plan(g, True)


# ==================================================================================================
# CPU: signatures, module surface, constructor checks, the reference
# ==================================================================================================

E = inspect.Parameter.empty


def _params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


def test_signatures_match_the_spec():
    assert _params(MLA.__init__) == [
        ("self", E), ("float_workspace_buffer", E), ("use_cuda_graph", False), ("qo_indptr", None), ("kv_indptr", None),
        ("kv_indices", None), ("kv_len_arr", None), ("backend", "auto")]
    assert _params(MLA.plan) == [
        ("self", E), ("qo_indptr", E), ("kv_indptr", E), ("kv_indices", E), ("kv_len_arr", E), ("num_heads", E),
        ("head_dim_ckv", E), ("head_dim_kpe", E), ("page_size", E), ("causal", E), ("sm_scale", E),
        ("q_data_type", E), ("kv_data_type", E), ("use_profiler", False)]
    assert _params(MLA.run) == [
        ("self", E), ("q_nope", E), ("q_pe", E), ("ckv_cache", E), ("kpe_cache", E), ("out", None), ("lse", None),
        ("return_lse", False), ("profiler_buffer", None), ("kv_len", None), ("page_table", None),
        ("return_lse_base_on_e", False), ("o_scale", None)]
    for fn in (MLA.__init__, MLA.plan, MLA.run):
        assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in inspect.signature(fn).parameters.values())


def test_module_surface():
    assert flashinfer.BatchMLAPagedAttentionWrapper is MLA and flashinfer.mla is fmla
    assert "mla" in flashinfer.__all__ and "BatchMLAPagedAttentionWrapper" in flashinfer.__all__
    assert fmla.__all__ == ["BatchMLAPagedAttentionWrapper"]
    for m in ("plan", "run", "reset_workspace_buffer", "is_cuda_graph_enabled", "resolved_backend"):
        assert hasattr(MLA, m), m


def test_constructor_checks():
    for backend in ("cutlass", "trtllm-gen", "cute-dsl", "FA2"):
        with pytest.raises(NotImplementedError, match="backend"):
            MLA(_cpu_ws(), backend=backend)
    with pytest.raises(ValueError, match="CUDA"):
        MLA(_cpu_ws())
    with pytest.raises(ValueError, match="CUDA"):
        MLA(_cpu_ws(), backend="fa3")


def _graph_bufs(batch=4, pages=64, **over):
    b = dict(qo_indptr=torch.empty(batch + 1, dtype=I32), kv_indptr=torch.empty(batch + 1, dtype=I32),
             kv_indices=torch.empty(pages, dtype=I32), kv_len_arr=torch.empty(batch, dtype=I32))
    b.update(over)
    return b


@pytest.mark.parametrize("missing", ["qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr"])
def test_cuda_graph_needs_its_buffers(missing):
    with pytest.raises(ValueError, match=missing):
        MLA(_cpu_ws(), True, **_graph_bufs(**{missing: None}))


@pytest.mark.parametrize("over,match", [
    ({"kv_indptr": torch.empty(4, dtype=I32)}, "kv_indptr"),
    ({"kv_len_arr": torch.empty(5, dtype=I32)}, "kv_len_arr"),
    ({"qo_indptr": torch.empty(2, 3, dtype=I32)}, "1-D"),
])
def test_cuda_graph_buffer_lengths(over, match):
    with pytest.raises(ValueError, match=match):
        MLA(_cpu_ws(), True, **_graph_bufs(**over))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("qo,kv", [(3, 5), (5, 3), (1, 7), (4, 0)])
def test_reference_matches_prefill_reference(qo, kv, causal):
    """MLA is one-KV-head attention with K = [ckv || kpe], V = ckv: mla_one against the prefill
    reference (a separate reading of the score definition)."""
    q = torch.randn(qo, 4, 24, dtype=torch.float64)
    k = torch.randn(kv, 24, dtype=torch.float64)
    v = k[:, :16]
    o, lse = mla_one(q, k, v, causal, 0.3)
    ref_o, ref_lse = prefill_ref(q, k[:, None], v[:, None], causal=causal, sm_scale=0.3)
    assert torch.allclose(o, ref_o, atol=1e-12) and torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert torch.allclose(lse[fin], ref_lse[fin], atol=1e-12)
    assert bool((o[~fin] == 0).all())


def test_request_kv_gathers_pages_in_order():
    ckv = torch.arange(5 * 4 * 2, dtype=torch.float64).view(5, 4, 2)
    kpe = -ckv[..., :1]
    k, v = request_kv(ckv, kpe, [3, 0, 4], 9)
    assert k.shape == (9, 3) and torch.equal(v, ckv[[3, 0, 4]].reshape(-1, 2)[:9])
    assert torch.equal(k[:, 2], -v[:, 0]) and torch.equal(v[4], ckv[0, 0]) and torch.equal(v[8], ckv[4, 0])


# ==================================================================================================
# CPU: the host side end to end, the kernel emulated from its binding contract
# ==================================================================================================

class MLAKernelEmulator:
    """_prefill.mla_run per its contract, in float64 (reference_mla per request): request b's keys
    are the first (pages - 1) * page_size + last_page_len[b] tokens of its pages (none without
    pages); it writes only the (token, head) rows of the given work items ((request, 64-row tile)
    pairs over rows token * num_heads + head; with num_chunks > 1 the tile field is tile *
    num_chunks + chunk and every chunk of a row tile must be there, once) and checks that each
    row is written exactly once (the merged result, when its chunk 0 item comes)."""

    def __init__(self):
        self.calls = 0
        self.launched_items = []
        self.chunks = []

    def __call__(self, q_nope, q_pe, ckv, kpe, out, lse, qo_indptr, kv_indptr, page_indices, last_page_len, items,
                 num_items, num_chunks, o_part, lse_part, page_size, causal, sm_scale, stream, pdl):
        q_nope, q_pe, ckv, kpe, out, lse = (_from_dl(x) for x in (q_nope, q_pe, ckv, kpe, out, lse))
        assert (q_pe is None) == (kpe is None)
        q = q_nope if q_pe is None else torch.cat([q_nope, q_pe], -1)
        qo_indptr, kv_indptr, page_indices, last_page_len, items = (
            _from_dl(x) for x in (qo_indptr, kv_indptr, page_indices, last_page_len, items))
        self.calls += 1
        for x in (qo_indptr, kv_indptr, page_indices, last_page_len, items):
            assert x.dtype == torch.int32 and x.dim() == 1
        assert isinstance(stream, int) and isinstance(pdl, bool) and isinstance(causal, bool)
        n, heads = q.shape[:2]
        assert q.shape[2] == 512 + (0 if kpe is None else kpe.shape[2]) and q.shape[2] in (512, 576)
        assert ckv.shape[1:] == (page_size, 512) and ckv.dtype == q.dtype
        assert out.shape == (n, heads, 512) and out.dtype == q.dtype
        assert lse is None or (lse.shape == (n, heads) and lse.dtype == torch.float32 and lse.is_contiguous())
        assert items.numel() >= 2 * num_items
        chunks = max(int(num_chunks), 1)
        self.chunks.append(chunks)
        if chunks > 1:  # the partial states' buffers
            o_part, lse_part = _from_dl(o_part), _from_dl(lse_part)
            assert o_part.dtype == q.dtype and o_part.numel() >= n * chunks * heads * 512
            assert lse_part.dtype == torch.float32 and lse_part.numel() >= n * (chunks + 1) * heads
        rows = fprefill._TILE_ROWS
        seen = {}
        written = torch.zeros(n, heads, dtype=torch.int32)
        per_request = {}
        it = items[:2 * num_items].view(-1, 2).tolist()
        self.launched_items.append(len(it))
        for b, t in it:
            t, c = divmod(t, chunks)
            seen[(b, t, c)] = seen.get((b, t, c), 0) + 1
            if c:
                continue  # (chunk 0 writes the merged rows)
            q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
            if t * rows >= (q1 - q0) * heads:
                continue  # a no-op (padding) item
            if b not in per_request:
                a, e = int(kv_indptr[b]), int(kv_indptr[b + 1])
                kv_len = (e - a - 1) * page_size + int(last_page_len[b]) if e > a else 0
                k, v = request_kv(ckv, kpe, page_indices[a:e].tolist(), kv_len)
                assert k.shape[0] == kv_len
                per_request[b] = mla_one(q[q0:q1], k, v, causal, sm_scale)
            o_b, lse_b = per_request[b]
            pr = torch.arange(t * rows, min((t + 1) * rows, (q1 - q0) * heads))
            tok, head = pr // heads, pr % heads
            out[q0 + tok, head] = o_b[tok, head].to(out.dtype)
            if lse is not None:
                lse[q0 + tok, head] = lse_b[tok, head].float()
            written[q0 + tok, head] += 1
        assert int(qo_indptr[-1]) == n
        assert bool((written == 1).all()), "every (token, head) row is written exactly once"
        for (b, t, c), k in seen.items():
            if t * rows < int(qo_indptr[b + 1] - qo_indptr[b]) * heads:
                assert k == 1 and all((b, t, cc) in seen for cc in range(chunks)), "every chunk of a tile once"


def _model_mla_plan(qo_lens, kv_lens, heads, num_sms, chunks):
    """A Python model of _prefill.mla_plan's contract: every 64-row tile of every request, longest
    KV first, cut into `chunks` items (tile * chunks + c) when chunks > 0, else as many as bring
    the items to num_sms (floor), at most max_kv / 256 and 64."""
    base = []
    for b in sorted(range(len(qo_lens)), key=lambda b: -kv_lens[b]):
        for t in reversed(range(-(-qo_lens[b] * heads // 64))):
            base.append((b, t))
    if chunks <= 0:  # (< 0: as if every request had many keys)
        n, max_kv = len(base), (1 << 40 if chunks < 0 else max(kv_lens, default=0))
        chunks = 1 if n == 0 else max(1, min(num_sms // n, max_kv // 256, 64))
    return [x for b, t in base for c in range(chunks) for x in (b, t * chunks + c)], chunks


_REAL_MLA_PLAN = hasattr(fmla._prefill, "mla_plan")


@pytest.mark.skipif(not _REAL_MLA_PLAN, reason="this build's _prefill has no mla_plan")
@pytest.mark.parametrize("heads", [16, 24, 128])
def test_mla_plan_matches_its_model(heads):
    """The binding's work items and chunk counts (the contract the wrapper and the emulator rely
    on): every row tile of every request once per chunk, nothing for a request without query
    rows; split-KV only while the items do not fill the SMs, chunks of >= 256 keys, <= 64."""
    for qo, kv in ((QMIX17, MIX17), ([1], [4096]), ([1] * 4, [300, 5000, 0, 17]), ([1], [100]), ([17] * 2, [9000] * 2)):
        for sms, forced in ((132, 0), (8, 0), (132, 3), (1000, 0), (132, -1)):
            items, chunks = fmla._prefill.mla_plan(qo, kv, heads, sms, forced)
            assert (items, chunks) == _model_mla_plan(qo, kv, heads, sms, forced)
            assert 1 <= chunks <= 64 and (forced <= 0 or chunks == forced)
    assert fmla._prefill.mla_plan([1], [4096], 128, 132, 0)[1] == 16  # 2 items: 66 wanted, 16 by keys
    assert fmla._prefill.mla_plan([1] * 16, [4096] * 16, 128, 132, 0)[1] == 4  # 32 items: 128 CTAs
    assert fmla._prefill.mla_plan([1] * 67, [4096] * 67, 128, 132, 0)[1] == 1
    assert fmla._prefill.mla_plan([1], [0], 128, 132, -1)[1] == 64  # (CUDA graphs: lengths ignored; capped)


@pytest.fixture
def mla_kernel(emulated, monkeypatch):
    """The wrapper on the CPU (test_batch_prefill's ``emulated``: CPU workspaces, no CUDA streams /
    events) with mla_run emulated; mla_plan is the binding's when built, else a model of its
    contract."""
    kernel = MLAKernelEmulator()
    mla_plan = fmla._prefill.mla_plan if _REAL_MLA_PLAN else _model_mla_plan
    monkeypatch.setattr(fmla, "_prefill", SimpleNamespace(mla_plan=mla_plan, mla_run=kernel))
    monkeypatch.setattr(fmla, "_num_sms", lambda device: 132)
    return kernel


def _cpu_batch(qo, kv, heads=16, ps=16, kpe=64, dtype=B, **kw):
    return MLABatch(qo, kv, heads, ps, kpe, dtype, dev=CPU, **kw)


EMU_CASES = [
    ([1, 17, 2], [97, 0, 40], 16, 16, 64, B, True),
    ([2, 1, 3, 1], [1, 33, 5, 64], 64, 1, 0, H, True),
    ([17], [17], 8, 32, 64, H, False),
    ([1, 0, 5, 1, 2], [0, 9, 40, 31, 7], 24, 5, 0, B, False),  # heads not dividing 64
]


@pytest.mark.parametrize("case", EMU_CASES, ids=lambda c: f"b{len(c[0])}-h{c[2]}-ps{c[3]}-kpe{c[4]}-c{int(c[6])}")
def test_emulated(mla_kernel, case):
    qo, kv, heads, ps, kpe, dtype, causal = case
    bt = _cpu_batch(qo, kv, heads, ps, kpe, dtype)
    w = bt.check_run(causal)
    assert mla_kernel.calls == 1
    # FlashInfer's attribute names, and the plan's device arrays
    assert w._qo_indptr_buf.tolist() == bt.qo_indptr and w._kv_indptr_buf.tolist() == bt.kv_indptr
    assert w._kv_indices_buf.tolist() == bt.kv_indices and w._kv_len_arr_buf.tolist() == bt.kv_lens
    last = [kv_ - (bt.kv_indptr[b + 1] - bt.kv_indptr[b] - 1) * ps if bt.kv_indptr[b + 1] > bt.kv_indptr[b] else 0
            for b, kv_ in enumerate(kv)]
    assert w._last_page_len.tolist() == last
    assert w._use_cuda_graph is False and w._causal is causal and w._page_size == ps and w._sm_scale == SM_SCALE
    for name in ("_float_workspace_buffer", "_int_workspace_buffer", "_pin_memory_int_workspace_buffer"):
        assert isinstance(getattr(w, name), torch.Tensor)
    if kpe == 0:  # FlashInfer passes empty q_pe / kpe_cache
        o2 = w.run(bt.q_nope, bt.q_nope[..., :0], bt.ckv, bt.ckv[..., :0])
        assert torch.equal(o2, w.run(*bt.run_args()))


def test_emulated_outputs_and_lse_base(mla_kernel):
    bt = _cpu_batch([1, 17, 2], [97, 33, 0])
    w = MLA(_cpu_ws())
    bt.plan(w, True)
    ref_o, ref_lse = bt.ref(True)
    out, lse = torch.empty(20, 16, 512, dtype=B), torch.zeros(20, 16)
    o = w.run(*bt.run_args(), out=out, lse=lse)
    assert o is out
    check(out, lse, ref_o, ref_lse)
    o_e, lse_e = w.run(*bt.run_args(), return_lse=True, return_lse_base_on_e=True)
    check(o_e, lse_e, ref_o, ref_lse * math.log(2.0))
    o3, lse3 = w.run(*bt.run_args(), lse=lse, return_lse=True)
    assert lse3 is lse and torch.equal(o3, out)
    assert w.run(*bt.run_args()).shape == (20, 16, 512)


def test_emulated_surplus_pages_use_last_page_len(mla_kernel):
    """Requests with more pages than their keys fill: the kernel sees last_page_len <= 0 and must
    take (pages - 1) * page_size + last_page_len keys (the emulator does; a plan that passed the
    page count instead would read the NaN slots)."""
    bt = _cpu_batch([2, 1, 3, 1], [17, 0, 40, 16], surplus=[2, 1, 1, 0])
    bt.fill_unused(float("nan"))
    w = bt.check_run(True)
    assert w._last_page_len.tolist() == [17 - 3 * 16, 0, 40 - 3 * 16, 16]  # 4, 1, 4, 1 pages


def test_emulated_index_arrays_on_any_device_and_tail(mla_kernel):
    """Index arrays as torch / NumPy / lists; kv_indices past kv_indptr[-1] are ignored."""
    bt = _cpu_batch([1, 2], [30, 17])
    w = MLA(_cpu_ws())
    qo, kv, idx, lens = bt.plan_args()[:4]
    w.plan(qo.numpy(), kv.tolist(), torch.cat([idx, torch.full((7,), -5, dtype=I32)]), lens, 16, 512, 64, 16, True,
           SM_SCALE, "bfloat16", torch.bfloat16)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    check(o, lse, *bt.ref(True))
    assert w._kv_indices_buf.tolist() == bt.kv_indices


def test_emulated_items_are_honored(mla_kernel, monkeypatch):
    """The emulator writes only the planned items' rows: a work-item list missing a tile fails."""
    bt = _cpu_batch([2, 17], [9, 40], heads=16)
    w = MLA(_cpu_ws())
    mla_plan = fmla._prefill.mla_plan

    def drop_one(*args):
        items, chunks = mla_plan(*args)
        return items[2:], chunks

    monkeypatch.setattr(fmla._prefill, "mla_plan", drop_one)
    bt.plan(w, False)
    with pytest.raises(AssertionError, match="exactly once"):
        w.run(*bt.run_args())


def test_emulated_cuda_graph_plans(mla_kernel):
    """Under CUDA graphs every plan writes the caller's four buffers and launches the same number
    of work items (padded with no-op items) from the same addresses."""
    batch, heads = 4, 64
    bufs = {k: v.fill_(-1) for k, v in _graph_bufs(batch, 300).items()}
    w = MLA(workspace("cpu"), True, **bufs)
    assert w._qo_indptr_buf is bufs["qo_indptr"] and w._kv_len_arr_buf is bufs["kv_len_arr"]
    plans = [([1, 2, 17, 1], [0, 0, 0, 0]), ([1, 2, 17, 1], [512, 0, 300, 17]), ([17, 1, 2, 1], [1, 300, 17, 512]),
             ([2, 1, 1, 17], [5, 6, 7, 8])]
    items_ptr = last_ptr = None
    for qo, kv in plans:
        bt = _cpu_batch(qo, kv, heads, 16, 64, B)
        bt.plan(w, True)
        assert bufs["qo_indptr"].tolist() == bt.qo_indptr and bufs["kv_indptr"].tolist() == bt.kv_indptr
        assert bufs["kv_indices"][:len(bt.kv_indices)].tolist() == bt.kv_indices
        assert bufs["kv_len_arr"].tolist() == kv
        assert w._qo_indptr_buf is bufs["qo_indptr"] and w._kv_indices_buf is bufs["kv_indices"]
        if items_ptr is None:
            items_ptr, last_ptr, n_items = w._items.data_ptr(), w._last_page_len.data_ptr(), w._num_items
            # 21 items of the first plan: 6 key chunks each bring them to 126 CTAs (split-KV, kept)
            assert w._num_chunks == 6 and n_items == (21 * heads + 63 * batch) // 64 * 6
        assert (w._items.data_ptr(), w._last_page_len.data_ptr(), w._num_items) == (items_ptr, last_ptr, n_items)
        o, lse = w.run(*bt.run_args(), return_lse=True)
        check(o, lse, *bt.ref(True))
    assert len(set(mla_kernel.launched_items)) == 1
    with pytest.raises(ValueError, match="cannot exceed"):
        _cpu_batch([17, 17, 1, 1], [1] * 4, heads).plan(w, True)
    with pytest.raises(ValueError, match="batch size"):
        _cpu_batch([1] * 3, [1] * 3, heads).plan(w, True)
    with pytest.raises(ValueError, match="exceeds the allocated buffer"):
        _cpu_batch([1] * 4, [2000] * 4, heads, ps=1).plan(w, True)


def _plan_kw(bt, **over):
    args = dict(zip(("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr", "num_heads", "head_dim_ckv",
                     "head_dim_kpe", "page_size"), bt.plan_args()))
    args.update(causal=True, sm_scale=SM_SCALE, q_data_type=bt.dtype, kv_data_type=bt.dtype)
    args.update(over)
    return args


@pytest.mark.parametrize("over,exc,match", [
    ({"head_dim_ckv": 256}, ValueError, "head_dim_ckv"),
    ({"head_dim_kpe": 32}, ValueError, "head_dim_kpe"),
    ({"num_heads": 0}, ValueError, "num_heads"),
    ({"page_size": 0}, ValueError, "page_size"),
    ({"sm_scale": None}, ValueError, "sm_scale"),
    ({"sm_scale": math.nan}, ValueError, "sm_scale"),
    ({"q_data_type": torch.float32}, ValueError, "q_data_type"),
    ({"q_data_type": None}, ValueError, "q_data_type"),
    ({"kv_data_type": torch.float16}, ValueError, "kv_data_type"),
    ({"kv_data_type": torch.float8_e4m3fn}, NotImplementedError, "fp8"),
    ({"use_profiler": True}, NotImplementedError, "use_profiler"),
    ({"kv_len_arr": torch.tensor([30, 33], dtype=I32)}, ValueError, r"kv_len_arr\[1\] = 33"),
    ({"kv_len_arr": torch.tensor([-1, 17], dtype=I32)}, ValueError, r"kv_len_arr\[0\]"),
    ({"kv_len_arr": torch.tensor([30], dtype=I32)}, ValueError, "kv_len_arr must have batch_size"),
    ({"kv_indptr": torch.tensor([0, 2], dtype=I32)}, ValueError, "length of kv_indptr"),
    ({"kv_indptr": torch.tensor([0, 3, 2], dtype=I32)}, ValueError, "nondecreasing"),
    ({"qo_indptr": torch.tensor([1, 2, 4], dtype=I32)}, ValueError, r"qo_indptr\[0\]"),
    ({"kv_indices": torch.tensor([0, 1], dtype=I32)}, ValueError, "len\\(kv_indices\\)"),
    ({"kv_indices": torch.tensor([0, -1, 2, 3], dtype=I32)}, ValueError, "kv_indices must be >= 0"),
    ({"kv_indices": torch.tensor([[0, 1, 2, 3]], dtype=I32)}, ValueError, "1-D"),
])
def test_plan_checks(mla_kernel, over, exc, match):
    bt = _cpu_batch([1, 2], [30, 17])  # pages 2 + 2 of 16
    w = MLA(_cpu_ws())
    with pytest.raises(exc, match=match):
        w.plan(**_plan_kw(bt, **over))


def test_run_checks(mla_kernel):
    bt = _cpu_batch([1, 2], [30, 17])
    w = MLA(_cpu_ws())
    with pytest.raises(RuntimeError, match="plan"):
        w.run(*bt.run_args())
    w.plan(**_plan_kw(bt))
    qn, qp, ckv, kpe = bt.run_args()
    bad = [
        ((qn.half(), qp, ckv, kpe), {}, ValueError, "The dtype of q_nope .* does not match the q_data_type"),
        ((qn, qp.half(), ckv, kpe), {}, ValueError, "The dtype of q_pe"),
        ((qn, qp, ckv.half(), kpe), {}, ValueError, "does not match the kv_data_type"),
        ((qn, qp, ckv, kpe.half()), {}, ValueError, "does not match the kv_data_type"),
        ((qn[:2], qp[:2], ckv, kpe), {}, ValueError, "q_nope must be"),
        ((qn[:, :8], qp, ckv, kpe), {}, ValueError, "q_nope must be"),
        ((qn, qp[..., :32], ckv, kpe), {}, ValueError, "q_pe must be"),
        ((qn, None, ckv, kpe), {}, ValueError, "q_pe is required"),
        ((qn, qp, ckv, None), {}, ValueError, "kpe_cache is required"),
        ((qn, qp, ckv[:, :8], kpe[:, :8]), {}, ValueError, "page_size"),
        ((qn, qp, ckv[..., :256], kpe), {}, ValueError, "ckv_cache must be"),
        ((qn, qp, ckv, kpe[..., :32]), {}, ValueError, "kpe_cache must be"),
        ((qn, qp, ckv, kpe[:3]), {}, ValueError, "pages"),
        ((qn, qp, ckv[:3], kpe[:3]), {}, ValueError, "pages"),
        ((qn, qp, ckv.view(-1, 512), kpe), {}, ValueError, "ckv_cache must be"),
        (bt.run_args(), {"out": torch.empty(3, 16, 512, dtype=H)}, ValueError, "Invalid dtype of out"),
        (bt.run_args(), {"out": torch.empty(3, 16, 256, dtype=B)}, ValueError, "Invalid shape of out"),
        (bt.run_args(), {"lse": torch.empty(3, 16, dtype=torch.float64)}, ValueError, "Invalid dtype of lse"),
        (bt.run_args(), {"lse": torch.empty(16, 3)}, ValueError, "Invalid shape of lse"),
        (bt.run_args(), {"lse": torch.empty(16, 3).t()}, ValueError, "contiguous"),
        (bt.run_args(), {"o_scale": 1.0}, NotImplementedError, "o_scale"),
    ]
    for args, kw, exc, match in bad:
        with pytest.raises(exc, match=match):
            w.run(*args, **kw)
    assert mla_kernel.calls == 0
    # the cutlass backend's kv_len / page_table and an unused profiler_buffer are ignored
    ref = w.run(*bt.run_args())
    other = w.run(*bt.run_args(), profiler_buffer=torch.empty(8), kv_len=torch.tensor([30, 17]),
                  page_table=torch.zeros(2, 2, dtype=I32))
    assert torch.equal(ref, other) and mla_kernel.calls == 2
    w.plan(**_plan_kw(bt, head_dim_kpe=0))
    with pytest.raises(ValueError, match="q_pe must be None or have a last dimension of 0"):
        w.run(qn, qp, ckv, None)
    with pytest.raises(ValueError, match="kpe_cache must be None"):
        w.run(qn, None, ckv, kpe)


def test_emulated_split_kv(mla_kernel):
    """Few long requests: plan cuts the keys into chunks (split-KV), run hands the kernel the
    partial states' buffers (in the float workspace) and the rows come back right (the emulator
    merges); a float workspace too small for them takes fewer chunks."""
    bt = _cpu_batch([1, 2], [3000, 700], heads=16)
    w = bt.check_run(True)
    assert w._num_chunks == mla_kernel.chunks[-1] == 11  # 2 items: 66 chunks wanted, 3000 // 256 = 11
    # a float workspace too small for them: as many chunks as fit (none here: no split)
    small = MLA(_cpu_ws())
    bt.plan(small, True)
    assert small._num_chunks == 1 and small._o_part is None
    o, lse = small.run(*bt.run_args(), return_lse=True)
    check(o, lse, *bt.ref(True))
    # room for 3 chunks: 3 rows x 3 x 16 heads x 512 x 2 bytes of o, 3 x 4 x 16 x 4 of lse
    mid = MLA(torch.empty(3 * 3 * 16 * 1024 + 3 * 4 * 16 * 4, dtype=torch.uint8))
    bt.plan(mid, True)
    assert mid._num_chunks == 3
    o, lse = mid.run(*bt.run_args(), return_lse=True)
    check(o, lse, *bt.ref(True))


def test_emulated_cuda_graph_split_keeps_rows(mla_kernel):
    """Under CUDA graphs the first plan's chunk count stays, and with split-KV qo_indptr[-1] too
    (the merge's row count is captured)."""
    bufs = _graph_bufs(2, 300)
    w = MLA(workspace("cpu"), True, **bufs)
    first = _cpu_batch([1, 1], [0, 0], heads=16)  # (FlashInfer's flow: plan with empty KV first)
    first.plan(w, True)
    chunks = w._num_chunks
    assert chunks > 1
    assert chunks == 64  # 2 items: 66 chunks would bring them to 132 SMs; at most 64
    again = _cpu_batch([1, 1], [3000, 9], heads=16)  # (alone: 11 chunks)
    again.plan(w, True)
    assert w._num_chunks == chunks
    o, lse = w.run(*again.run_args(), return_lse=True)
    check(o, lse, *again.ref(True))
    with pytest.raises(ValueError, match="must stay 2"):
        _cpu_batch([1, 0], [40, 9], heads=16).plan(w, True)
