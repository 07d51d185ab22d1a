"""GPU tests for the RoPE launch variants the kernel picks by size and layout (see
rope_launch_config in include/flashinfer/pos_enc.h), each against the float64 references:

* the scalar kernel (launches of <= 16 tokens: 1 token), one head per thread (small grids: 64
  tokens of 32 + 8 heads) and a chunk of 4 heads per thread (large grids: 1000+ tokens),
  including head counts that leave a partial chunk, copy units (rotary_dim < head_dim, not in
  place) and both pair layouts;
* FLASHINFER_ROPE_HEADS_PER_THREAD (read once per process, so each value runs in a subprocess):
  1, 6 (rounded to 8: a thread loops over two chunks) and 40 (all heads of a token);
* FLASHINFER_ROPE_SCALAR_TOKENS (launches of at most that many tokens take the scalar kernel,
  default 16): -1 puts 1-token launches on the vectorised kernel, 100000 every launch on the
  scalar one;
* the scalar kernel's cases that are new: rotary_dim past the launch's inv_freq table
  (rotary_dim / 2 > 256, computed on the device) and cos/sin caches whose rows are not
  16-byte aligned;
* the cos/sin cache form at a position out of range with pass-through features (nothing of the
  token is written).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import flashinfer  # noqa: E402
import reference_rope as ref  # noqa: E402
from checks import CUDA, DTYPES, assert_close, grid  # noqa: E402
from flashinfer import _index_check  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _indices_unchecked():
    old = _index_check.enabled
    _index_check.set_check_indices(False)
    yield
    _index_check.set_check_indices(old)


def packed_qk(nnz, hq, hk, d, dtype):
    buf = torch.randn(nnz, (hq + 2 * hk) * d, dtype=dtype, device=CUDA)
    q = buf[:, :hq * d].unflatten(1, (hq, d))
    k = buf[:, hq * d:(hq + hk) * d].unflatten(1, (hk, d))
    return q, k, buf


# --- grid sizes: one head per thread / a chunk of heads per thread ---------------------------------

SIZES = [(1, 32, 8), (64, 32, 8), (1000, 32, 8), (4096, 32, 8), (1500, 7, 3), (2000, 5, 1), (3000, 16, 2)]


@pytest.mark.parametrize("dtype, size, rd_factor, interleave, inplace",
                         grid(DTYPES, SIZES, (1.0, 0.5), (False, True), (False, True)))
def test_pos_ids_sizes(dtype, size, rd_factor, interleave, inplace):
    nnz, hq, hk = size
    d = 128
    rd = int(d * rd_factor)
    q, k, buf = packed_qk(nnz, hq, hk, d, dtype)
    before = buf.clone()
    pos = torch.randint(0, 200000, (nnz,), device=CUDA, dtype=torch.int32)
    want_q = ref.rope(q, pos, rd, interleave)
    want_k = ref.rope(k, pos, rd, interleave)
    if inplace:
        flashinfer.apply_rope_pos_ids_inplace(q, k, pos, rotary_dim=rd, interleave=interleave)
        got_q, got_k = q, k
        tail = slice((hq + hk) * d, None)
        assert torch.equal(buf[:, tail], before[:, tail]), "V was modified"
        qv = before[:, :hq * d].view(nnz, hq, d)
        assert torch.equal(q[..., rd:], qv[..., rd:]), "pass-through features were rewritten"
    else:
        got_q, got_k = flashinfer.apply_rope_pos_ids(q, k, pos, rotary_dim=rd, interleave=interleave)
        assert torch.equal(buf, before), "inputs were modified"
    assert_close(got_q, want_q, "q")
    assert_close(got_k, want_k, "k")


@pytest.mark.parametrize("dtype, size, is_neox, inplace", grid(DTYPES, SIZES, (True, False), (False, True)))
def test_cos_sin_cache_sizes(dtype, size, is_neox, inplace):
    nnz, hq, hk = size
    hs, rd, max_pos = 128, 128, 8192
    cache = ref.build_cos_sin_cache(max_pos, rd, device=CUDA)
    qkv = torch.randn(nnz, (hq + 2 * hk) * hs, dtype=dtype, device=CUDA)
    query, key = qkv[:, :hq * hs], qkv[:, hq * hs:(hq + hk) * hs]
    pos = torch.randint(0, max_pos, (nnz,), device=CUDA)
    want_q, want_k = ref.rope_cos_sin_cache_vllm(pos, query, key, hs, cache, is_neox)
    if inplace:
        flashinfer.apply_rope_with_cos_sin_cache_inplace(pos, query, key, hs, cache, is_neox)
        got_q, got_k = query, key
    else:
        got_q, got_k = flashinfer.apply_rope_with_cos_sin_cache(pos, query, key, hs, cache, is_neox)
    assert_close(got_q, want_q, "query")
    assert_close(got_k, want_k, "key")


@pytest.mark.parametrize("dtype, nnz, llama31", grid(DTYPES, (1, 3000), (False, True)))
def test_indptr_form_sizes(dtype, nnz, llama31):
    """The indptr form at both grid sizes (its position comes from a binary search)."""
    lens = [nnz // 3, 0, nnz - nnz // 3] if nnz > 1 else [1]
    offs = [5, 7, 11][:len(lens)]
    indptr = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=CUDA)
    offsets = torch.tensor(offs, dtype=torch.int32, device=CUDA)
    q, k, _ = packed_qk(nnz, 32, 8, 128, dtype)
    pos = ref.positions_from_indptr(indptr, offsets)
    kw = dict(llama31=True, rope_scale=8.0, rope_theta=5e5) if llama31 else {}
    fn = flashinfer.apply_llama31_rope if llama31 else flashinfer.apply_rope
    got_q, got_k = fn(q, k, indptr, offsets)
    assert_close(got_q, ref.rope(q, pos, **kw), "q")
    assert_close(got_k, ref.rope(k, pos, **kw), "k")


# --- FLASHINFER_ROPE_HEADS_PER_THREAD / FLASHINFER_ROPE_SCALAR_TOKENS -----------------------------------------------------------

_CHILD = textwrap.dedent("""
    import sys, torch, flashinfer
    sys.path.insert(0, {tests!r})
    import reference_rope as ref
    from checks import assert_close
    torch.manual_seed(0)
    for nnz, hq, hk, rd, il in ((1, 32, 8, 128, False), (777, 32, 8, 64, True), (2048, 7, 3, 128, False),
                                (333, 39, 1, 128, True)):
        for dtype in (torch.float16, torch.bfloat16):
            q = torch.randn(nnz, hq, 128, dtype=dtype, device="cuda")
            k = torch.randn(nnz, hk, 128, dtype=dtype, device="cuda")
            pos = torch.randint(0, 100000, (nnz,), dtype=torch.int64, device="cuda")
            gq, gk = flashinfer.apply_rope_pos_ids(q, k, pos, rotary_dim=rd, interleave=il)
            assert_close(gq, ref.rope(q, pos, rd, il), "q")
            assert_close(gk, ref.rope(k, pos, rd, il), "k")
            cache = ref.build_cos_sin_cache(100000, rd, device="cuda")
            qf, kf = q.flatten(1).clone(), k.flatten(1).clone()
            wq, wk = ref.rope_cos_sin_cache_vllm(pos, qf, kf, 128, cache, not il)
            flashinfer.apply_rope_with_cos_sin_cache_inplace(pos, qf, kf, 128, cache, not il)
            assert_close(qf, wq, "query")
            assert_close(kf, wk, "key")
    print("OK")
""")


@pytest.mark.parametrize("var, value", [("FLASHINFER_ROPE_HEADS_PER_THREAD", "1"),
                                        ("FLASHINFER_ROPE_HEADS_PER_THREAD", "6"),
                                        ("FLASHINFER_ROPE_HEADS_PER_THREAD", "40"),
                                        ("FLASHINFER_ROPE_SCALAR_TOKENS", "-1"),
                                        ("FLASHINFER_ROPE_SCALAR_TOKENS", "100000")])
def test_launch_overrides(var, value):
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, **{var: value})
    r = subprocess.run([sys.executable, "-c", _CHILD.format(tests=tests)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


# --- scalar-kernel cases -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, interleave", grid(DTYPES, (False, True)))
def test_rotary_dim_past_the_frequency_table(dtype, interleave):
    """rotary_dim / 2 > 256: frequencies past the launch's table are computed on the device."""
    nnz, d, rd = 19, 640, 576
    q, k, _ = packed_qk(nnz, 3, 2, d, dtype)
    pos = torch.randint(0, 500000, (nnz,), device=CUDA, dtype=torch.int32)
    for llama31 in (False, True):
        kw = dict(llama31=True, rope_scale=8.0, rope_theta=5e5) if llama31 else {}
        fn = flashinfer.apply_llama31_rope_pos_ids if llama31 else flashinfer.apply_rope_pos_ids
        got_q, got_k = fn(q, k, pos, rotary_dim=rd, interleave=interleave)
        assert_close(got_q, ref.rope(q, pos, rd, interleave, **kw), "q")
        assert_close(got_k, ref.rope(k, pos, rd, interleave, **kw), "k")


@pytest.mark.parametrize("dtype, is_neox, shift, extra", grid(DTYPES, (True, False), (0, 1), (2, 3)))
def test_cos_sin_cache_unaligned_rows(dtype, is_neox, shift, extra):
    """Cache rows not 16-byte aligned (row stride rd + 2 / rd + 3, or the view starting one float
    in): the scalar kernel reads them."""
    nnz, hq, hk, hs, rd, max_pos = 300, 8, 2, 128, 128, 1024
    full = ref.build_cos_sin_cache(max_pos, rd, device=CUDA)
    wide = torch.zeros(max_pos, shift + rd + extra, dtype=torch.float32, device=CUDA)
    wide[:, shift:shift + rd] = full
    cache = wide[:, shift:shift + rd]
    query = torch.randn(nnz, hq * hs, dtype=dtype, device=CUDA)
    key = torch.randn(nnz, hk * hs, dtype=dtype, device=CUDA)
    pos = torch.randint(0, max_pos, (nnz,), device=CUDA, dtype=torch.int32)
    want_q, want_k = ref.rope_cos_sin_cache_vllm(pos, query, key, hs, full, is_neox)
    got_q, got_k = flashinfer.apply_rope_with_cos_sin_cache(pos, query, key, hs, cache, is_neox)
    assert_close(got_q, want_q, "query")
    assert_close(got_k, want_k, "key")


@pytest.mark.parametrize("nnz", (16, 2000))
def test_cos_sin_cache_bad_position_writes_nothing(nnz):
    """rotary_dim < head_size: a token at a position outside the cache is not touched at all."""
    hq, hk, hs, rd, max_pos = 4, 2, 128, 64, 100
    cache = ref.build_cos_sin_cache(max_pos, rd, device=CUDA)
    query = torch.randn(nnz, hq * hs, dtype=torch.bfloat16, device=CUDA)
    key = torch.randn(nnz, hk * hs, dtype=torch.bfloat16, device=CUDA)
    pos = torch.randint(0, max_pos, (nnz,), device=CUDA)
    pos[3], pos[9] = max_pos, -1
    good = torch.ones(nnz, dtype=torch.bool, device=CUDA)
    good[3] = good[9] = False
    q0, k0 = query.clone(), key.clone()
    flashinfer.apply_rope_with_cos_sin_cache_inplace(pos, query, key, hs, cache, True)
    assert torch.equal(query[~good], q0[~good]) and torch.equal(key[~good], k0[~good])
    want_q, want_k = ref.rope_cos_sin_cache_vllm(pos.clamp(0, max_pos - 1), q0, k0, hs, cache, True)
    assert_close(query[good], want_q[good])
    assert_close(key[good], want_k[good])
