"""MultiLevelCascadeAttentionWrapper and the legacy two-level wrappers
(BatchDecodeWithSharedPrefixPagedKVCacheWrapper, BatchPrefillWithSharedPrefixPagedKVCacheWrapper),
spec §2.

GPU (spec §2 "How it is tested"): two levels (``decode``: one q row per request; ``append``:
``unique_kv_len`` q rows per request, causal on / off) and three levels (a shared prefix, group
prefixes, each request's keys) against the float64 reference over the concatenated keys
(reference_prefill.prefill_ref on the pages gathered back from the cache), and the two-level
MultiLevel wrapper against the legacy wrappers (1e-3): B {12, 17}, unique_kv_len {17, 37},
shared_kv_len {128, 512}, heads 8 / 16, head_dim {128, 256}, page_size {1, 16}; KV written with
append_paged_kv_cache. Plus GQA / HND / tuple caches, bf16 through the legacy wrappers, and a
CUDA-graph capture / re-plan / replay.

CPU (no GPU needed): signatures and module surface, the constructors' and plan's argument
checks, and the wrappers' host-side composition end to end with the kernels replaced by float64
emulations (test_batch_prefill's ``emulated`` fixture for the batch prefill binding, plus
emulations of the single-prefill and merge bindings and of the batch decode wrapper): the
results against the reference, the merge order (last level first, then levels 0 .. n-2, each
merged in place into the last level's state, the temporaries reused), causal on the last level
only, and each level's qo_indptr / page table.
"""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
flashinfer = pytest.importorskip("flashinfer", reason="flashinfer (with its bindings) is not importable",
                                 exc_type=ImportError)

import flashinfer.cascade as fcascade  # noqa: E402
import flashinfer.decode as fdecode  # noqa: E402
import flashinfer.prefill as fprefill  # noqa: E402
import reference_cascade  # noqa: E402
from reference_attention import gather_pages  # noqa: E402
from reference_prefill import assert_prefill_close, assert_prefill_lse_close, prefill_ref  # noqa: E402
from test_batch_prefill import emulated  # noqa: E402,F401  (a fixture: the batch prefill kernel in float64)

CUDA, CPU = "cuda", "cpu"
H, B = torch.float16, torch.bfloat16
gpu = pytest.mark.gpu
MultiLevel = flashinfer.MultiLevelCascadeAttentionWrapper
LegacyDecode = flashinfer.BatchDecodeWithSharedPrefixPagedKVCacheWrapper
LegacyPrefill = flashinfer.BatchPrefillWithSharedPrefixPagedKVCacheWrapper


def workspace(dev=CUDA):
    return torch.empty(32 << 20, dtype=torch.int8, device=dev)


def indptr_of(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def ceil_div(a, b):
    return (a + b - 1) // b


class Cascade:
    """One cascade problem in one paged cache. Levels of KV sequences: level 0 one shared prefix
    (all q rows), optional group prefixes (``group_sizes[g]`` consecutive requests share
    prefix ``g`` of ``group_lens[g]`` keys), the last level each request's unique keys. Every
    sequence owns its own pages, drawn in random order from one pool (plus spare pages nobody
    owns). ``stage="decode"``: one q row per request; ``"append"``: ``qo_lens`` (default: the
    unique lengths) rows per request."""

    def __init__(self, batch, unique_lens, shared_len, hq, hkv, d, page_size, *, stage="append", qo_lens=None,
                 group_sizes=None, group_lens=None, dtype=H, layout="NHD", form="5d", dev=CUDA, writer="append"):
        if isinstance(unique_lens, int):
            unique_lens = [unique_lens] * batch
        self.batch, self.hq, self.hkv, self.d, self.ps = batch, hq, hkv, d, page_size
        self.dtype, self.layout, self.dev, self.stage = dtype, layout, dev, stage
        self.unique_lens = list(unique_lens)
        if stage == "decode":
            qo_lens = [1] * batch
        elif qo_lens is None:
            qo_lens = list(unique_lens)
        self.qo_lens = list(qo_lens)
        self.qo_indptr = indptr_of(self.qo_lens)
        n = self.qo_indptr[-1]
        self.q = torch.randn(n, hq, d, dtype=dtype, device=dev)
        # levels: (sequence lengths, qo_indptr over the q rows)
        self.level_lens = [[shared_len]]
        self.level_qo = [[0, n]]
        self.group_of = [0] * batch
        if group_sizes is not None:
            assert sum(group_sizes) == batch and len(group_lens) == len(group_sizes)
            self.group_of = [g for g, c in enumerate(group_sizes) for _ in range(c)]
            rows = [sum(self.qo_lens[b] for b in range(batch) if self.group_of[b] == g)
                    for g in range(len(group_sizes))]
            self.level_lens.append(list(group_lens))
            self.level_qo.append(indptr_of(rows))
        self.level_lens.append(self.unique_lens)
        self.level_qo.append(list(self.qo_indptr))
        # pages
        n_pages = [[ceil_div(length, page_size) for length in lens] for lens in self.level_lens]
        total = sum(sum(p) for p in n_pages) + 3
        perm = torch.randperm(total).tolist()
        self.num_pages = total
        self.tables = []  # per level: (indptr, indices, last_page_len) as lists
        nxt = 0
        for lens, pages in zip(self.level_lens, n_pages):
            indptr, indices, last = [0], [], []
            for length, p in zip(lens, pages):
                indices += perm[nxt:nxt + p]
                nxt += p
                indptr.append(len(indices))
                last.append(0 if p == 0 else length - (p - 1) * page_size)
            self.tables.append((indptr, indices, last))
        # keys / values per sequence, written into the cache
        shape = (total, page_size, hkv, d) if layout == "NHD" else (total, hkv, page_size, d)
        full = torch.randn((total, 2) + shape[1:], dtype=dtype, device=dev)  # unused slots: random, not 0
        self.k4, self.v4 = full[:, 0], full[:, 1]
        if form == "5d":
            self.cache = full
        elif form == "tuple":
            self.cache = (self.k4, self.v4)
        else:
            raise ValueError(form)
        self.seqs = [[(torch.randn(length, hkv, d, dtype=dtype, device=dev),
                       torch.randn(length, hkv, d, dtype=dtype, device=dev)) for length in lens]
                     for lens in self.level_lens]
        for lvl in range(len(self.level_lens)):
            self._write(lvl, writer)
        # what the cache now holds, gathered back (the reference reads these)
        self.gathered = []
        for (indptr, indices, last), seqs in zip(self.tables, self.seqs):
            got = [gather_pages(self.k4, self.v4, layout, indptr, indices, last, s) for s in range(len(seqs))]
            for (k, v), (k0, v0) in zip(got, seqs):
                assert torch.equal(k, k0) and torch.equal(v, v0), "the KV was not written where the page table says"
            self.gathered.append(got)

    def _write(self, lvl, writer):
        indptr, indices, last = self.tables[lvl]
        seqs = self.seqs[lvl]
        keys = torch.cat([k for k, _ in seqs])
        vals = torch.cat([v for _, v in seqs])
        if keys.shape[0] == 0:
            return
        if writer == "append":  # flashinfer.append_paged_kv_cache (GPU)
            dev = self.dev
            i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=dev)  # noqa: E731
            kv_indptr, kv_indices, kv_last = i32(indptr), i32(indices), i32(last)
            append_indptr = i32(indptr_of([k.shape[0] for k, _ in seqs]))
            seq_lens = flashinfer.get_seq_lens(kv_indptr, kv_last, self.ps)
            bi, pos = flashinfer.get_batch_indices_positions(append_indptr, seq_lens, keys.shape[0])
            flashinfer.append_paged_kv_cache(keys, vals, bi, pos, self.cache, kv_indices, kv_indptr, kv_last,
                                             self.layout)
        else:  # direct scatter (CPU)
            for s, (k, v) in enumerate(seqs):
                t = torch.arange(k.shape[0])
                pages = torch.tensor(indices[indptr[s]:indptr[s + 1]], dtype=torch.long)[t // self.ps]
                slot = t % self.ps
                if self.layout == "NHD":
                    self.k4[pages, slot] = k
                    self.v4[pages, slot] = v
                else:
                    self.k4[pages, :, slot] = k
                    self.v4[pages, :, slot] = v

    # -- plan arguments ----------------------------------------------------------------------------
    def _i32(self, x):
        return torch.tensor(x, dtype=torch.int32, device=self.dev)

    def multilevel_plan_args(self):
        return ([self._i32(qo) for qo in self.level_qo], [self._i32(t[0]) for t in self.tables],
                [self._i32(t[1]) for t in self.tables], [self._i32(t[2]) for t in self.tables],
                self.hq, self.hkv, self.d, self.ps)

    def unique_table(self):
        return tuple(self._i32(x) for x in self.tables[-1])

    def shared_kv(self):
        """k_shared / v_shared (contiguous) in the wrapper's layout."""
        k, v = self.seqs[0][0]
        if self.layout == "HND":
            return k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
        return k, v

    def ref(self, causal=False, **kw):
        """(o, lse) float64: each request's rows over the concatenated keys of its levels."""
        os_, ls_ = [], []
        for b in range(self.batch):
            parts = [self.gathered[0][0]]
            if len(self.gathered) == 3:
                parts.append(self.gathered[1][self.group_of[b]])
            parts.append(self.gathered[-1][b])
            k = torch.cat([p[0] for p in parts])
            v = torch.cat([p[1] for p in parts])
            q0, q1 = self.qo_indptr[b], self.qo_indptr[b + 1]
            o, lse = prefill_ref(self.q[q0:q1], k, v, causal=causal, **kw)
            os_.append(o)
            ls_.append(lse)
        return torch.cat(os_), torch.cat(ls_)


def check(o, ref_o, name="o"):
    """o (16-bit) against the float64 reference: per (row, head) within 1e-2 of the row's max
    |ref| (reference_prefill.assert_prefill_close), no NaN."""
    assert o.dtype in (H, B), o.dtype
    assert_prefill_close(o, ref_o, name)


def assert_close_1e3(a, b, name):
    """The FlashInfer test's comparison (rtol = atol = 1e-3), with a useful message."""
    assert a.shape == b.shape and a.dtype == b.dtype, f"{name}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
    torch.testing.assert_close(a.double(), b.double(), rtol=1e-3, atol=1e-3, msg=lambda m: f"{name}: {m}")


# ==================================================================================================
# GPU
# ==================================================================================================

STAGES = [("decode", False), ("append", False), ("append", True)]


@gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("num_heads", [8, 16])
@pytest.mark.parametrize("shared_kv_len", [128, 512])
@pytest.mark.parametrize("unique_kv_len", [17, 37])
@pytest.mark.parametrize("batch_size", [12, 17])
@pytest.mark.parametrize("stage,causal", STAGES, ids=["decode", "append", "append-causal"])
def test_two_levels(stage, causal, batch_size, unique_kv_len, shared_kv_len, num_heads, head_dim, page_size):
    """FlashInfer's test_batch_attention_with_shared_prefix_paged_kv_cache, plus the float64
    reference over the concatenated KV."""
    c = Cascade(batch_size, unique_kv_len, shared_kv_len, num_heads, num_heads, head_dim, page_size, stage=stage)
    w = MultiLevel(2, workspace(), "NHD")
    w.plan(*c.multilevel_plan_args(), causal=causal)
    o = w.run(c.q, c.cache)
    assert o.shape == c.q.shape and o.dtype == H
    ref_o, _ = c.ref(causal=causal)
    check(o, ref_o, "multi-level o")

    k_shared, v_shared = c.shared_kv()
    if stage == "decode":
        legacy = LegacyDecode(workspace(), "NHD")
        legacy.begin_forward(*c.unique_table(), num_heads, num_heads, head_dim, page_size)
        o_two = legacy.forward(c.q, k_shared, v_shared, c.cache)
    else:
        legacy = LegacyPrefill(workspace(), "NHD")
        legacy.begin_forward(c._i32(c.qo_indptr), *c.unique_table(), num_heads, num_heads, head_dim, page_size)
        o_two = legacy.forward(c.q, k_shared, v_shared, c.cache, causal=causal)
    check(o_two, ref_o, "legacy o")
    assert_close_1e3(o, o_two, "multi-level vs legacy")


@gpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("batch_size", [12, 17])
@pytest.mark.parametrize("stage,causal", STAGES, ids=["decode", "append", "append-causal"])
def test_three_levels(stage, causal, batch_size, page_size):
    """Shared prefix, group prefixes (one of them empty), unique keys of varied lengths."""
    groups = [5, batch_size - 9, 4]
    unique = [17 + (7 * b) % 21 for b in range(batch_size)]
    c = Cascade(batch_size, unique, 128, 16, 16, 128, page_size, stage=stage, group_sizes=groups,
                group_lens=[37, 0, 200])
    w = MultiLevel(3, workspace())
    w.plan(*c.multilevel_plan_args(), causal=causal)
    o = w.run(c.q, c.cache)
    check(o, c.ref(causal=causal)[0], "3-level o")


@gpu
@pytest.mark.parametrize("layout,form,dtype,hq,hkv", [("HND", "tuple", B, 16, 4), ("NHD", "tuple", H, 28, 4),
                                                      ("HND", "5d", H, 8, 8)])
def test_layouts_gqa_dtypes(layout, form, dtype, hq, hkv):
    batch, ps, d = 12, 16, 128
    c = Cascade(batch, [17 + b for b in range(batch)], 512, hq, hkv, d, ps, dtype=dtype, layout=layout, form=form)
    w = MultiLevel(2, workspace(), layout)
    w.plan(*c.multilevel_plan_args(), causal=True, q_data_type=dtype)
    o = w.run(c.q, c.cache)
    assert o.dtype == dtype
    ref_o, _ = c.ref(causal=True)
    check(o, ref_o)
    k_shared, v_shared = c.shared_kv()
    legacy = LegacyPrefill(workspace(), layout)
    legacy.begin_forward(c._i32(c.qo_indptr), *c.unique_table(), hq, hkv, d, ps)
    o_two = legacy.forward(c.q, k_shared, v_shared, c.cache, causal=True)  # bf16: re-planned for q's dtype
    check(o_two, ref_o, "legacy prefill o")
    # decode form
    cd = Cascade(batch, [17 + b for b in range(batch)], 512, hq, hkv, d, ps, stage="decode", dtype=dtype,
                 layout=layout, form=form)
    k_shared, v_shared = cd.shared_kv()
    legacy_d = LegacyDecode(workspace(), layout)
    legacy_d.begin_forward(*cd.unique_table(), hq, hkv, d, ps, data_type=dtype)
    check(legacy_d.forward(cd.q, k_shared, v_shared, cd.cache), cd.ref()[0], "legacy decode o")


@gpu
def test_options_reach_every_level():
    """sm_scale / logits_soft_cap go to every level; the merge is exact for them too."""
    c = Cascade(12, 37, 128, 8, 8, 128, 16)
    w = MultiLevel(2, workspace())
    w.plan(*c.multilevel_plan_args(), causal=True, sm_scale=0.05, logits_soft_cap=5.0)
    check(w.run(c.q, c.cache), c.ref(causal=True, sm_scale=0.05, soft_cap=5.0)[0])


@gpu
def test_cuda_graph_replan_and_replay():
    """Capture run in a CUDA graph, plan again with other page tables and lengths (same batch
    size and q rows), replay: the new plan's result."""
    batch, hq, d, ps = 12, 8, 128, 16
    dev = CUDA
    i32 = torch.int32
    bufs = dict(qo_indptr_buf_arr=[torch.empty(2, dtype=i32, device=dev),
                                   torch.empty(batch + 1, dtype=i32, device=dev)],
                paged_kv_indptr_buf_arr=[torch.empty(2, dtype=i32, device=dev),
                                         torch.empty(batch + 1, dtype=i32, device=dev)],
                paged_kv_indices_buf_arr=[torch.empty(512, dtype=i32, device=dev),
                                          torch.empty(512, dtype=i32, device=dev)],
                paged_kv_last_page_len_buf_arr=[torch.empty(1, dtype=i32, device=dev),
                                                torch.empty(batch, dtype=i32, device=dev)])
    w = MultiLevel(2, workspace(), "NHD", use_cuda_graph=True, **bufs)
    assert w.is_cuda_graph_enabled
    for lvl, wr in enumerate(w._batch_prefill_wrappers):
        assert wr._qo_indptr_buf is bufs["qo_indptr_buf_arr"][lvl] and wr.is_cuda_graph_enabled
    cases = [Cascade(batch, 37, 512, hq, hq, d, ps),
             Cascade(batch, [37 + 3 * b for b in range(batch)], 300, hq, hq, d, ps, qo_lens=[37] * batch)]
    n = cases[0].q.shape[0]
    assert cases[1].q.shape[0] == n
    P = max(c.num_pages for c in cases)
    cache = torch.zeros(P, 2, ps, hq, d, dtype=H, device=dev)
    q = torch.zeros(n, hq, d, dtype=H, device=dev)

    def load(c):
        cache.zero_()
        cache[:c.num_pages].copy_(c.cache)
        q.copy_(c.q)
        w.plan(*c.multilevel_plan_args(), causal=True)

    load(cases[0])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        w.run(q, cache)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = w.run(q, cache)
    for i, c in enumerate(cases):
        load(c)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check(out, c.ref(causal=True)[0], f"replay {i}")
        assert torch.equal(w.run(q, cache), out)


# ==================================================================================================
# CPU: surface and argument handling
# ==================================================================================================

def _params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


E = inspect.Parameter.empty


def test_module_surface():
    for name in ("MultiLevelCascadeAttentionWrapper", "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
                 "BatchPrefillWithSharedPrefixPagedKVCacheWrapper", "merge_state", "merge_state_in_place",
                 "merge_states"):
        assert name in fcascade.__all__ and name in flashinfer.__all__
        assert getattr(flashinfer, name) is getattr(fcascade, name)
    assert MultiLevel.begin_forward is MultiLevel.plan and MultiLevel.forward is MultiLevel.run
    assert isinstance(MultiLevel.__dict__["is_cuda_graph_enabled"], property)
    for cls in (LegacyDecode, LegacyPrefill):
        for m in ("begin_forward", "forward", "end_forward", "reset_workspace_buffer"):
            assert callable(getattr(cls, m)), (cls, m)
    assert callable(LegacyPrefill.prewarm_paged_kv_stride_variant)


def test_signatures_match_the_spec():
    assert _params(MultiLevel.__init__) == [
        ("self", E), ("num_levels", E), ("float_workspace_buffer", E), ("kv_layout", "NHD"), ("use_cuda_graph", False),
        ("qo_indptr_buf_arr", None), ("paged_kv_indptr_buf_arr", None), ("paged_kv_indices_buf_arr", None),
        ("paged_kv_last_page_len_buf_arr", None)]
    assert _params(MultiLevel.plan) == [
        ("self", E), ("qo_indptr_arr", E), ("paged_kv_indptr_arr", E), ("paged_kv_indices_arr", E),
        ("paged_kv_last_page_len", E), ("num_qo_heads", E), ("num_kv_heads", E), ("head_dim", E), ("page_size", E),
        ("causal", False), ("pos_encoding_mode", "NONE"), ("use_fp16_qk_reduction", False), ("sm_scale", None),
        ("window_left", -1), ("logits_soft_cap", None), ("rope_scale", None), ("rope_theta", None),
        ("q_data_type", "float16"), ("kv_data_type", None)]
    assert _params(MultiLevel.run) == [("self", E), ("q", E), ("paged_kv_cache", E)]
    assert _params(MultiLevel.reset_workspace_buffer) == [("self", E), ("float_workspace_buffer", E),
                                                          ("int_workspace_buffers", E)]
    for cls in (LegacyDecode, LegacyPrefill):
        assert _params(cls.__init__) == [("self", E), ("float_workspace_buffer", E), ("kv_layout", "NHD")]
        assert _params(cls.reset_workspace_buffer) == [("self", E), ("float_workspace_buffer", E),
                                                       ("int_workspace_buffer", E)]
    assert _params(LegacyDecode.begin_forward) == [
        ("self", E), ("unique_kv_indptr", E), ("unique_kv_indices", E), ("unique_kv_last_page_len", E),
        ("num_qo_heads", E), ("num_kv_heads", E), ("head_dim", E), ("page_size", E), ("data_type", "float16")]
    assert _params(LegacyDecode.forward) == [("self", E), ("q", E), ("k_shared", E), ("v_shared", E),
                                             ("unique_kv_cache", E)]
    assert _params(LegacyPrefill.begin_forward) == [
        ("self", E), ("qo_indptr", E), ("paged_kv_indptr", E), ("paged_kv_indices", E),
        ("paged_kv_last_page_len", E), ("num_qo_heads", E), ("num_kv_heads", E), ("head_dim", E), ("page_size", E)]
    assert _params(LegacyPrefill.forward) == [
        ("self", E), ("q", E), ("k_shared", E), ("v_shared", E), ("unique_kv_cache", E), ("causal", False),
        ("use_fp16_qk_reduction", False), ("sm_scale", None), ("rope_scale", None), ("rope_theta", None)]


def _cpu_ws():
    return torch.empty(1024, dtype=torch.uint8)


@pytest.mark.parametrize("n", [0, -1, 1.5, "2", None, True])
def test_bad_num_levels(n):
    with pytest.raises(ValueError, match="num_levels"):
        MultiLevel(n, _cpu_ws())


@pytest.mark.parametrize("layout", ["nhd", "", 0])
def test_bad_kv_layout(layout):
    with pytest.raises(KeyError):
        MultiLevel(2, _cpu_ws(), layout)
    with pytest.raises(KeyError):
        LegacyPrefill(_cpu_ws(), layout)


def test_workspace_must_be_cuda():
    for make in (lambda: MultiLevel(2, _cpu_ws()), lambda: LegacyPrefill(_cpu_ws()), lambda: LegacyDecode(_cpu_ws())):
        with pytest.raises(ValueError, match="CUDA"):
            make()


def _graph_arrs(levels=2, batch=4, **over):
    i32 = torch.int32
    rest = levels - 1  # level 0: batch 1 (the shared prefix); the others: batch
    arrs = dict(qo_indptr_buf_arr=[torch.empty(2, dtype=i32)] + [torch.empty(batch + 1, dtype=i32)] * rest,
                paged_kv_indptr_buf_arr=[torch.empty(2, dtype=i32)] + [torch.empty(batch + 1, dtype=i32)] * rest,
                paged_kv_indices_buf_arr=[torch.empty(64, dtype=i32) for _ in range(levels)],
                paged_kv_last_page_len_buf_arr=[torch.empty(1, dtype=i32)] + [torch.empty(batch, dtype=i32)] * rest)
    arrs.update(over)
    return arrs


@pytest.mark.parametrize("name", ["qo_indptr_buf_arr", "paged_kv_indptr_buf_arr", "paged_kv_indices_buf_arr",
                                  "paged_kv_last_page_len_buf_arr"])
def test_cuda_graph_needs_every_buffer_list(name):
    with pytest.raises(ValueError, match=name):
        MultiLevel(2, _cpu_ws(), use_cuda_graph=True, **_graph_arrs(**{name: None}))
    short_list = _graph_arrs()[name][:1]
    with pytest.raises(ValueError, match="one entry per level"):
        MultiLevel(2, _cpu_ws(), use_cuda_graph=True, **_graph_arrs(**{name: short_list}))


def test_cuda_graph_buffer_checks_reach_each_level(emulated):  # noqa: F811 (the fixture)
    w = MultiLevel(2, _cpu_ws(), "HND", True, **_graph_arrs())
    assert w.is_cuda_graph_enabled
    assert [wr._fixed_batch_size for wr in w._batch_prefill_wrappers] == [1, 4]
    arrs = _graph_arrs()
    assert all(wr._paged_kv_indices_buf is buf for wr, buf in zip(MultiLevel(2, _cpu_ws(), "NHD", True, **arrs)
                                                                  ._batch_prefill_wrappers,
                                                                  arrs["paged_kv_indices_buf_arr"]))
    bad = _graph_arrs()
    bad["paged_kv_last_page_len_buf_arr"][1] = torch.empty(5, dtype=torch.int32)  # level 1: batch 4
    with pytest.raises(ValueError, match="paged_kv_last_page_len_buf"):
        MultiLevel(2, _cpu_ws(), use_cuda_graph=True, **bad)
    # without CUDA graphs the lists are ignored
    assert not MultiLevel(2, _cpu_ws(), qo_indptr_buf_arr=[1]).is_cuda_graph_enabled


# ==================================================================================================
# CPU: the host-side composition with float64 kernels
# ==================================================================================================

def _from_dl(x):
    return None if x is None else torch.utils.dlpack.from_dlpack(x)


class Log:
    """What the emulated bindings / wrappers were asked to do, in order."""

    def __init__(self):
        self.events = []


@pytest.fixture
def composed(emulated, monkeypatch):  # noqa: F811 (the fixture)
    """``emulated`` (batch prefill kernel in float64, CPU workspaces) plus: the single-prefill and
    merge-in-place bindings in float64, a log of each paged prefill wrapper's run and of each
    merge, and a float64 BatchDecodeWithPagedKVCacheWrapper."""
    log = Log()

    def single_prefill(q, k, v, out, lse, mask, layout, causal, window, scale, cap, alibi, out_scale, stream, flag):
        q, k, v, out, lse = (_from_dl(x) for x in (q, k, v, out, lse))
        assert mask is None
        if layout == 1:
            k, v = k.transpose(0, 1), v.transpose(0, 1)
        log.events.append(("single_prefill", dict(rows=q.shape[0], kv_len=k.shape[0], causal=causal, scale=scale,
                                                  out=out.data_ptr())))
        o, l2 = prefill_ref(q, k, v, causal=causal, sm_scale=scale, window_left=window, soft_cap=cap, alibi=alibi,
                            v_scale=out_scale)
        out.copy_(o.to(out.dtype))
        if lse is not None:
            lse.copy_(l2.float())

    def merge_state_in_place(v, s, v_other, s_other, mask, stream):
        v, s, v_other, s_other = (_from_dl(x) for x in (v, s, v_other, s_other))
        assert mask is None and s.dtype == s_other.dtype == torch.float32
        log.events.append(("merge", v.data_ptr(), s.data_ptr(), v_other.data_ptr(), s_other.data_ptr()))
        mv, ms = reference_cascade.merge_state(v, s, v_other, s_other)
        v.copy_(mv.to(v.dtype))
        s.copy_(ms.float())

    fprefill._prefill.single_prefill = single_prefill  # (emulated's namespace, new per test)
    monkeypatch.setattr(fcascade, "_cascade", SimpleNamespace(merge_state_in_place=merge_state_in_place))

    real_run = fprefill.BatchPrefillWithPagedKVCacheWrapper.run

    def logged_run(self, q, paged_kv_cache, *args, **kw):
        res = real_run(self, q, paged_kv_cache, *args, **kw)
        o, lse = res if kw.get("return_lse") else (res, kw.get("lse"))
        log.events.append(("run", id(self), dict(return_lse=kw.get("return_lse", False), out=kw.get("out") is not None,
                                                 o=o.data_ptr(), lse=None if lse is None else lse.data_ptr())))
        return res

    monkeypatch.setattr(fprefill.BatchPrefillWithPagedKVCacheWrapper, "run", logged_run)
    monkeypatch.setattr(fdecode, "BatchDecodeWithPagedKVCacheWrapper", FakeDecodeWrapper)
    log.kernel = emulated
    return log


class FakeDecodeWrapper:
    """BatchDecodeWithPagedKVCacheWrapper's contract (one q row per request over its pages), in
    float64: what the legacy decode wrapper composes with the shared-prefix attention."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD", **kw):
        fdecode._layout_code(kv_layout)
        self._kv_layout = kv_layout
        self.plans = []
        self.reset_args = None

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer):
        self.reset_args = (float_workspace_buffer, int_workspace_buffer)

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             pos_encoding_mode="NONE", q_data_type="float16", kv_data_type=None, data_type=None, **kw):
        assert pos_encoding_mode == "NONE" and data_type is None
        self.plans.append((q_data_type, kv_data_type))
        self._table = (indptr.tolist(), indices.tolist(), last_page_len.tolist())
        self._sm_scale, self._rope_scale, self._rope_theta = 1.0 / math.sqrt(head_dim), 1.0, 1e4
        self._q_dtype = getattr(torch, q_data_type)

    def run(self, q, paged_kv_cache, *, return_lse=False):
        assert q.dtype == self._q_dtype, "q's dtype must be the planned one"
        k4, v4 = fprefill._unpack_paged_kv_cache(paged_kv_cache, fdecode._layout_code(self._kv_layout))
        ip, ind, last = self._table
        os_, ls_ = [], []
        for b in range(len(last)):
            k, v = gather_pages(k4, v4, self._kv_layout, ip, ind, last, b)
            o, lse = prefill_ref(q[b:b + 1], k, v, sm_scale=self._sm_scale)
            os_.append(o)
            ls_.append(lse)
        o, lse = torch.cat(os_).to(q.dtype), torch.cat(ls_).float()
        return (o, lse) if return_lse else o


def _cpu_case(levels=2, stage="append", batch=5, layout="NHD", form="5d", ps=4, dtype=H, hq=4, hkv=2, d=64,
              shared=23, **kw):
    unique = [9, 4, 13, 1, 6, 8, 3][:batch]
    if levels == 3:
        kw.setdefault("group_sizes", [2, batch - 3, 1])
        kw.setdefault("group_lens", [7, 0, 12])
    qo = None if stage == "decode" else kw.pop("qo_lens", [min(u, q) for u, q in zip(unique, [5, 4, 1, 1, 6, 2, 3])])
    return Cascade(batch, unique, shared, hq, hkv, d, ps, stage=stage, qo_lens=qo, dtype=dtype, layout=layout,
                   form=form, dev=CPU, writer="scatter", **kw)


def _runs(log, w):
    ids = {id(x): i for i, x in enumerate(w._batch_prefill_wrappers)}
    return [(ids[e[1]], e[2]) for e in log.events if e[0] == "run"]


@pytest.mark.parametrize("levels,stage,causal,layout,form,ps", [
    (2, "decode", False, "NHD", "5d", 1), (2, "append", True, "HND", "tuple", 4), (2, "append", False, "NHD", "5d", 16),
    (3, "append", True, "NHD", "tuple", 4), (3, "decode", False, "HND", "5d", 1),
    (3, "append", False, "HND", "5d", 16)])
def test_emulated_multilevel(composed, levels, stage, causal, layout, form, ps):
    c = _cpu_case(levels, stage, layout=layout, form=form, ps=ps)
    w = MultiLevel(levels, _cpu_ws(), layout)
    w.begin_forward(*c.multilevel_plan_args(), causal=causal)
    wrappers = w._batch_prefill_wrappers
    assert len(wrappers) == levels
    # causal on the last level only; each level its own q rows and page table
    assert [x._causal for x in wrappers] == [False] * (levels - 1) + [causal]
    for lvl, x in enumerate(wrappers):
        assert x._qo_indptr_buf.tolist() == c.level_qo[lvl]
        assert x._paged_kv_indptr_buf.tolist() == c.tables[lvl][0]
        assert x._paged_kv_indices_buf.tolist() == c.tables[lvl][1]
        assert x._paged_kv_last_page_len_buf.tolist() == c.tables[lvl][2]
        assert x._float_workspace_buffer is wrappers[0]._float_workspace_buffer  # shared float workspace
    o = w.forward(c.q, c.cache)
    assert o.shape == c.q.shape and o.dtype == c.dtype
    ref_o, ref_lse = c.ref(causal=causal)
    check(o, ref_o)
    # order: the last level with LSE (its o is the result), then levels 0 .. n-2, each merged
    # into the result right after it ran, the second and later ones into the first one's buffers
    runs = _runs(composed, w)
    assert [lvl for lvl, _ in runs] == [levels - 1] + list(range(levels - 1))
    assert runs[0][1]["return_lse"] and runs[0][1]["o"] == o.data_ptr()
    merges = [e for e in composed.events if e[0] == "merge"]
    assert len(merges) == levels - 1
    tmp = (runs[1][1]["o"], runs[1][1]["lse"])
    for (lvl, info), m in zip(runs[1:], merges):
        assert m[1:] == (o.data_ptr(), runs[0][1]["lse"]) + tmp
        assert (info["o"], info["lse"]) == tmp
        assert info["out"] == (lvl > 0)
    kinds = [e[0] for e in composed.events]
    assert kinds == ["run"] + ["run", "merge"] * (levels - 1)
    assert composed.kernel.calls == levels
    # a second run gives the same result (plans are reused)
    assert torch.equal(w.run(c.q, c.cache), o)


def test_emulated_multilevel_lse_of_the_result(composed, monkeypatch):
    """The merged state's LSE (the last level's LSE tensor, updated in place) equals the
    concatenated attention's LSE: the merges use base-2 LSEs of the same scaled logits."""
    c = _cpu_case(3, "append")
    w = MultiLevel(3, _cpu_ws())
    w.plan(*c.multilevel_plan_args(), causal=True, sm_scale=0.3)
    seen = {}
    real = fcascade.merge_state_in_place

    def spy(v, s, vo, so, mask=None):
        real(v, s, vo, so, mask)
        seen["s"] = s

    monkeypatch.setattr(fcascade, "merge_state_in_place", spy)
    o = w.run(c.q, c.cache)
    ref_o, ref_lse = c.ref(causal=True, sm_scale=0.3)
    check(o, ref_o)
    assert_prefill_lse_close(seen["s"], ref_lse)


def test_emulated_causal_on_every_level_would_be_wrong(composed):
    """The reference distinguishes "causal on the last level" from "causal everywhere": planning
    the shared level causal too (by hand) changes the result."""
    c = _cpu_case(2, "append", shared=3)
    w = MultiLevel(2, _cpu_ws())
    w.plan(*c.multilevel_plan_args(), causal=True)
    good = w.run(c.q, c.cache)
    check(good, c.ref(causal=True)[0])
    w._batch_prefill_wrappers[0]._causal = True
    bad = w.run(c.q, c.cache)
    with pytest.raises(AssertionError):
        check(bad, c.ref(causal=True)[0])


def test_emulated_one_level_and_plan_checks(composed):
    c = _cpu_case(2, "append")
    w1 = MultiLevel(1, _cpu_ws())
    args = c.multilevel_plan_args()
    w1.plan([args[0][-1]], [args[1][-1]], [args[2][-1]], [args[3][-1]], *args[4:], causal=True)
    o = w1.run(c.q, c.cache)
    os_ = [prefill_ref(c.q[a:b], *c.gathered[-1][i], causal=True)[0] for i, (a, b) in
           enumerate(zip(c.qo_indptr[:-1], c.qo_indptr[1:]))]
    check(o, torch.cat(os_))
    assert not [e for e in composed.events if e[0] == "merge"]

    w = MultiLevel(2, _cpu_ws())
    with pytest.raises(RuntimeError, match="plan"):
        w.run(c.q, c.cache)
    names = ["qo_indptr_arr", "paged_kv_indptr_arr", "paged_kv_indices_arr", "paged_kv_last_page_len"]
    for i, name in enumerate(names):
        bad = list(args)
        bad[i] = bad[i][:1]
        with pytest.raises(ValueError, match=name):
            w.plan(*bad)
        bad[i] = bad[i][0]  # a tensor, not a list
        with pytest.raises(ValueError, match=name):
            w.plan(*bad)
    bad = list(args)
    bad[0] = [torch.tensor([0, 3], dtype=torch.int32), args[0][1]]  # level 0 covers 3 rows, not all
    with pytest.raises(ValueError, match=r"qo_indptr\[-1\]"):
        w.plan(*bad)
    with pytest.raises(RuntimeError, match="plan"):  # a failed plan leaves no plan behind
        w.run(c.q, c.cache)
    with pytest.raises(NotImplementedError, match="ROPE_LLAMA"):
        w.plan(*args, pos_encoding_mode="ROPE_LLAMA")
    w.plan(*args)
    with pytest.raises(ValueError, match="q.shape"):  # each level checks q against its plan
        w.run(c.q[:-1], c.cache)
    with pytest.raises(ValueError, match="dtype of q"):
        w.run(c.q.to(B), c.cache)


def test_emulated_options_reach_every_level(composed):
    c = _cpu_case(3, "append")
    w = MultiLevel(3, _cpu_ws())
    w.plan(*c.multilevel_plan_args(), causal=False, sm_scale=0.2, logits_soft_cap=3.0, pos_encoding_mode="ALIBI",
           q_data_type="bfloat16" if c.dtype == B else "float16", use_fp16_qk_reduction=True)
    for x in w._batch_prefill_wrappers:
        assert (x._k_sm_scale, x._k_cap, x._pos_code, x._causal) == (0.2, 3.0, 2, False)
    w.plan(*c.multilevel_plan_args(), window_left=5)
    assert [x._k_window for x in w._batch_prefill_wrappers] == [5, 5, 5]
    w.plan(*c.multilevel_plan_args(), sm_scale=0.2, logits_soft_cap=3.0)
    check(w.run(c.q, c.cache), c.ref(sm_scale=0.2, soft_cap=3.0)[0])


def test_emulated_bf16_and_reset_workspace(composed):
    c = _cpu_case(2, "append", dtype=B)
    w = MultiLevel(2, _cpu_ws())
    w.plan(*c.multilevel_plan_args(), causal=True, q_data_type=B)
    check(w.run(c.q, c.cache), c.ref(causal=True)[0])
    ints = [torch.empty(1 << 20, dtype=torch.uint8), None]
    f2 = _cpu_ws()
    w.reset_workspace_buffer(f2, ints)
    assert all(x._float_workspace_buffer is f2 for x in w._batch_prefill_wrappers)
    assert w._batch_prefill_wrappers[0]._int_workspace_buffer is ints[0]
    with pytest.raises(ValueError, match="int_workspace_buffers"):
        w.reset_workspace_buffer(f2, ints[:1])
    w.plan(*c.multilevel_plan_args(), causal=True, q_data_type=B)
    check(w.run(c.q, c.cache), c.ref(causal=True)[0])


def test_emulated_cuda_graph_plans(composed):
    batch = 5
    arrs = _graph_arrs(batch=batch)
    w = MultiLevel(2, _cpu_ws(), "NHD", True, **arrs)
    c = _cpu_case(2, "append", batch=batch)
    w.plan(*c.multilevel_plan_args(), causal=True)
    for lvl, x in enumerate(w._batch_prefill_wrappers):
        assert x._qo_indptr_buf is arrs["qo_indptr_buf_arr"][lvl]
        assert arrs["qo_indptr_buf_arr"][lvl].tolist() == c.level_qo[lvl]
        assert arrs["paged_kv_last_page_len_buf_arr"][lvl].tolist() == c.tables[lvl][2]
    check(w.run(c.q, c.cache), c.ref(causal=True)[0])
    c2 = _cpu_case(2, "append", batch=4)
    with pytest.raises(ValueError, match="batch size"):
        w.plan(*c2.multilevel_plan_args())


@pytest.mark.parametrize("layout,causal,dtype", [("NHD", True, H), ("HND", False, B), ("NHD", False, H)])
def test_emulated_legacy_prefill(composed, layout, causal, dtype):
    c = _cpu_case(2, "append", layout=layout, dtype=dtype, form="tuple")
    k_shared, v_shared = c.shared_kv()
    legacy = LegacyPrefill(_cpu_ws(), layout)
    legacy.begin_forward(c._i32(c.qo_indptr), *c.unique_table(), c.hq, c.hkv, c.d, c.ps)
    assert legacy._q_name == "float16"
    o = legacy.forward(c.q, k_shared, v_shared, c.cache, causal=causal)
    assert legacy._q_name == ("bfloat16" if dtype == B else "float16")  # re-planned for a bf16 q
    ref_o, _ = c.ref(causal=causal)
    check(o, ref_o)
    # the shared prefix: one non-causal single-prefill call over all q rows, merged in place
    # into its own output with the unique level's state
    sp = [e for e in composed.events if e[0] == "single_prefill"]
    assert len(sp) == 1 and sp[0][1]["rows"] == c.q.shape[0] and sp[0][1]["kv_len"] == c.level_lens[0][0]
    assert sp[0][1]["causal"] is False and sp[0][1]["out"] == o.data_ptr()
    assert legacy._batch_prefill_wrapper._causal is causal
    merges = [e for e in composed.events if e[0] == "merge"]
    assert len(merges) == 1 and merges[0][1] == o.data_ptr()
    # against the multi-level wrapper
    w = MultiLevel(2, _cpu_ws(), layout)
    w.plan(*c.multilevel_plan_args(), causal=causal, q_data_type=dtype)
    torch.testing.assert_close(w.run(c.q, c.cache).double(), o.double(), rtol=1e-2, atol=1e-2)
    # forward's options
    o2 = legacy.forward(c.q, k_shared, v_shared, c.cache, causal=causal, sm_scale=0.1)
    check(o2, c.ref(causal=causal, sm_scale=0.1)[0])
    assert [e[1]["scale"] for e in composed.events if e[0] == "single_prefill"][-1] == pytest.approx(0.1)
    legacy.end_forward()
    legacy.prewarm_paged_kv_stride_variant()
    legacy.reset_workspace_buffer(_cpu_ws(), None)


@pytest.mark.parametrize("layout,dtype", [("NHD", H), ("HND", B)])
def test_emulated_legacy_decode(composed, layout, dtype):
    c = _cpu_case(2, "decode", layout=layout, dtype=dtype)
    k_shared, v_shared = c.shared_kv()
    legacy = LegacyDecode(_cpu_ws(), layout)
    dw = legacy._batch_decode_wrapper
    assert isinstance(dw, FakeDecodeWrapper)
    legacy.begin_forward(*c.unique_table(), c.hq, c.hkv, c.d, c.ps, data_type=dtype)
    name = "bfloat16" if dtype == B else "float16"
    assert dw.plans == [(name, name)]  # data_type is q's and the caches' dtype
    o = legacy.forward(c.q, k_shared, v_shared, c.cache)
    assert o.shape == c.q.shape and o.dtype == dtype
    check(o, c.ref()[0])
    sp = [e for e in composed.events if e[0] == "single_prefill"]
    assert len(sp) == 1 and sp[0][1]["rows"] == c.batch and sp[0][1]["causal"] is False
    assert sp[0][1]["scale"] == pytest.approx(1 / math.sqrt(c.d)) and sp[0][1]["out"] == o.data_ptr()
    assert [e[0] for e in composed.events] == ["single_prefill", "merge"]
    # against the multi-level wrapper
    w = MultiLevel(2, _cpu_ws(), layout)
    w.plan(*c.multilevel_plan_args(), q_data_type=dtype)
    torch.testing.assert_close(w.run(c.q, c.cache).double(), o.double(), rtol=1e-2, atol=1e-2)
    # a q of the other 16-bit dtype: planned again for it
    other = B if dtype == H else H
    c.q = c.q.to(other)
    legacy.forward(c.q, k_shared.to(other), v_shared.to(other), tuple(t.to(other) for t in (c.k4, c.v4)))
    assert dw.plans[-1] == (str(other).replace("torch.", ""),) * 2
    legacy.reset_workspace_buffer(_cpu_ws(), None)
    assert dw.reset_args is not None
    legacy.end_forward()


def test_emulated_legacy_checks(composed):
    legacy = LegacyDecode(_cpu_ws())
    with pytest.raises(RuntimeError, match="begin_forward"):
        legacy.forward(None, None, None, None)
    with pytest.raises(NotImplementedError, match="fp8"):
        legacy.begin_forward(*[torch.zeros(1, dtype=torch.int32)] * 3, 4, 4, 64, 1, data_type=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="data_type"):
        legacy.begin_forward(*[torch.zeros(1, dtype=torch.int32)] * 3, 4, 4, 64, 1, data_type="float32")
    with pytest.raises(RuntimeError, match="begin_forward"):
        LegacyPrefill(_cpu_ws()).forward(None, None, None, None)
