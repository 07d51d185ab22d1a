"""GPU tests for flashinfer.page against the references in reference_page.py.

append_paged_kv_cache over page sizes 1/5/16, NHD/HND, every cache form of the spec (tuple of
4-D, single 5-D, and for page size 1 tuple of 3-D and single 4-D), fp16/bf16/fp8, head_dim
64/128/256, contiguous, strided (kv[:, 0]) and misaligned inputs, appends into empty, partially
filled and full last pages. The cache is filled with random values first (and holds spare pages
nobody owns), and the whole cache is compared bit for bit with a torch scatter of the appended
rows: appended slots must hold exactly the appended rows, every other slot its old value.
(Reading the cache back through BatchDecodeWithPagedKVCacheWrapper is left to the decode tests.)
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import flashinfer  # noqa: E402
import reference_page as ref  # noqa: E402
from checks import CUDA, grid  # noqa: E402
from flashinfer import _index_check, _page  # noqa: E402

pytestmark = pytest.mark.gpu

FP8 = tuple(dt for dt in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if dt)
OLD_LENS = [0, 3, 16, 17, 5, 0, 40]
ADD_LENS = [45, 8, 25, 22, 1, 0, 3]


@pytest.fixture(autouse=True)
def _indices_unchecked():
    old = _index_check.enabled
    _index_check.set_check_indices(False)
    yield
    _index_check.set_check_indices(old)


@pytest.fixture
def check_indices():
    _index_check.set_check_indices(True)
    yield


def randn(shape, dtype):
    if dtype in FP8:
        return torch.randn(shape, device=CUDA).to(dtype)
    return torch.randn(shape, dtype=dtype, device=CUDA)


def bits(t):
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


def make_cache(form, layout, num_pages, page_size, heads, dim, dtype):
    """(paged_kv_cache argument, K view, V view), random contents."""
    if form == "tuple":
        shape = (num_pages, page_size, heads, dim) if layout == "NHD" else (num_pages, heads, page_size, dim)
        k, v = randn(shape, dtype), randn(shape, dtype)
        return (k, v), k, v
    if form == "single":
        shape = (num_pages, 2, page_size, heads, dim) if layout == "NHD" else (num_pages, 2, heads, page_size, dim)
        c = randn(shape, dtype)
        return c, c[:, 0], c[:, 1]
    assert page_size == 1
    if form == "tuple3d":
        k, v = randn((num_pages, heads, dim), dtype), randn((num_pages, heads, dim), dtype)
        return (k, v), k, v
    c = randn((num_pages, 2, heads, dim), dtype)  # single4d
    return c, c[:, 0], c[:, 1]


def appended_rows(nnz, heads, dim, dtype, style):
    """(key, value): contiguous, views kv[:, 0] / kv[:, 1] of a packed buffer, or misaligned views."""
    if style == "contiguous":
        return randn((nnz, heads, dim), dtype), randn((nnz, heads, dim), dtype)
    if style == "strided":
        kv = randn((nnz, 2, heads, dim), dtype)
        return kv[:, 0], kv[:, 1]
    buf = randn((nnz, 2 * heads * dim + 1), dtype)  # misaligned: start 1 element in
    return (buf[:, 1:1 + heads * dim].unflatten(1, (heads, dim)),
            buf[:, 1 + heads * dim:].unflatten(1, (heads, dim)))


def run_append(form, layout, page_size, heads, dim, dtype, style="contiguous", old_lens=OLD_LENS, add_lens=ADD_LENS,
               index_dtype=torch.int32):
    total = [o + a for o, a in zip(old_lens, add_lens)]
    gen = torch.Generator().manual_seed(page_size * 1000 + heads + dim)
    table = ref.make_page_table(total, page_size, CUDA, generator=gen)
    cache, k, v = make_cache(form, layout, table.num_pages, page_size, heads, dim, dtype)
    k0, v0 = k.clone(), v.clone()
    append_indptr = [0]
    for a in add_lens:
        append_indptr.append(append_indptr[-1] + a)
    nnz = append_indptr[-1]
    seq_lens = flashinfer.get_seq_lens(table.indptr, table.last_page_len, page_size)
    assert seq_lens.tolist() == total
    bi, pos = flashinfer.get_batch_indices_positions(
        torch.tensor(append_indptr, dtype=torch.int32, device=CUDA), seq_lens, nnz)
    want_bi, want_pos = ref.batch_indices_positions(append_indptr, total, nnz)
    assert bi.tolist() == want_bi and pos.tolist() == want_pos
    key, value = appended_rows(nnz, heads, dim, dtype, style)
    key0, value0 = key.clone(), value.clone()
    out = flashinfer.append_paged_kv_cache(key, value, bi.to(index_dtype), pos.to(index_dtype), cache,
                                           table.indices.to(index_dtype), table.indptr.to(index_dtype),
                                           table.last_page_len.to(index_dtype), kv_layout=layout)
    assert out is None
    want_k, want_v = ref.append_scatter(bits(k0), bits(v0), bits(key), bits(value), bi, pos, table.indices,
                                        table.indptr, page_size, layout)
    assert torch.equal(bits(k), want_k), "K cache differs from the scatter reference"
    assert torch.equal(bits(v), want_v), "V cache differs from the scatter reference"
    assert torch.equal(bits(key), bits(key0)) and torch.equal(bits(value), bits(value0)), "inputs were modified"


def _forms(page_size):
    return ("tuple", "single", "tuple3d", "single4d") if page_size == 1 else ("tuple", "single")


APPEND_GRID = [
    pytest.param(ps, layout, form, dt, hd, id=f"ps{ps}-{layout}-{form}-{str(dt)[6:]}-hd{hd}",
                 marks=[pytest.mark.smoke] if (ps, hd) == (16, 128) and dt == torch.float16 else [])
    for ps in (1, 5, 16) for layout in ("NHD", "HND") for form in _forms(ps)
    for dt in (torch.float16, torch.bfloat16) for hd in (64, 128, 256)]


@pytest.mark.parametrize("page_size, layout, form, dtype, head_dim", APPEND_GRID)
def test_append_matches_scatter(page_size, layout, form, dtype, head_dim):
    run_append(form, layout, page_size, 4, head_dim, dtype)


@pytest.mark.parametrize("page_size, layout, style, dtype",
                         grid((1, 5, 16), ("NHD", "HND"), ("strided", "misaligned"), (torch.float16, torch.bfloat16)))
def test_append_strided_inputs(page_size, layout, style, dtype):
    run_append("single", layout, page_size, 4, 128, dtype, style=style)


@pytest.mark.parametrize("style", ("contiguous", "strided"))
def test_append_flashinfer_smoke_case(style):
    """FlashInfer's own case: append lengths [45, 8, 25, 22] into empty requests, page 16, 32 x 128."""
    run_append("single", "NHD", 16, 32, 128, torch.float16, style=style, old_lens=[0, 0, 0, 0],
               add_lens=[45, 8, 25, 22])


@pytest.mark.parametrize("dtype, layout, page_size", grid(FP8, ("NHD", "HND"), (1, 16)))
def test_append_fp8_cache(dtype, layout, page_size):
    run_append("tuple", layout, page_size, 4, 128, dtype)


@pytest.mark.parametrize("index_dtype", (torch.int64,))
def test_append_casts_index_tensors(index_dtype):
    run_append("tuple", "HND", 5, 2, 64, torch.bfloat16, index_dtype=index_dtype)


def test_append_mixed_index_dtypes():
    """One index tensor int64, the rest int32: the binding declines, Python casts and calls again."""
    total = [o + a for o, a in zip(OLD_LENS, ADD_LENS)]
    table = ref.make_page_table(total, 16, CUDA, generator=torch.Generator().manual_seed(3))
    cache, k, v = make_cache("tuple", "NHD", table.num_pages, 16, 2, 64, torch.float16)
    k0, v0 = k.clone(), v.clone()
    bi_l = [b for b, a in enumerate(ADD_LENS) for _ in range(a)]
    pos_l = [OLD_LENS[b] + i for b, a in enumerate(ADD_LENS) for i in range(a)]
    bi = torch.tensor(bi_l, dtype=torch.int32, device=CUDA)
    pos = torch.tensor(pos_l, dtype=torch.int64, device=CUDA)
    key, value = randn((len(bi_l), 2, 64), torch.float16), randn((len(bi_l), 2, 64), torch.float16)
    flashinfer.append_paged_kv_cache(key, value, bi, pos, cache, table.indices, table.indptr, table.last_page_len)
    want_k, want_v = ref.append_scatter(k0, v0, key, value, bi, pos.int(), table.indices, table.indptr, 16, "NHD")
    assert torch.equal(k, want_k) and torch.equal(v, want_v)


def test_int64_bad_index_raises_when_checked(check_indices):
    """The cast-and-retry path with index checking on (the error record is exported again)."""
    cache, k, v, indices, indptr, last, bi, pos, key, value = bad_index_case()
    bi = torch.zeros(6, dtype=torch.int64, device=CUDA)
    pos = torch.zeros(6, dtype=torch.int64, device=CUDA)
    pos[2] = -3
    with pytest.raises(ValueError, match=r"positions\[2\] = -3 is negative"):
        flashinfer.append_paged_kv_cache(key, value, bi, pos, cache, indices.long(), indptr, last)


@pytest.mark.parametrize("num_requests, page_size", [(300, 16), (300, 1), (255, 5), (256, 5)])
def test_append_many_requests(num_requests, page_size):
    """Page tables of 255-300 requests, a few tokens each: tokens i < batch size whose request is not
    i (the kernel's decode-step guess is wrong for them) next to ones whose request is i."""
    g = torch.Generator().manual_seed(num_requests)
    old = torch.randint(0, 40, (num_requests,), generator=g).tolist()
    add = torch.randint(0, 4, (num_requests,), generator=g).tolist()
    add[-1] = max(add[-1], 1)
    run_append("tuple", "NHD", page_size, 8, 128, torch.bfloat16, old_lens=old, add_lens=add)


@pytest.mark.parametrize("nnz", (1, 7, 64))
def test_append_decode_step(nnz):
    """Decode-sized appends: one token for each of nnz requests, into partly filled pages."""
    g = torch.Generator().manual_seed(nnz)
    old = torch.randint(0, 100, (nnz,), generator=g).tolist()
    run_append("tuple", "NHD", 16, 8, 128, torch.bfloat16, old_lens=old, add_lens=[1] * nnz)


@pytest.mark.parametrize("page_size", (1, 16))
def test_append_large(page_size):
    """Many tokens, many requests, random page order: the kernel's grid over (token, slot)."""
    g = torch.Generator().manual_seed(1)
    old = torch.randint(0, 64, (64,), generator=g).tolist()
    add = torch.randint(1, 128, (64,), generator=g).tolist()
    run_append("single", "HND", page_size, 8, 128, torch.bfloat16, old_lens=old, add_lens=add)


# (vecs_per_thread, threads) of _page._set_tuning (FLASHINFER_APPEND_VPT / _THREADS): every
# compiled kernel (V = 1 / 2 / 4 / 8; auto takes 1 for the small launches, 4 for the rest) and
# block sizes that put several tokens, or a token's slots across two blocks, in one block.
APPEND_TUNINGS = {"auto": (0, 0), "v1": (1, 256), "v2": (2, 256), "v4-t128": (4, 128), "v4-t1024": (4, 1024),
                  "v8": (8, 512), "v8-t128": (8, 128)}


@pytest.fixture(params=list(APPEND_TUNINGS))
def append_tuning(request):
    saved = _page._tuning()
    _page._set_tuning(*APPEND_TUNINGS[request.param])
    yield request.param
    _page._set_tuning(*saved)


@pytest.mark.parametrize("layout, heads, head_dim, dtype, style",
                         [("NHD", 8, 128, torch.bfloat16, "contiguous"),   # V = 4: one warp per token
                          ("HND", 8, 128, torch.bfloat16, "strided"),
                          ("NHD", 3, 64, torch.float16, "contiguous"),     # 24 vectors: slots not a warp
                          ("HND", 1, 256, torch.bfloat16, "contiguous"),
                          ("NHD", 5, 128, torch.float16, "misaligned"),    # the element-wise kernel
                          *[("NHD", 3, 128, dt, "contiguous") for dt in FP8]])  # 16-element vectors
def test_append_tunings(append_tuning, layout, heads, head_dim, dtype, style):
    """Every vectors-per-thread / block-size setting writes exactly the appended rows."""
    g = torch.Generator().manual_seed(heads * 1000 + head_dim)
    old = torch.randint(0, 40, (37,), generator=g).tolist()
    add = torch.randint(0, 30, (37,), generator=g).tolist()
    run_append("tuple", layout, 16 if heads != 3 else 5, heads, head_dim, dtype, style=style,
               old_lens=old, add_lens=add)


def test_append_nothing():
    cache, k, _ = make_cache("tuple", "NHD", 4, 16, 2, 64, torch.float16)
    k0 = k.clone()
    e = torch.empty(0, 2, 64, dtype=torch.float16, device=CUDA)
    i = torch.empty(0, dtype=torch.int32, device=CUDA)
    flashinfer.append_paged_kv_cache(e, e, i, i, cache, torch.zeros(1, dtype=torch.int32, device=CUDA),
                                     torch.tensor([0, 1], dtype=torch.int32, device=CUDA),
                                     torch.tensor([1], dtype=torch.int32, device=CUDA))
    assert torch.equal(k, k0)


# --- bad indices ------------------------------------------------------------------------------------

def bad_index_case():
    """One request of 2 pages (page size 4) in an 8-page cache; entries 1..4 are bad."""
    cache, k, v = make_cache("tuple", "NHD", 8, 4, 2, 64, torch.float16)
    indices = torch.tensor([5, 2, 7], dtype=torch.int32, device=CUDA)  # request 1's page 7 is fine
    indptr = torch.tensor([0, 2, 3], dtype=torch.int32, device=CUDA)
    last = torch.tensor([4, 1], dtype=torch.int32, device=CUDA)
    bi = torch.tensor([0, 2, 0, 0, -1, 1], dtype=torch.int32, device=CUDA)
    pos = torch.tensor([1, 0, -3, 8, 0, 2], dtype=torch.int32, device=CUDA)
    key = randn((6, 2, 64), torch.float16)
    value = randn((6, 2, 64), torch.float16)
    return cache, k, v, indices, indptr, last, bi, pos, key, value


def test_bad_indices_are_skipped():
    cache, k, v, indices, indptr, last, bi, pos, key, value = bad_index_case()
    k0, v0 = k.clone(), v.clone()
    flashinfer.append_paged_kv_cache(key, value, bi, pos, cache, indices, indptr, last)
    good = torch.tensor([0, 5], device=CUDA)
    want_k, want_v = ref.append_scatter(k0, v0, key[good], value[good], bi[good], pos[good], indices, indptr, 4, "NHD")
    assert torch.equal(k, want_k) and torch.equal(v, want_v)


@pytest.mark.parametrize("row, bi_val, pos_val, message", [
    (1, 2, 0, r"batch_indices\[1\] = 2 is outside \[0, 2\)"),
    (2, 0, -3, r"positions\[2\] = -3 is negative"),
    (3, 0, 8, r"positions\[3\] = 8 of request 0 lies beyond its pages"),
    (4, -1, 0, r"batch_indices\[4\] = -1 is outside \[0, 2\)"),
    # token 1 of request 1: the kernel's guess (token i belongs to request i) was right, so the
    # lookup used the indptr range read beside the token's indices
    (1, 1, -3, r"positions\[1\] = -3 is negative"),
    (1, 1, 40, r"positions\[1\] = 40 of request 1 lies beyond its pages"),
])
def test_bad_indices_raise_when_checked(check_indices, row, bi_val, pos_val, message):
    cache, k, v, indices, indptr, last, bi, pos, key, value = bad_index_case()
    bi = torch.zeros_like(bi)
    pos = torch.zeros_like(pos)
    bi[row], pos[row] = bi_val, pos_val
    with pytest.raises(ValueError, match=message):
        flashinfer.append_paged_kv_cache(key, value, bi, pos, cache, indices, indptr, last)


def test_bad_page_id_raises_when_checked(check_indices):
    cache, k, v, indices, indptr, last, bi, pos, key, value = bad_index_case()
    indices[1] = 8  # outside the 8-page cache
    bi = torch.zeros_like(bi)
    pos = torch.tensor([0, 1, 2, 3, 4, 5], dtype=torch.int32, device=CUDA)
    message = r"page id kv_indices holds for positions\[4\] = 4 of request 0 is outside \[0, 8\)"
    with pytest.raises(ValueError, match=message):
        flashinfer.append_paged_kv_cache(key, value, bi, pos, cache, indices, indptr, last)


# --- get_batch_indices_positions / get_seq_lens ---------------------------------------------------------

def test_documented_example():
    indptr = torch.tensor([0, 1, 3, 6, 10], dtype=torch.int32, device=CUDA)
    seq_lens = torch.tensor([5, 5, 5, 5], device=CUDA)
    bi, pos = flashinfer.get_batch_indices_positions(indptr, seq_lens, 10)
    assert bi.dtype == torch.int32 and pos.dtype == torch.int32 and bi.device == indptr.device
    assert bi.tolist() == [0, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    assert pos.tolist() == [4, 3, 4, 2, 3, 4, 1, 2, 3, 4]


@pytest.mark.parametrize("indptr_dtype, seq_dtype", grid((torch.int32, torch.int64), (torch.int32, torch.int64)))
def test_batch_indices_positions_random(indptr_dtype, seq_dtype):
    g = torch.Generator().manual_seed(9)
    add = torch.randint(0, 40, (300,), generator=g)
    add[::7] = 0  # empty requests
    seq = add + torch.randint(0, 1000, (300,), generator=g)
    indptr = [0] + torch.cumsum(add, 0).tolist()
    nnz = indptr[-1] + 5  # 5 entries beyond the last request
    bi, pos = flashinfer.get_batch_indices_positions(torch.tensor(indptr, dtype=indptr_dtype, device=CUDA),
                                                     seq.to(CUDA, seq_dtype), nnz)
    want_bi, want_pos = ref.batch_indices_positions(indptr, seq.tolist(), nnz)
    assert bi.tolist() == want_bi and pos.tolist() == want_pos


def test_batch_indices_positions_into_given_buffers():
    indptr = torch.tensor([0, 2, 3], dtype=torch.int32, device=CUDA)
    seq = torch.tensor([4, 9], dtype=torch.int32, device=CUDA)
    bi = torch.full((5,), 77, dtype=torch.int32, device=CUDA)
    pos = torch.full((5,), 77, dtype=torch.int32, device=CUDA)
    rb, rp = flashinfer.get_batch_indices_positions(indptr, seq, 5, batch_indices=bi, positions=pos)
    assert rb is bi and rp is pos
    assert bi.tolist() == [0, 0, 1, -1, -1]
    assert pos.tolist() == [2, 3, 8, 77, 77]  # a given positions buffer keeps its tail


def test_get_seq_lens_cuda():
    indptr = torch.tensor([0, 3, 4, 4, 6], dtype=torch.int32, device=CUDA)
    last = torch.tensor([13, 8, 0, 6], dtype=torch.int32, device=CUDA)
    got = flashinfer.get_seq_lens(indptr, last, 16)
    assert got.device == indptr.device and got.tolist() == ref.seq_lens(indptr.cpu(), last.cpu(), 16)


def test_append_in_a_cuda_graph():
    cache, k, v = make_cache("tuple", "HND", 6, 16, 2, 128, torch.bfloat16)
    indices = torch.tensor([3, 1], dtype=torch.int32, device=CUDA)
    indptr = torch.tensor([0, 2], dtype=torch.int32, device=CUDA)
    last = torch.tensor([4], dtype=torch.int32, device=CUDA)
    bi = torch.zeros(20, dtype=torch.int32, device=CUDA)
    pos = torch.arange(20, dtype=torch.int32, device=CUDA)
    key, value = randn((20, 2, 128), torch.bfloat16), randn((20, 2, 128), torch.bfloat16)
    k0, v0 = k.clone(), v.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        flashinfer.append_paged_kv_cache(key, value, bi, pos, cache, indices, indptr, last, "HND")
    torch.cuda.current_stream().wait_stream(s)
    k.copy_(k0)
    v.copy_(v0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        flashinfer.append_paged_kv_cache(key, value, bi, pos, cache, indices, indptr, last, "HND")
    k.copy_(k0)
    v.copy_(v0)
    g.replay()
    torch.cuda.synchronize()
    want_k, want_v = ref.append_scatter(k0, v0, key, value, bi, pos, indices, indptr, 16, "HND")
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
