"""GPU correctness tests for flashinfer.rope against the float64 references in reference_rope.py.

Grid (at least FlashInfer's test_rope.py on every axis, not its full cross product): head_dim
64/128/256, rotary_dim = head_dim * {1/4, 1/2, 3/4, 1}, interleave on/off, plain and Llama-3.1
frequencies, in place and not, fp16/bf16, batch 1/19/99/989 x qkv_len 1/4/19/204 x offset
0/15/99 (bounded by total tokens), q/k head counts (32,8) (16,8) (8,8) (8,1) (7,3), pos_ids
int32/int64 against the indptr form, positions up to 1e6, the cos/sin-cache form against
vLLM's forward_native for (head_size, rotary_dim) in (64,64) (256,128) (64,32) (192,128)
(80,64) (112,64) (160,96), and the scalar fallback (misaligned views, rotary_dim not a
multiple of 16, odd head_dim). q and k are strided views of a packed QKV buffer unless a test
says otherwise; in-place tests check that the rest of that buffer (V, and the pass-through
features) is bit-identical afterwards.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import flashinfer  # noqa: E402
import reference_rope as ref  # noqa: E402
from checks import CUDA, DTYPES, assert_close, grid  # noqa: E402
from flashinfer import _index_check  # noqa: E402

pytestmark = pytest.mark.gpu

HEAD_DIMS = (64, 128, 256)
ROTARY_FACTORS = (0.25, 0.5, 0.75, 1.0)


def packed_qk(nnz, hq, hk, d, dtype, shift=0):
    """q [nnz, hq, d] and k [nnz, hk, d] as views of a packed [nnz, (hq + 2 hk) d + shift] QKV
    buffer, starting `shift` elements in; returns (q, k, buf)."""
    buf = torch.randn(nnz, (hq + 2 * hk) * d + shift, dtype=dtype, device=CUDA)
    q = buf[:, shift:shift + hq * d].unflatten(1, (hq, d))
    k = buf[:, shift + hq * d:shift + (hq + hk) * d].unflatten(1, (hk, d))
    return q, k, buf


def ragged(lens, offsets, dtype=torch.int32):
    indptr = [0]
    for n in lens:
        indptr.append(indptr[-1] + n)
    return (torch.tensor(indptr, dtype=dtype, device=CUDA), torch.tensor(offsets, dtype=dtype, device=CUDA))


def random_ragged(batch, max_len, gen_seed, dtype=torch.int32):
    g = torch.Generator().manual_seed(gen_seed)
    lens = torch.randint(0, max_len + 1, (batch,), generator=g).tolist()
    lens[0] = max(lens[0], 1)
    offsets = torch.randint(0, 100, (batch,), generator=g).tolist()
    return ragged(lens, offsets, dtype)


@pytest.fixture(autouse=True)
def _indices_unchecked():
    """Index checking off (whatever FLASHINFER_CHECK_INDICES says) unless a test asks for it:
    it syncs the host, which CUDA-graph capture forbids."""
    old = _index_check.enabled
    _index_check.set_check_indices(False)
    yield
    _index_check.set_check_indices(old)


def call(name, q, k, pos_args, **kw):
    """Runs flashinfer.<name>; returns the (q, k) results (the inputs themselves when in place)."""
    out = getattr(flashinfer, name)(q, k, *pos_args, **kw)
    if name.endswith("_inplace"):
        assert out is None, f"{name} must return None; got {type(out).__name__}"
        return q, k
    q_rope, k_rope = out
    assert q_rope.shape == q.shape and k_rope.shape == k.shape
    assert q_rope.dtype == q.dtype and q_rope.device == q.device
    return q_rope, k_rope


def llama_kw(llama31, rope_scale=None, rope_theta=None):
    kw = {}
    if rope_scale is not None:
        kw["rope_scale"] = rope_scale
    if rope_theta is not None:
        kw["rope_theta"] = rope_theta
    ref_kw = dict(rope_scale=kw.get("rope_scale", 8.0 if llama31 else 1.0),
                  rope_theta=kw.get("rope_theta", 5e5 if llama31 else 1e4), llama31=llama31)
    return kw, ref_kw


def fn_name(llama31, form, inplace):
    base = "apply_llama31_rope" if llama31 else "apply_rope"
    if form == "pos_ids":
        base += "_pos_ids"
    return base + ("_inplace" if inplace else "")


def _is_smoke(dtype, head_dim, factor, interleave, llama31, inplace):
    return head_dim == 128 and factor in (0.5, 1.0) and not llama31 and not inplace


# --- the main grid: head_dim x rotary_dim x interleave x llama31 x in place ---------------------

@pytest.mark.parametrize("dtype, head_dim, factor, interleave, llama31, inplace",
                         grid(DTYPES, HEAD_DIMS, ROTARY_FACTORS, (False, True), (False, True), (False, True),
                              smoke=_is_smoke))
def test_rope_ragged_matches_reference(dtype, head_dim, factor, interleave, llama31, inplace):
    indptr, offsets = random_ragged(7, 23, gen_seed=head_dim)
    nnz = int(indptr[-1])
    hq, hk = 16, 8
    rd = int(head_dim * factor)
    q, k, buf = packed_qk(nnz, hq, hk, head_dim, dtype)
    buf_before = buf.clone()
    pos = ref.positions_from_indptr(indptr, offsets)
    kw, ref_kw = llama_kw(llama31)
    want_q = ref.rope(q, pos, rd, interleave, **ref_kw)
    want_k = ref.rope(k, pos, rd, interleave, **ref_kw)
    got_q, got_k = call(fn_name(llama31, "indptr", inplace), q, k, (indptr, offsets), rotary_dim=rd,
                        interleave=interleave, **kw)
    assert_close(got_q, want_q, "q_rope")
    assert_close(got_k, want_k, "k_rope")
    v = slice((hq + hk) * head_dim, None)
    if inplace:
        assert torch.equal(buf[:, v], buf_before[:, v]), "the V part of the packed buffer was modified"
        # pass-through features are not rewritten at all (bit-identical, not just close)
        assert torch.equal(q[..., rd:], buf_before[:, :hq * head_dim].view(nnz, hq, head_dim)[..., rd:])
    else:
        assert torch.equal(buf, buf_before), "apply_rope modified its input"


# --- pos_ids form == indptr form -------------------------------------------------------------------

@pytest.mark.parametrize("dtype, interleave, llama31, idtype",
                         grid(DTYPES, (False, True), (False, True), (torch.int32, torch.int64)))
def test_pos_ids_form_equals_indptr_form(dtype, interleave, llama31, idtype):
    indptr, offsets = random_ragged(11, 40, gen_seed=3, dtype=idtype)
    nnz = int(indptr[-1])
    q, k, _ = packed_qk(nnz, 8, 8, 128, dtype)
    pos_ids = ref.positions_from_indptr(indptr, offsets).to(idtype)
    for inplace in (False, True):
        a_q, a_k = call(fn_name(llama31, "indptr", inplace), q.clone(), k.clone(), (indptr, offsets),
                        interleave=interleave)
        b_q, b_k = call(fn_name(llama31, "pos_ids", inplace), q.clone(), k.clone(), (pos_ids,),
                        interleave=interleave)
        assert torch.equal(a_q, b_q) and torch.equal(a_k, b_k), "pos_ids and indptr forms differ"
    want = ref.rope(q, pos_ids, None, interleave, **llama_kw(llama31)[1])
    assert_close(b_q, want)


# --- FlashInfer's batch-shape grid ----------------------------------------------------------------

BATCH_SHAPES = [(b, n, o) for b in (1, 19, 99, 989) for n in (1, 4, 19, 204) for o in (0, 15, 99) if b * n <= 20000]


@pytest.mark.parametrize("dtype, batch, qkv_len, offset", [
    pytest.param(dt, b, n, o, id=f"{str(dt)[6:]}-b{b}-len{n}-off{o}",
                 marks=[pytest.mark.smoke] if (b, n, o) == (19, 19, 15) else [])
    for dt in DTYPES for b, n, o in BATCH_SHAPES])
def test_rope_batch_shapes(dtype, batch, qkv_len, offset):
    indptr, offsets = ragged([qkv_len] * batch, [offset] * batch)
    nnz = batch * qkv_len
    q, k, _ = packed_qk(nnz, 16, 8, 128, dtype)
    pos = ref.positions_from_indptr(indptr, offsets)
    got_q, got_k = flashinfer.apply_rope(q, k, indptr, offsets)
    assert_close(got_q, ref.rope(q, pos), "q_rope")
    assert_close(got_k, ref.rope(k, pos), "k_rope")


# --- head counts, frequencies, positions ------------------------------------------------------------

@pytest.mark.parametrize("dtype, hq, hk, interleave", grid(DTYPES, (32, 16, 8, 7), (8, 1, 3), (False, True)))
def test_rope_head_counts(dtype, hq, hk, interleave):
    nnz = 37
    q, k, _ = packed_qk(nnz, hq, hk, 128, dtype)
    pos = torch.randint(0, 5000, (nnz,), device=CUDA, dtype=torch.int32)
    got_q, got_k = flashinfer.apply_rope_pos_ids(q, k, pos, interleave=interleave)
    assert_close(got_q, ref.rope(q, pos, interleave=interleave), "q_rope")
    assert_close(got_k, ref.rope(k, pos, interleave=interleave), "k_rope")


@pytest.mark.parametrize("dtype, rope_scale, rope_theta, llama31",
                         grid(DTYPES, (0.5, 1.0, 4.0, 8.0), (1e4, 5e5, 1e6), (False, True)))
def test_rope_scale_and_theta(dtype, rope_scale, rope_theta, llama31):
    nnz = 64
    q, k, _ = packed_qk(nnz, 4, 2, 128, dtype)
    pos = torch.randint(0, 200000, (nnz,), device=CUDA, dtype=torch.int64)
    fn = flashinfer.apply_llama31_rope_pos_ids if llama31 else flashinfer.apply_rope_pos_ids
    got_q, got_k = fn(q, k, pos, rope_scale=rope_scale, rope_theta=rope_theta)
    ref_kw = dict(rope_scale=rope_scale, rope_theta=rope_theta, llama31=llama31)
    assert_close(got_q, ref.rope(q, pos, **ref_kw), "q_rope")
    assert_close(got_k, ref.rope(k, pos, **ref_kw), "k_rope")


@pytest.mark.parametrize("llama31, low, high, old_ctx", [(True, 1.0, 4.0, 8192), (True, 2.0, 8.0, 4096),
                                                         (True, 0.5, 1.5, 2048)])
def test_llama31_smoothing_parameters(llama31, low, high, old_ctx):
    nnz = 50
    q, k, _ = packed_qk(nnz, 4, 4, 128, torch.float16)
    pos = torch.randint(0, 100000, (nnz,), device=CUDA, dtype=torch.int32)
    got_q, _ = flashinfer.apply_llama31_rope_pos_ids(q, k, pos, low_freq_factor=low, high_freq_factor=high,
                                                     old_context_len=old_ctx)
    want = ref.rope(q, pos, llama31=True, rope_scale=8.0, rope_theta=5e5, low_freq_factor=low,
                    high_freq_factor=high, old_context_len=old_ctx)
    assert_close(got_q, want)


@pytest.mark.parametrize("dtype, interleave", grid(DTYPES, (False, True)))
def test_rope_large_positions(dtype, interleave):
    """Positions up to 1e6: the angle must be the fp32 product with an accurate sincos (a fast
    __sinf is off by O(1) there)."""
    nnz = 256
    q, k, _ = packed_qk(nnz, 8, 2, 128, dtype)
    pos = torch.randint(0, 1_000_001, (nnz,), device=CUDA, dtype=torch.int64)
    pos[:4] = torch.tensor([0, 999_999, 1_000_000, 524_287], device=CUDA)
    got_q, got_k = flashinfer.apply_rope_pos_ids(q, k, pos, interleave=interleave)
    assert_close(got_q, ref.rope(q, pos, interleave=interleave), "q_rope")
    assert_close(got_k, ref.rope(k, pos, interleave=interleave), "k_rope")


def test_rope_matches_meta_complex_formulation():
    """FlashInfer's own reference: Meta's complex multiply with interleave=True."""
    nnz = 40
    q, k, _ = packed_qk(nnz, 8, 8, 128, torch.float16)
    pos = torch.arange(nnz, device=CUDA, dtype=torch.int32) + 7
    got_q, _ = flashinfer.apply_rope_pos_ids(q, k, pos, interleave=True)
    assert_close(got_q, ref.rope_meta_complex(q, pos, ref.inv_freq(128, device=CUDA), 128))


# --- layouts: contiguous, misaligned views, odd sizes (the scalar path) -----------------------------

@pytest.mark.parametrize("dtype, head_dim, rotary_dim, shift, interleave", [
    pytest.param(dt, hd, rd, sh, il, id=f"{str(dt)[6:]}-hd{hd}-rd{rd}-shift{sh}-il{int(il)}")
    for dt in DTYPES
    for hd, rd, sh in ((128, 128, 1), (128, 64, 3), (64, 6, 0), (64, 10, 0), (64, 20, 0), (128, 34, 0),
                       (65, 64, 0), (33, 32, 0), (130, 128, 0), (72, 72, 0))
    for il in (False, True)])
def test_rope_scalar_path(dtype, head_dim, rotary_dim, shift, interleave):
    nnz = 29
    q, k, buf = packed_qk(nnz, 4, 2, head_dim, dtype, shift=shift)
    pos = torch.randint(0, 3000, (nnz,), device=CUDA, dtype=torch.int32)
    want_q = ref.rope(q, pos, rotary_dim, interleave)
    want_k = ref.rope(k, pos, rotary_dim, interleave)
    got_q, got_k = flashinfer.apply_rope_pos_ids(q, k, pos, rotary_dim=rotary_dim, interleave=interleave)
    assert_close(got_q, want_q, "q_rope")
    assert_close(got_k, want_k, "k_rope")
    before = buf.clone()
    flashinfer.apply_rope_pos_ids_inplace(q, k, pos, rotary_dim=rotary_dim, interleave=interleave)
    assert_close(q, want_q, "q (in place)")
    assert_close(k, want_k, "k (in place)")
    end = shift + 6 * head_dim  # (hq + hk) * head_dim
    assert torch.equal(buf[:, :shift], before[:, :shift]) and torch.equal(buf[:, end:], before[:, end:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_contiguous_inputs(dtype):
    nnz = 100
    q = torch.randn(nnz, 32, 128, dtype=dtype, device=CUDA)
    k = torch.randn(nnz, 8, 128, dtype=dtype, device=CUDA)
    pos = torch.randint(0, 10000, (nnz,), device=CUDA, dtype=torch.int32)
    got_q, got_k = flashinfer.apply_rope_pos_ids(q, k, pos)
    assert_close(got_q, ref.rope(q, pos))
    assert_close(got_k, ref.rope(k, pos))


@pytest.mark.parametrize("inplace", (False, True))
def test_rope_empty(inplace):
    q = torch.empty(0, 8, 128, dtype=torch.float16, device=CUDA)
    k = torch.empty(0, 2, 128, dtype=torch.float16, device=CUDA)
    pos = torch.empty(0, dtype=torch.int32, device=CUDA)
    out = call("apply_rope_pos_ids" + ("_inplace" if inplace else ""), q, k, (pos,))
    assert out[0].shape == (0, 8, 128)
    indptr, offsets = ragged([0, 0], [3, 4])
    flashinfer.apply_rope_inplace(q, k, indptr, offsets)


# --- cos/sin cache form vs vLLM --------------------------------------------------------------------

HEAD_ROTARY = ((64, 64), (256, 128), (64, 32), (192, 128), (80, 64), (112, 64), (160, 96), (128, 128))


@pytest.mark.parametrize("dtype, head_size, rotary_dim, is_neox, inplace, idtype", [
    pytest.param(dt, hs, rd, neox, ip, it, id=f"{str(dt)[6:]}-hs{hs}-rd{rd}-neox{int(neox)}-ip{int(ip)}-{str(it)[6:]}",
                 marks=[pytest.mark.smoke] if (hs, rd, ip) == (128, 128, False) else [])
    for dt in DTYPES for hs, rd in HEAD_ROTARY for neox in (True, False) for ip in (False, True)
    for it in (torch.int64, torch.int32)])
def test_cos_sin_cache_matches_vllm(dtype, head_size, rotary_dim, is_neox, inplace, idtype):
    nnz, hq, hk, max_pos = 53, 4, 2, 4096
    cache = ref.build_cos_sin_cache(max_pos, rotary_dim, base=1e4, device=CUDA)
    qkv = torch.randn(nnz, (hq + 2 * hk) * head_size, dtype=dtype, device=CUDA)
    query = qkv[:, :hq * head_size]  # 2-D strided views, as vLLM passes them
    key = qkv[:, hq * head_size:(hq + hk) * head_size]
    positions = torch.randint(0, max_pos, (nnz,), device=CUDA, dtype=idtype)
    want_q, want_k = ref.rope_cos_sin_cache_vllm(positions, query, key, head_size, cache, is_neox)
    before = qkv.clone()
    if inplace:
        out = flashinfer.apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cache, is_neox)
        assert out is None
        got_q, got_k = query, key
        tail = slice((hq + hk) * head_size, None)
        assert torch.equal(qkv[:, tail], before[:, tail]), "the V part was modified"
    else:
        got_q, got_k = flashinfer.apply_rope_with_cos_sin_cache(positions, query, key, head_size, cache, is_neox)
        assert got_q.shape == query.shape and got_k.shape == key.shape
        assert torch.equal(qkv, before), "inputs were modified"
    assert_close(got_q, want_q, "query_out")
    assert_close(got_k, want_k, "key_out")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cos_sin_cache_3d_inputs_and_strided_cache(dtype):
    nnz, hq, hk, hs, rd = 31, 8, 2, 128, 64
    wide = torch.randn(2048, rd + 16, dtype=torch.float32, device=CUDA)
    cache = wide[:, :rd]  # row stride rd + 16
    q = torch.randn(nnz, hq, hs, dtype=dtype, device=CUDA)
    k = torch.randn(nnz, hk, hs, dtype=dtype, device=CUDA)
    pos = torch.randint(0, 2048, (nnz,), device=CUDA)
    want_q, want_k = ref.rope_cos_sin_cache_vllm(pos, q, k, hs, cache, True)
    got_q, got_k = flashinfer.apply_rope_with_cos_sin_cache(pos, q, k, hs, cache, True)
    assert_close(got_q, want_q)
    assert_close(got_k, want_k)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cos_sin_cache_equals_computed_frequencies(dtype):
    """A cache filled with the library's own fp32 angles gives the pos_ids form's result."""
    nnz, max_pos = 64, 1000
    q, k, _ = packed_qk(nnz, 4, 4, 128, dtype)
    pos = torch.randint(0, max_pos, (nnz,), device=CUDA, dtype=torch.int32)
    c, s = ref.cos_sin(torch.arange(max_pos, device=CUDA), ref.inv_freq(128, device=CUDA))
    cache = torch.cat([c, s], dim=-1).float()
    a = flashinfer.apply_rope_with_cos_sin_cache(pos, q.flatten(1), k.flatten(1), 128, cache, True)
    b = flashinfer.apply_rope_pos_ids(q, k, pos)
    assert_close(a[0].view_as(q), ref.rope(q, pos))
    assert (a[0].view_as(q).float() - b[0].float()).abs().max() <= 2 * (2.0 ** -8) * b[0].float().abs().max()


# --- bad indices: skipped on the device; raised with FLASHINFER_CHECK_INDICES ------------------------

@pytest.fixture
def check_indices():
    old = _index_check.enabled
    _index_check.set_check_indices(True)
    yield
    _index_check.set_check_indices(old)


def test_cos_sin_cache_position_out_of_range_is_skipped():
    nnz, hq, hk, hs, max_pos = 16, 2, 2, 64, 100
    cache = ref.build_cos_sin_cache(max_pos, hs, device=CUDA)
    query = torch.randn(nnz, hq * hs, dtype=torch.float16, device=CUDA)
    key = torch.randn(nnz, hk * hs, dtype=torch.float16, device=CUDA)
    pos = torch.randint(0, max_pos, (nnz,), device=CUDA)
    pos[3], pos[9] = max_pos, -1
    good = torch.ones(nnz, dtype=torch.bool, device=CUDA)
    good[3] = good[9] = False
    want_q, want_k = ref.rope_cos_sin_cache_vllm(pos.clamp(0, max_pos - 1), query, key, hs, cache, True)
    q0, k0 = query.clone(), key.clone()
    flashinfer.apply_rope_with_cos_sin_cache_inplace(pos, query, key, hs, cache, True)
    torch.cuda.synchronize()
    assert torch.equal(query[~good], q0[~good]) and torch.equal(key[~good], k0[~good]), "bad rows were written"
    assert_close(query[good], want_q[good])
    assert_close(key[good], want_k[good])


def test_cos_sin_cache_position_out_of_range_raises_when_checked(check_indices):
    nnz, hs, max_pos = 8, 64, 100
    cache = ref.build_cos_sin_cache(max_pos, hs, device=CUDA)
    query = torch.randn(nnz, hs, dtype=torch.float16, device=CUDA)
    key = torch.randn(nnz, hs, dtype=torch.float16, device=CUDA)
    pos = torch.arange(nnz, device=CUDA)
    pos[5] = 1000
    with pytest.raises(ValueError, match=r"positions\[5\] = 1000 is outside \[0, 100\)"):
        flashinfer.apply_rope_with_cos_sin_cache(pos, query, key, hs, cache, True)
    pos[5] = 4  # valid again: no error, and checking does not change results
    got, _ = flashinfer.apply_rope_with_cos_sin_cache(pos, query, key, hs, cache, True)
    assert_close(got, ref.rope_cos_sin_cache_vllm(pos, query, key, hs, cache, True)[0])


def test_indptr_not_covering_tokens(check_indices):
    nnz = 10
    q, k, _ = packed_qk(nnz, 2, 2, 64, torch.float16)
    indptr, offsets = ragged([3, 4], [0, 0])  # covers tokens 0..6 of 10
    with pytest.raises(ValueError, match=r"token 7 lies in no segment of indptr"):
        flashinfer.apply_rope_inplace(q, k, indptr, offsets)
    _index_check.set_check_indices(False)
    q0 = q.clone()
    flashinfer.apply_rope_inplace(q, k, indptr, offsets)
    assert torch.equal(q[7:], q0[7:]), "tokens outside indptr were written"


# --- stream and CUDA-graph behaviour -----------------------------------------------------------------

def test_rope_runs_on_the_current_stream_and_in_a_cuda_graph():
    nnz = 64
    q, k, _ = packed_qk(nnz, 8, 2, 128, torch.bfloat16)
    pos = torch.randint(0, 4096, (nnz,), device=CUDA, dtype=torch.int32)
    want = ref.rope(q, pos)
    q_in, k_in = q.clone(), k.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        flashinfer.apply_rope_pos_ids_inplace(q_in, k_in, pos)  # warm-up on a side stream
    torch.cuda.current_stream().wait_stream(s)
    assert_close(q_in, want)
    g = torch.cuda.CUDAGraph()
    q_in.copy_(q)
    k_in.copy_(k)
    with torch.cuda.graph(g):
        flashinfer.apply_rope_pos_ids_inplace(q_in, k_in, pos)
    q_in.copy_(q)
    k_in.copy_(k)
    g.replay()
    torch.cuda.synchronize()
    assert_close(q_in, want)


def test_rope_cupy_inputs():
    cupy = pytest.importorskip("cupy")
    nnz = 20
    q = torch.randn(nnz, 4, 64, dtype=torch.float16, device=CUDA)
    k = torch.randn(nnz, 2, 64, dtype=torch.float16, device=CUDA)
    pos = torch.arange(nnz, dtype=torch.int32, device=CUDA)
    cq, ck, cp = cupy.from_dlpack(q.clone()), cupy.from_dlpack(k.clone()), cupy.from_dlpack(pos)
    oq, ok = flashinfer.apply_rope_pos_ids(cq, ck, cp)
    assert isinstance(oq, cupy.ndarray)
    assert_close(torch.from_dlpack(oq), ref.rope(q, pos))
