"""`functional/dtype_info.py`: `finfo`, `iinfo`, `promote_types`, `result_type`, `can_cast`
with PyTorch's values and errors; compared with PyTorch itself where it is installed."""

import pytest

import tracegrad as tg
from tracegrad.ir import types

FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTEGERS = ["uint8", "int8", "int16", "int32", "int64"]


def test_finfo_of_float16_and_bfloat16():
    half = tg.finfo(tg.float16)
    assert (half.bits, half.eps, half.max, half.tiny, half.resolution) == (16, 2.0 ** -10, 65504.0, 2.0 ** -14, 0.001)
    bf16 = tg.finfo(tg.bfloat16)
    assert (bf16.bits, bf16.eps, bf16.tiny, bf16.resolution) == (16, 2.0 ** -7, 2.0 ** -126, 0.01)
    assert bf16.min == -bf16.max and bf16.dtype == "bfloat16"


def test_finfo_without_argument_is_the_default_dtype():
    assert tg.finfo().dtype == "float32"


def test_finfo_of_an_integer_dtype_raises():
    with pytest.raises(TypeError, match="finfo\\(\\) requires a floating point input type"):
        tg.finfo(tg.int32)


def test_iinfo_of_a_float_dtype_raises():
    with pytest.raises(TypeError, match="iinfo\\(\\) requires an integer input type"):
        tg.iinfo(tg.float16)


@pytest.mark.parametrize("name", FLOATS)
def test_finfo_equals_pytorch(name):
    torch = pytest.importorskip("torch")
    got, want = tg.finfo(getattr(tg, name)), torch.finfo(getattr(torch, name))
    for field in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution", "dtype"):
        assert getattr(got, field) == getattr(want, field), field


@pytest.mark.parametrize("name", INTEGERS)
def test_iinfo_equals_pytorch(name):
    torch = pytest.importorskip("torch")
    got, want = tg.iinfo(getattr(tg, name)), torch.iinfo(getattr(torch, name))
    assert (got.bits, got.min, got.max, got.dtype) == (want.bits, want.min, want.max, want.dtype)


def test_promote_types_uses_the_lattice():
    assert tg.promote_types(tg.uint8, tg.int8) is tg.int16
    assert tg.promote_types(tg.float16, tg.bfloat16) is tg.float32
    with pytest.raises(TypeError, match="argument 'type2' must be torch.dtype"):
        tg.promote_types(tg.int8, "int8")


def _operands(m, dtype_names):
    """Operands of PyTorch's three ranks: a 1-d tensor, a 0-d tensor, Python numbers."""
    return [
        m.ones(2, dtype=getattr(m, dtype_names[0])),
        m.tensor(1, dtype=getattr(m, dtype_names[1])),
        3, 2.5, True,
    ]


@pytest.mark.parametrize("dim_dtype", INTEGERS + FLOATS + ["bool"])
@pytest.mark.parametrize("zero_dim_dtype", INTEGERS + FLOATS + ["bool"])
def test_result_type_equals_pytorch(dim_dtype, zero_dim_dtype):
    torch = pytest.importorskip("torch")
    if "bfloat16" in (dim_dtype, zero_dim_dtype) and not types.bfloat16_available():
        pytest.skip("bfloat16 needs ml_dtypes")
    ours, theirs = _operands(tg, (dim_dtype, zero_dim_dtype)), _operands(torch, (dim_dtype, zero_dim_dtype))
    for i in range(len(ours)):
        for j in range(len(ours)):
            if i >= 2 and j >= 2:
                continue  # two numbers: PyTorch's result_type needs a tensor
            want = torch.result_type(theirs[i], theirs[j])
            assert tg.result_type(ours[i], ours[j]).name == str(want).removeprefix("torch."), (i, j)


def test_result_type_of_an_int_tensor_and_a_float_is_the_default_float():
    assert tg.result_type(tg.ones(2, dtype=tg.int8), 2.5) is tg.float32
    assert tg.result_type(tg.ones(2, dtype=tg.uint8), tg.tensor(1.0, dtype=tg.float64)) is tg.float64
    assert tg.result_type(tg.ones(2, dtype=tg.float16), tg.tensor(1.0, dtype=tg.float64)) is tg.float16
    assert tg.result_type(tg.ones(2, dtype=tg.int8), tg.tensor(1, dtype=tg.int64)) is tg.int8


def test_can_cast():
    assert tg.can_cast(tg.int64, tg.uint8) and tg.can_cast(tg.bool, tg.float16)
    assert not tg.can_cast(tg.bfloat16, tg.int32) and not tg.can_cast(tg.int8, tg.bool)
