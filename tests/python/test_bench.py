"""CPU tests of the bench CLI's pieces that need no GPU: the ceiling fraction each row reports,
--dry-run, and the exit without a device."""

import pytest

from flashinfer.bench import COPY_CEILING_GBPS, MATMUL_CEILING_TFLOPS, ceiling_fraction
from flashinfer.bench.__main__ import main


def test_ceiling_fraction_takes_the_binding_ceiling():
    # memory only / compute only: that ceiling
    assert ceiling_fraction(COPY_CEILING_GBPS / 2e3, None) == pytest.approx(0.5)
    assert ceiling_fraction(None, MATMUL_CEILING_TFLOPS / 4) == pytest.approx(0.25)
    # both (attention): the larger fraction, whichever ceiling it is
    assert ceiling_fraction(COPY_CEILING_GBPS * 0.1e-3, MATMUL_CEILING_TFLOPS * 0.45) == pytest.approx(0.45)
    assert ceiling_fraction(COPY_CEILING_GBPS * 0.9e-3, MATMUL_CEILING_TFLOPS * 0.2) == pytest.approx(0.9)
    assert ceiling_fraction(None, None) is None
    assert ceiling_fraction(0.0, None) is None


def test_dry_run_lists_cases(capsys):
    assert main(["--dry-run", "--routine", "rmsnorm"]) == 0
    out = capsys.readouterr().out
    assert "routine=rmsnorm" in out


def test_no_device_exits_nonzero(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert main(["--routine", "rmsnorm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA device" in err[0]
