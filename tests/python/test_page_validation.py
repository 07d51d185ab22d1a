"""flashinfer.page on the CPU: append_paged_kv_cache argument validation (every check runs
before the device check, so CPU tensors reach it), get_batch_indices_positions (which also runs
on CPU tensors) and get_seq_lens, against the references in reference_page.py."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

import flashinfer  # noqa: E402
import reference_page as ref  # noqa: E402

OP = "append_paged_kv_cache"
F16 = torch.float16


def args(form="tuple", layout="NHD", nnz=5, heads=2, dim=64, page_size=4, pages=6, batch=2, dtype=F16):
    """Keyword arguments valid in everything but the device."""
    if form == "tuple":
        shape = (pages, page_size, heads, dim) if layout == "NHD" else (pages, heads, page_size, dim)
        cache = (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
    elif form == "single":
        shape = (pages, 2, page_size, heads, dim) if layout == "NHD" else (pages, 2, heads, page_size, dim)
        cache = torch.zeros(shape, dtype=dtype)
    elif form == "tuple3d":
        cache = (torch.zeros(pages, heads, dim, dtype=dtype), torch.zeros(pages, heads, dim, dtype=dtype))
    else:
        cache = torch.zeros(pages, 2, heads, dim, dtype=dtype)
    return dict(append_key=torch.zeros(nnz, heads, dim, dtype=dtype),
                append_value=torch.zeros(nnz, heads, dim, dtype=dtype),
                batch_indices=torch.zeros(nnz, dtype=torch.int32), positions=torch.arange(nnz, dtype=torch.int32),
                paged_kv_cache=cache, kv_indices=torch.arange(3, dtype=torch.int32),
                kv_indptr=torch.tensor([0, 2, 3][:batch + 1], dtype=torch.int32),
                kv_last_page_len=torch.tensor([1, 2][:batch], dtype=torch.int32), kv_layout=layout)


def raises(message, exc=ValueError):
    return pytest.raises(exc, match="^" + re.escape(f"{OP}: {message}"))


@pytest.mark.parametrize("form, layout", [(f, lay) for f in ("tuple", "single", "tuple3d", "single4d")
                                          for lay in ("NHD", "HND")])
def test_every_cache_form_reaches_the_device_check(form, layout):
    a = args(form, layout, page_size=1 if form in ("tuple3d", "single4d") else 4)
    with raises("append_key must be a CUDA tensor; got a tensor on device type cpu"):
        flashinfer.append_paged_kv_cache(**a)


def test_kv_layout_and_cache_type_errors_are_key_errors():
    a = args()
    a["kv_layout"] = "NDH"
    with pytest.raises(KeyError, match="Invalid kv_layout NDH"):
        flashinfer.append_paged_kv_cache(**a)
    a = args()
    a["paged_kv_cache"] = 3
    with pytest.raises(KeyError, match="Unrecognized paged_kv_cache type"):
        flashinfer.append_paged_kv_cache(**a)
    a = args()
    a["paged_kv_cache"] = a["paged_kv_cache"] + (a["paged_kv_cache"][0],)
    with pytest.raises(ValueError, match=r"must be \(k_cache, v_cache\); got 3 items"):
        flashinfer.append_paged_kv_cache(**a)


def test_single_tensor_form_errors():
    a = args()
    a["paged_kv_cache"] = torch.zeros(6, 4, 2, 64, 2, dtype=F16)
    with raises("paged_kv_cache.shape[1] must be 2 (K and V); got 4 (shape (6, 4, 2, 64, 2))"):
        flashinfer.append_paged_kv_cache(**a)
    a["paged_kv_cache"] = torch.zeros(6, 2, 64, dtype=F16)
    with raises("paged_kv_cache must be a 5-D [max_num_pages, 2, page_size, num_kv_heads, head_dim] or 4-D "
                "[max_num_pages, 2, num_kv_heads, head_dim] tensor; got a 3-D tensor of shape (6, 2, 64)"):
        flashinfer.append_paged_kv_cache(**a)
    a["paged_kv_cache"] = torch.zeros(6, 2, 4, 2, 64, dtype=torch.float32)
    with raises("paged_kv_cache.dtype must be float16, bfloat16 or a float8 type; got float32"):
        flashinfer.append_paged_kv_cache(**a)
    a["paged_kv_cache"] = torch.zeros(6, 2, 4, 2, 128, dtype=F16)[..., ::2]
    with raises("paged_kv_cache must be contiguous in its last dimension (stride 1); got stride 2"):
        flashinfer.append_paged_kv_cache(**a)


def test_tuple_form_errors():
    a = args()
    k, v = a["paged_kv_cache"]
    a["paged_kv_cache"] = (k, torch.zeros(6, 4, 2, 32, dtype=F16))
    with raises("paged_kv_cache[1] (v_cache).shape must equal k_cache.shape (6, 4, 2, 64); got (6, 4, 2, 32)"):
        flashinfer.append_paged_kv_cache(**a)
    a["paged_kv_cache"] = (k, v.bfloat16())
    with raises("v_cache.dtype must equal k_cache.dtype (float16); got bfloat16"):
        flashinfer.append_paged_kv_cache(**a)
    a["paged_kv_cache"] = (k, torch.zeros(6, 8, 2, 64, dtype=F16)[:, ::2])  # same shape, other strides
    with raises("k_cache and v_cache must have identical strides; got (512, 128, 64, 1) and (1024, 256, 64, 1)",
                exc=RuntimeError):
        flashinfer.append_paged_kv_cache(**a)
    a["paged_kv_cache"] = (k, k)  # one tensor as both caches: V would overwrite every appended K
    with raises("paged_kv_cache[1] (v_cache) must not be the same memory as paged_kv_cache[0] (k_cache)"):
        flashinfer.append_paged_kv_cache(**a)
    both = torch.zeros(6, 2, 4, 2, 64, dtype=F16)  # K and V halves of one buffer: accepted
    a["paged_kv_cache"] = (both[:, 0], both[:, 1])
    with raises("append_key must be a CUDA tensor"):
        flashinfer.append_paged_kv_cache(**a)
    a["paged_kv_cache"] = (torch.zeros(6, 64, dtype=F16), torch.zeros(6, 64, dtype=F16))
    with raises("paged_kv_cache[0] (k_cache) must be 4-D [max_num_pages, page_size, num_kv_heads, head_dim] or 3-D "
                "[max_num_pages, num_kv_heads, head_dim]; got a 2-D tensor of shape (6, 64)"):
        flashinfer.append_paged_kv_cache(**a)


def test_cache_entries_that_overlap_are_refused():
    """The append writes K and V of every page, slot and head: views whose entries share memory
    (K and V one page apart in one buffer, an expanded K/V or slot dim) would race or write one
    cache into the other; a page_size of 0 holds nothing. The layouts caches are allocated and
    sliced in pass on to the device check."""
    overlap = ("the entries of paged_kv_cache (K and V of every page, slot and head) must not overlap in memory "
               "(the kernel writes them); got ")
    buf = torch.zeros(8, 4, 2, 64, dtype=F16)
    cases = {
        "k_cache of shape (6, 4, 2, 64) and strides (512, 128, 64, 1), v_cache 1024 bytes after it":
            (buf[:6], buf[1:7]),
        "shape (6, 2, 4, 2, 64) and strides (512, 0, 128, 64, 1)":
            torch.zeros(6, 1, 4, 2, 64, dtype=F16).expand(6, 2, 4, 2, 64),
        "k_cache of shape (6, 4, 2, 64) and strides (512, 0, 64, 1), v_cache 512 bytes after it":
            (buf[:6, :1].expand(6, 4, 2, 64), buf[:6, 2:3].expand(6, 4, 2, 64)),
    }
    for got, cache in cases.items():
        a = args()
        a["paged_kv_cache"] = cache
        with raises(overlap + got):
            flashinfer.append_paged_kv_cache(**a)
    half = (6, 4, 2, 64), (512, 128, 32, 1)  # heads half a row apart, in two buffers
    a = args()
    a["paged_kv_cache"] = tuple(torch.zeros(6 * 512, dtype=F16).as_strided(*half) for _ in range(2))
    with raises(overlap + "k_cache of shape (6, 4, 2, 64) and strides (512, 128, 32, 1), v_cache "):
        flashinfer.append_paged_kv_cache(**a)
    a = args()
    a["paged_kv_cache"] = (torch.zeros(6, 0, 2, 64, dtype=F16), torch.zeros(6, 0, 2, 64, dtype=F16))
    with raises("paged_kv_cache's page_size must be >= 1; got shape (6, 0, 2, 64)"):
        flashinfer.append_paged_kv_cache(**a)
    big = torch.zeros(12, 4, 2, 64, dtype=F16)
    padded = [torch.zeros(6, 5, 2, 64, dtype=F16)[:, :4] for _ in range(2)]  # page strides beyond the page
    for cache in ((big[:6], big[6:]), (big[6:], big[:6]), tuple(padded),
                  torch.zeros(6, 2, 4, 2, 64, dtype=F16), torch.zeros(6, 2, 2, 4, 64, dtype=F16).transpose(2, 3)):
        a = args()
        a["paged_kv_cache"] = cache
        with raises("append_key must be a CUDA tensor"):
            flashinfer.append_paged_kv_cache(**a)


def test_append_rows_errors():
    a = args()
    a["append_key"] = torch.zeros(5, 2, 64, dtype=torch.bfloat16)
    with raises("append_key.dtype must equal the cache dtype (float16); got bfloat16"):
        flashinfer.append_paged_kv_cache(**a)
    a = args()
    a["append_key"] = torch.zeros(5, 3, 64, dtype=F16)
    with raises("append_key.shape[1] must equal the cache's num_kv_heads (2); got 3"):
        flashinfer.append_paged_kv_cache(**a)
    a = args(layout="HND")
    a["append_key"] = torch.zeros(5, 2, 32, dtype=F16)
    with raises("append_key.shape[2] must equal the cache's head_dim (64); got 32"):
        flashinfer.append_paged_kv_cache(**a)
    a = args()
    a["append_value"] = torch.zeros(4, 2, 64, dtype=F16)
    with raises("append_value.shape must equal append_key.shape (5, 2, 64); got (4, 2, 64)"):
        flashinfer.append_paged_kv_cache(**a)
    a = args()
    a["append_key"] = torch.zeros(5, 2, 128, dtype=F16)[..., ::2]
    with raises("append_key must be contiguous in its last dimension (stride 1); got stride 2"):
        flashinfer.append_paged_kv_cache(**a)
    a = args()
    a["append_key"] = torch.zeros(5, 128, dtype=F16)
    with raises("append_key must be 3-D [nnz, num_kv_heads, head_dim]; got a 2-D tensor of shape (5, 128)"):
        flashinfer.append_paged_kv_cache(**a)


def test_index_tensor_errors():
    a = args()
    a["batch_indices"] = torch.zeros(4, dtype=torch.int32)
    with raises("batch_indices.shape[0] must equal append_key.shape[0] (nnz) (5); got 4"):
        flashinfer.append_paged_kv_cache(**a)
    a = args()
    a["positions"] = torch.zeros(6, dtype=torch.int64)  # int64 is cast; the length is still checked
    with raises("positions.shape[0] must equal append_key.shape[0] (nnz) (5); got 6"):
        flashinfer.append_paged_kv_cache(**a)
    a = args()
    a["kv_indptr"] = torch.tensor([0, 3], dtype=torch.int32)
    with raises("kv_indptr.shape[0] must equal kv_last_page_len.shape[0] + 1 (batch_size + 1) (3); got 2"):
        flashinfer.append_paged_kv_cache(**a)
    a = args()
    a["kv_last_page_len"] = torch.ones(2, 1, dtype=torch.int32)
    with raises("kv_last_page_len must be 1-D; got a 2-D tensor of shape (2, 1)"):
        flashinfer.append_paged_kv_cache(**a)
    a = args()
    a["kv_indices"] = torch.arange(6, dtype=torch.int32)[::2]
    with raises("kv_indices must be contiguous; got stride 2"):
        flashinfer.append_paged_kv_cache(**a)


def test_int64_index_tensors_are_cast():
    a = args()
    for name in ("batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len"):
        a[name] = a[name].to(torch.int64)
    with raises("append_key must be a CUDA tensor"):
        flashinfer.append_paged_kv_cache(**a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bool, torch.complex64])
def test_index_tensors_that_are_not_integers_are_refused(dtype):
    """A float, bool or complex index tensor is refused (a cast would truncate 1.7 to 1 and write
    an entry somewhere else), naming it."""
    for name in ("batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len"):
        a = args()
        a[name] = a[name].to(dtype)
        with pytest.raises(ValueError, match=re.escape(f"{name}.dtype must be an integer type (int32; other integer "
                                                       f"types are cast); got {dtype}")):
            flashinfer.append_paged_kv_cache(**a)


def test_wide_index_values_checked_in_index_check_mode(monkeypatch):
    """int64 indices are cast; values beyond int32 would wrap to other entries, so the opt-in index
    check (which reads the indices anyway) refuses them."""
    from flashinfer import _index_check
    monkeypatch.setattr(_index_check, "enabled", True)
    a = args()
    a["positions"] = torch.tensor([0, 1, 2, 3, 2**32 + 1])
    with pytest.raises(ValueError, match=re.escape("positions holds values outside int32 (min 0, max 4294967297)")):
        flashinfer.append_paged_kv_cache(**a)


def test_fp8_cache_accepted():
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is None:
        pytest.skip("no float8 in this torch")
    a = args(dtype=fp8)
    with raises("append_key must be a CUDA tensor"):
        flashinfer.append_paged_kv_cache(**a)
    a["append_key"] = a["append_key"].to(F16)
    with raises("append_key.dtype must equal the cache dtype (float8_e4m3fn); got float16"):
        flashinfer.append_paged_kv_cache(**a)


# --- get_batch_indices_positions (runs on the CPU too) and get_seq_lens -----------------------------

def test_documented_example_on_cpu():
    indptr = torch.tensor([0, 1, 3, 6, 10], dtype=torch.int32)
    bi, pos = flashinfer.get_batch_indices_positions(indptr, torch.tensor([5, 5, 5, 5]), 10)
    assert bi.dtype == torch.int32 and pos.dtype == torch.int32
    assert bi.tolist() == [0, 1, 1, 2, 2, 2, 3, 3, 3, 3]
    assert pos.tolist() == [4, 3, 4, 2, 3, 4, 1, 2, 3, 4]


@pytest.mark.parametrize("seed", range(5))
def test_batch_indices_positions_random_on_cpu(seed):
    g = torch.Generator().manual_seed(seed)
    add = torch.randint(0, 9, (40,), generator=g)
    add[::5] = 0
    seq = add + torch.randint(0, 50, (40,), generator=g)
    indptr = [0] + torch.cumsum(add, 0).tolist()
    for extra in (0, 3):
        nnz = indptr[-1] + extra
        bi, pos = flashinfer.get_batch_indices_positions(torch.tensor(indptr), seq.int(), nnz)
        assert (bi.tolist(), pos.tolist()) == ref.batch_indices_positions(indptr, seq.tolist(), nnz)
    bi, pos = flashinfer.get_batch_indices_positions(torch.tensor(indptr), seq, 0)
    assert bi.shape == (0,) and pos.shape == (0,)


def test_given_buffers_are_validated_like_flashinfer():
    indptr = torch.tensor([0, 2], dtype=torch.int32)
    seq = torch.tensor([5])
    with pytest.raises(ValueError, match=re.escape("Invalid shape of batch_indices: expected (2,), got (3,)")):
        flashinfer.get_batch_indices_positions(indptr, seq, 2, batch_indices=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="Invalid dtype of positions: expected torch.int32, got torch.int64"):
        flashinfer.get_batch_indices_positions(indptr, seq, 2, positions=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="Invalid device of batch_indices"):
        flashinfer.get_batch_indices_positions(indptr, seq, 2, batch_indices=torch.zeros(2, dtype=torch.int32,
                                                                                            device="meta"))
    bi = torch.full((3,), 9, dtype=torch.int32)
    pos = torch.full((3,), 9, dtype=torch.int32)
    rb, rp = flashinfer.get_batch_indices_positions(indptr, seq, 3, bi, pos)
    assert rb is bi and rp is pos and bi.tolist() == [0, 0, -1] and pos.tolist() == [3, 4, 9]


def test_batch_indices_positions_argument_errors():
    op = "get_batch_indices_positions"
    with pytest.raises(ValueError, match=re.escape(f"{op}: seq_lens.shape[0] must equal append_indptr.shape[0] - 1 "
                                                   "(batch_size) (2); got 3")):
        flashinfer.get_batch_indices_positions(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 3]), 2)
    with pytest.raises(ValueError, match=re.escape(f"{op}: append_indptr.dtype must be int32 or int64; got float32")):
        flashinfer.get_batch_indices_positions(torch.tensor([0.0, 1.0]), torch.tensor([1]), 1)
    with pytest.raises(ValueError, match=re.escape(f"{op}: append_indptr must have batch_size + 1 >= 1 elements")):
        flashinfer.get_batch_indices_positions(torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), 0)
    with pytest.raises(ValueError, match="nnz must be >= 0; got -1"):
        flashinfer.get_batch_indices_positions(torch.tensor([0, 1]), torch.tensor([1]), -1)


def test_get_seq_lens_on_cpu():
    indptr = torch.tensor([0, 3, 4, 4, 6], dtype=torch.int32)
    last = torch.tensor([13, 8, 0, 6], dtype=torch.int32)
    got = flashinfer.get_seq_lens(indptr, last, 16)
    assert got.tolist() == ref.seq_lens(indptr, last, 16) == [45, 8, 0, 22]
    want = torch.clamp(indptr[1:] - indptr[:-1] - 1, min=0) * 16 + last  # FlashInfer's formula
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_get_seq_lens_argument_errors():
    indptr = torch.tensor([0, 3, 4, 4, 6], dtype=torch.int32)
    last = torch.tensor([13, 8, 0, 6], dtype=torch.int32)
    for page_size, exc, msg in ((0, ValueError, "page_size must be >= 1; got 0"),
                                (-16, ValueError, "page_size must be >= 1; got -16"),
                                (16.5, TypeError, "page_size must be an integer; got float")):
        with pytest.raises(exc, match="^" + re.escape(msg) + "$"):
            flashinfer.get_seq_lens(indptr, last, page_size)
    with pytest.raises(ValueError, match=re.escape("kv_indptr must have kv_last_page_len.shape[0] + 1 (batch_size + "
                                                   "1) = 2 elements; got 5")):
        flashinfer.get_seq_lens(indptr, last[:1], 16)  # (a broadcast would hide the mismatch)
    with pytest.raises(ValueError, match=re.escape("kv_indptr must be a 1-D integer tensor; got shape (5,) and dtype "
                                                   "torch.float32")):
        flashinfer.get_seq_lens(indptr.float(), last, 16)
    with pytest.raises(ValueError, match=re.escape("kv_last_page_len must be a 1-D integer tensor; got shape () and "
                                                   "dtype torch.int32")):
        flashinfer.get_seq_lens(indptr[:2], last[0], 16)
    with pytest.raises(TypeError, match="^kv_indptr must be a tensor supporting DLPack .*; got list$"):
        flashinfer.get_seq_lens([0, 3], last[:1], 16)
    assert flashinfer.get_seq_lens(indptr, last, torch.tensor(16)).tolist() == [45, 8, 0, 22]  # (an integer tensor)


def test_batch_indices_positions_outputs_apart_and_named():
    """Given outputs that share memory with each other or an input would be read after being
    written (wrong answers): refused, naming them; a non-tensor buffer or a fractional nnz named."""
    op = "get_batch_indices_positions"
    indptr = torch.tensor([0, 2], dtype=torch.int32)
    seq = torch.tensor([5], dtype=torch.int32)
    both = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ValueError, match=re.escape(f"{op}: batch_indices must not overlap positions in memory (it is "
                                                   "written)")):
        flashinfer.get_batch_indices_positions(indptr, seq, 2, both[:2], both[1:3])
    with pytest.raises(ValueError, match=re.escape(f"{op}: batch_indices must not overlap positions in memory")):
        flashinfer.get_batch_indices_positions(indptr, seq, 2, both[:2], both[:2])
    buf = torch.tensor([0, 2, 0, 0], dtype=torch.int32)
    with pytest.raises(ValueError, match=re.escape(f"{op}: positions must not overlap append_indptr in memory")):
        flashinfer.get_batch_indices_positions(buf[:2], seq, 2, positions=buf[1:3])
    with pytest.raises(ValueError, match=re.escape(f"{op}: batch_indices must not overlap seq_lens in memory")):
        flashinfer.get_batch_indices_positions(indptr, buf[3:], 1, batch_indices=buf[3:])
    bi, pos = flashinfer.get_batch_indices_positions(indptr, seq, 2, both[:2], both[2:])  # adjacent: fine
    assert bi.tolist() == [0, 0] and pos.tolist() == [3, 4]
    with pytest.raises(TypeError, match="^positions must be a tensor supporting DLPack .*; got list$"):
        flashinfer.get_batch_indices_positions(indptr, seq, 2, positions=[0, 0])
    for nnz, name in ((2.7, "float"), ("2", "str")):
        with pytest.raises(TypeError, match=f"^nnz must be an integer; got {name}$"):
            flashinfer.get_batch_indices_positions(indptr, seq, nnz)


# --- the FLASHINFER_APPEND_VPT / FLASHINFER_APPEND_THREADS knobs ------------------------------

_APPEND_PROBE = "from flashinfer import _page; print(_page._tuning())"


def _append_probe(env):
    import os
    import subprocess
    import sys
    full = {k: v for k, v in os.environ.items() if not k.startswith("FLASHINFER_APPEND_")}
    full.update(env)
    r = subprocess.run([sys.executable, "-c", _APPEND_PROBE], env=full, capture_output=True, text=True, check=True)
    return r.stdout.strip()


def test_append_tuning_from_environment():
    """Read once at start-up; invalid values mean auto (0)."""
    assert _append_probe({}) == "(0, 0)"
    assert _append_probe({"FLASHINFER_APPEND_VPT": "8", "FLASHINFER_APPEND_THREADS": "512"}) == "(8, 512)"
    assert _append_probe({"FLASHINFER_APPEND_VPT": "3", "FLASHINFER_APPEND_THREADS": "96"}) == "(0, 0)"


def test_append_set_tuning_round_trip():
    from flashinfer import _page
    saved = _page._tuning()
    try:
        _page._set_tuning(8, 128)
        assert _page._tuning() == (8, 128)
        with pytest.raises(ValueError, match=re.escape("vecs_per_thread must be 0 (auto), 1, 2, 4 or 8; got 3")):
            _page._set_tuning(3, 0)
        with pytest.raises(ValueError, match=re.escape("threads must be 0 (auto), 128, 256, 512 or 1024; got 96")):
            _page._set_tuning(0, 96)
        assert _page._tuning() == (8, 128), "a rejected call must not change the tuning"
    finally:
        _page._set_tuning(*saved)
    assert _page._tuning() == saved


@pytest.mark.parametrize("value", [[0, 1], 3.5])
@pytest.mark.parametrize("form", ["tuple", "single"])
def test_every_non_tensor_argument_is_a_type_error_naming_it(value, form):
    a = args(form)
    names = ["append_key", "append_value", "batch_indices", "positions", "kv_indices", "kv_indptr",
             "kv_last_page_len"]
    for arg in names:
        with pytest.raises(TypeError, match=f"^{arg} must be a tensor supporting DLPack .*; got "
                                            f"{type(value).__name__}$"):
            flashinfer.append_paged_kv_cache(**dict(a, **{arg: value}))
    if form == "tuple":
        for i in range(2):
            cache = list(a["paged_kv_cache"])
            cache[i] = value
            with pytest.raises(TypeError, match=rf"^paged_kv_cache(\[1\])? must be a tensor supporting DLPack"):
                flashinfer.append_paged_kv_cache(**dict(a, paged_kv_cache=tuple(cache)))
