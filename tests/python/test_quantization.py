"""flashinfer.packbits / segment_packbits against numpy.packbits (CPU torch tensors, NumPy
arrays, and CUDA tensors and CuPy arrays when a GPU is present), and the flashinfer.utils.FP4Tensor
container."""

from __future__ import annotations

import numpy as np
import pytest

import flashinfer

torch = pytest.importorskip("torch")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bitorder", ["big", "little"])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 64, 1001])
def test_packbits_matches_numpy(device, bitorder, n):
    rng = np.random.default_rng(n)
    x = rng.random(n) < 0.4
    got = flashinfer.packbits(torch.from_numpy(x).to(device), bitorder=bitorder)
    assert got.dtype == torch.uint8 and got.device.type == device
    np.testing.assert_array_equal(got.cpu().numpy(), np.packbits(x, bitorder=bitorder))
    # nonzero counts as 1, any dtype and shape (flattened), NumPy in, NumPy out
    y = rng.integers(-2, 3, size=(3, n))
    np.testing.assert_array_equal(flashinfer.packbits(torch.from_numpy(y).to(device), bitorder).cpu().numpy(),
                                  np.packbits(y != 0, bitorder=bitorder))
    np.testing.assert_array_equal(flashinfer.quantization.packbits(y, bitorder), np.packbits(y != 0, bitorder=bitorder))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bitorder", ["big", "little"])
def test_segment_packbits_matches_numpy_per_segment(device, bitorder):
    rng = np.random.default_rng(3)
    lens = [0, 1, 8, 13, 0, 64, 7, 100]
    indptr = np.concatenate([[0], np.cumsum(lens)])
    x = rng.random(int(indptr[-1])) < 0.5
    y, new_indptr = flashinfer.segment_packbits(torch.from_numpy(x).to(device), torch.from_numpy(indptr).to(device),
                                                bitorder=bitorder)
    assert y.dtype == torch.uint8 and new_indptr.dtype == torch.int32
    want = [np.packbits(x[indptr[i]:indptr[i + 1]], bitorder=bitorder) for i in range(len(lens))]
    np.testing.assert_array_equal(new_indptr.cpu().numpy(), np.concatenate([[0], np.cumsum([len(w) for w in want])]))
    np.testing.assert_array_equal(y.cpu().numpy(), np.concatenate(want))
    # NumPy in, NumPy out (indptr as a list)
    y2, p2 = flashinfer.quantization.segment_packbits(x, indptr.tolist(), bitorder)
    np.testing.assert_array_equal(y2, np.concatenate(want))
    np.testing.assert_array_equal(p2, new_indptr.cpu().numpy())


@pytest.mark.gpu
@pytest.mark.parametrize("bitorder", ["big", "little"])
def test_packbits_cupy_in_cupy_out(bitorder):
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(11)
    y = rng.integers(-2, 3, size=(3, 1001))  # nonzero counts as 1; flattened
    got = flashinfer.packbits(cupy.asarray(y), bitorder=bitorder)
    assert isinstance(got, cupy.ndarray) and got.dtype == cupy.uint8
    np.testing.assert_array_equal(got.get(), np.packbits(y != 0, bitorder=bitorder))
    lens = [0, 1, 8, 13, 0, 64, 7, 100]
    indptr = np.concatenate([[0], np.cumsum(lens)])
    x = rng.random(int(indptr[-1])) < 0.5
    out, new_indptr = flashinfer.segment_packbits(cupy.asarray(x), cupy.asarray(indptr), bitorder=bitorder)
    assert isinstance(out, cupy.ndarray) and out.dtype == cupy.uint8 and new_indptr.dtype == cupy.int32
    want = [np.packbits(x[indptr[i]:indptr[i + 1]], bitorder=bitorder) for i in range(len(lens))]
    np.testing.assert_array_equal(out.get(), np.concatenate(want))
    np.testing.assert_array_equal(new_indptr.get(), np.concatenate([[0], np.cumsum([len(w) for w in want])]))


def test_packbits_errors():
    with pytest.raises(ValueError, match="bitorder must be 'big' or 'little'"):
        flashinfer.packbits(torch.ones(3, dtype=torch.bool), bitorder="middle")
    with pytest.raises(ValueError, match="indptr must start at 0"):
        flashinfer.segment_packbits(torch.ones(5, dtype=torch.bool), torch.tensor([0, 2, 4]))
    with pytest.raises(ValueError, match="x must be 1-D"):
        flashinfer.segment_packbits(torch.ones(2, 2, dtype=torch.bool), torch.tensor([0, 4]))


def test_fp4_tensor_container():
    data = torch.zeros(4, 8, dtype=torch.uint8)
    scale = torch.zeros(4, 1, dtype=torch.float8_e4m3fn)
    t = flashinfer.utils.FP4Tensor(data, scale, 2, (4, 16))
    assert t.data is data and t.scale is scale and t.scale_start_index == 2 and t.original_shape == (4, 16)
    with pytest.raises(ValueError, match="data must be uint8"):
        flashinfer.utils.FP4Tensor(data.float(), scale)
    with pytest.raises(ValueError, match="scale must be float8_e4m3fn"):
        flashinfer.utils.FP4Tensor(data, scale.float())


def test_segment_packbits_names_a_float_indptr_and_a_non_array_x():
    with pytest.raises(ValueError, match="segment_packbits: indptr must hold integers; got dtype float32"):
        flashinfer.segment_packbits(torch.ones(4, dtype=torch.bool), torch.tensor([0.0, 2.5, 4.0]))
    with pytest.raises(TypeError, match="segment_packbits: x must be a 1-D tensor or array; got list"):
        flashinfer.segment_packbits([1, 0, 1], [0, 3])
