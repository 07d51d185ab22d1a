"""GPU correctness tests for flashinfer.activation (act(x[..., :H]) * x[..., H:]) against the
float64 references. Outputs are NaN-poisoned before the call; tolerances: see checks.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import flashinfer  # noqa: E402
import reference as ref  # noqa: E402
from checks import (  # noqa: E402
    CUDA, DTYPES, GuardedOutput, assert_all_nan, assert_close, grid, nan_full, short, untouched_columns,
)
from fake_dlpack import Bare  # noqa: E402

pytestmark = pytest.mark.gpu

ACTS = {
    "silu_and_mul": (flashinfer.silu_and_mul, ref.silu_and_mul),
    "gelu_and_mul": (flashinfer.gelu_and_mul, ref.gelu_and_mul),
    "gelu_tanh_and_mul": (flashinfer.gelu_tanh_and_mul, ref.gelu_tanh_and_mul),
}
HIDDEN = (1, 64, 111, 128, 4096, 11008, 14336)
BATCH_SEQ = ((1, 1), (1, 17), (1, 512), (2, 1), (2, 17), (2, 512), (16, 1), (16, 17), (16, 512))


def gate_up(*lead, hidden, dtype):
    """Random [*lead, 2 * hidden] input spanning the interesting range of the activations."""
    return (torch.randn(*lead, 2 * hidden, dtype=torch.float32, device=CUDA) * 2).to(dtype)


def _bs_id(bs):
    return f"b{bs[0]}s{bs[1]}"


def _act_grid():
    params = []
    for p in grid(ACTS, DTYPES, HIDDEN):
        name, dtype, hidden = p.values
        for bs in BATCH_SEQ:
            smoke = hidden in (111, 4096) and bs == (2, 17)
            params.append(pytest.param(name, dtype, hidden, bs, id=f"{p.id}-{_bs_id(bs)}",
                                       marks=[pytest.mark.smoke] if smoke else []))
    return params


@pytest.mark.parametrize("name, dtype, hidden, batch_seq", _act_grid())
def test_act_and_mul_matches_reference(name, dtype, hidden, batch_seq):
    kernel, reference = ACTS[name]
    batch, seq = batch_seq
    x = gate_up(batch, seq, hidden=hidden, dtype=dtype)
    x_before = x.clone()
    out = kernel(x)
    assert out.shape == (batch, seq, hidden) and out.dtype == dtype and out.device == x.device
    assert_close(out, reference(x))
    assert torch.equal(x, x_before), "input was modified"


@pytest.mark.parametrize("name, dtype, hidden", grid(ACTS, DTYPES, (1, 111, 4096),
                                                     smoke=lambda n, d, h: h == 111))
def test_act_writes_the_given_out_and_returns_it(name, dtype, hidden):
    kernel, reference = ACTS[name]
    x = gate_up(3, 5, hidden=hidden, dtype=dtype)
    out = GuardedOutput((3, 5, hidden), dtype)
    assert kernel(x, out=out.tensor) is out.tensor
    assert_close(out.tensor, reference(x))
    out.assert_guards_untouched()


# (buffer lead dims, slice of the lead dims, column start in a buffer of 2H + pad columns, pad)
STRIDED = {
    # rows are a column slice of wider rows: one stride level
    "wide_rows": ((2, 17), (slice(None), slice(None)), 0, 64),
    # the same, shifted by an odd number of elements: nothing 16-byte aligned
    "wide_rows_misaligned": ((2, 17), (slice(None), slice(None)), 3, 5),
    # a token subrange of each batch as well: two stride levels
    "token_slice": ((2, 20), (slice(None), slice(2, 19)), 8, 8),
}


@pytest.mark.parametrize("name, dtype, hidden, layout", grid(ACTS, DTYPES, (1, 64, 111, 4096), STRIDED))
def test_act_strided_input_and_output_rows(name, dtype, hidden, layout):
    kernel, reference = ACTS[name]
    lead, lead_slice, start, pad = STRIDED[layout]
    x_buf = (torch.randn(*lead, 2 * hidden + pad, device=CUDA) * 2).to(dtype)
    x = x_buf[lead_slice][..., start:start + 2 * hidden]
    out_buf = nan_full((*lead, hidden + pad), dtype)
    out = out_buf[lead_slice][..., start:start + hidden]
    assert not x.is_contiguous() and not out.is_contiguous()
    x_buf_before = x_buf.clone()
    assert kernel(x, out=out) is out
    assert_close(out, reference(x))
    for part in untouched_columns(out_buf, out):
        assert_all_nan(part, "out buffer columns outside the out view")
    if layout == "token_slice":
        assert_all_nan(out_buf[:, :2], "out buffer rows outside the out view")
        assert_all_nan(out_buf[:, 19:], "out buffer rows outside the out view")
    assert torch.equal(x_buf, x_buf_before), "input buffer was modified"
    assert_close(kernel(x), reference(x))  # out=None with a strided input


@pytest.mark.parametrize("name, dtype, enable_pdl", grid(ACTS, DTYPES, (None, True, False)))
def test_act_enable_pdl_variants(name, dtype, enable_pdl):
    kernel, reference = ACTS[name]
    for lead, hidden in (((4, 128), 4096), ((7,), 111)):
        x = gate_up(*lead, hidden=hidden, dtype=dtype)
        out = GuardedOutput((*lead, hidden), dtype)
        assert kernel(x, out=out.tensor, enable_pdl=enable_pdl) is out.tensor
        assert_close(out.tensor, reference(x))
        out.assert_guards_untouched()


@pytest.mark.parametrize("name, dtype", grid(ACTS, DTYPES))
def test_act_1d_and_2d_inputs(name, dtype):
    kernel, reference = ACTS[name]
    for lead in ((), (9,)):
        x = gate_up(*lead, hidden=111, dtype=dtype)
        out = kernel(x)
        assert out.shape == (*lead, 111)
        assert_close(out, reference(x))


@pytest.mark.parametrize("name, dtype", grid(ACTS, DTYPES))
def test_act_zero_tokens_is_a_no_op(name, dtype):
    kernel, _ = ACTS[name]
    for shape in ((0, 128), (2, 0, 128)):
        x = torch.empty(shape, dtype=dtype, device=CUDA)
        out = kernel(x)
        assert out.shape == (*shape[:-1], 64) and out.dtype == dtype
    torch.cuda.synchronize()  # surfaces an asynchronous launch error, if any


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
def test_wrong_references_fail_on_kernel_output(dtype):
    """Each kernel passes against its own reference and fails against the others' and
    against swapped gate/up halves."""
    x = gate_up(16, hidden=4096, dtype=dtype)
    outputs = {name: kernel(x) for name, (kernel, _) in ACTS.items()}
    for name, out in outputs.items():
        assert_close(out, ACTS[name][1](x), name=name)
        for other, (_, wrong_reference) in ACTS.items():
            if other != name:
                with pytest.raises(AssertionError):
                    assert_close(out, wrong_reference(x), name=f"{name} vs {other} reference")
        swapped = torch.cat([x[..., 4096:], x[..., :4096]], dim=-1)
        with pytest.raises(AssertionError):
            assert_close(out, ACTS[name][1](swapped), name=f"{name} vs swapped halves")


@pytest.mark.parametrize("name, dtype", grid(ACTS, DTYPES))
def test_act_bare_dlpack_producer_with_out(name, dtype):
    kernel, reference = ACTS[name]
    x = gate_up(7, hidden=4096, dtype=dtype)
    out = nan_full((7, 4096), dtype)
    bare_out = Bare(out)
    assert kernel(Bare(x), out=bare_out) is bare_out
    torch.cuda.synchronize()  # (an unknown producer runs on the legacy default stream)
    assert_close(out, reference(x))
