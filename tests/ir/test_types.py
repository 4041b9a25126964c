"""`ir/types.py`: the dtypes and PyTorch's promotion lattice (`promote`, `can_cast`), against
PyTorch's own `promote_types`/`can_cast` for every pair where it is installed, and a fixed
table of the pairs that show the lattice's rules otherwise."""

import itertools

import pytest

from tracegrad.ir import types

PAIRS = list(itertools.product(types.ALL_DTYPES, repeat=2))

# (a, b) -> promote(a, b): the rules of PyTorch's lattice, written out.
EXPECTED = {
    ("bool", "bool"): "bool",
    ("bool", "uint8"): "uint8",
    ("bool", "float16"): "float16",
    ("uint8", "int8"): "int16",  # neither holds the other
    ("uint8", "int16"): "int16",
    ("uint8", "int64"): "int64",
    ("int8", "int16"): "int16",
    ("int16", "int32"): "int32",
    ("int32", "int64"): "int64",
    ("int64", "float16"): "float16",  # a float category beats any integer width
    ("int32", "bfloat16"): "bfloat16",
    ("uint8", "float16"): "float16",
    ("float16", "bfloat16"): "float32",  # neither holds the other
    ("float16", "float32"): "float32",
    ("bfloat16", "float32"): "float32",
    ("bfloat16", "float64"): "float64",
    ("float32", "float64"): "float64",
    ("int64", "float32"): "float32",
}


@pytest.mark.parametrize("pair", list(EXPECTED), ids="-".join)
def test_promote_follows_pytorchs_lattice(pair):
    a, b = (types.from_name(name) for name in pair)
    assert types.promote(a, b).name == EXPECTED[pair]
    assert types.promote(b, a).name == EXPECTED[pair]


@pytest.mark.parametrize("a,b", PAIRS, ids=lambda d: d.short)
def test_promote_is_symmetric_and_holds_both(a, b):
    result = types.promote(a, b)
    assert result is types.promote(b, a)
    assert result.category == max(a.category, b.category)
    assert types.promote(result, a) is result and types.promote(result, b) is result


def test_promote_equals_pytorch_for_every_pair():
    torch = pytest.importorskip("torch")
    for a, b in PAIRS:
        want = torch.promote_types(getattr(torch, a.name), getattr(torch, b.name))
        assert types.promote(a, b).name == str(want).removeprefix("torch."), (a, b)


def test_can_cast_equals_pytorch_for_every_pair():
    torch = pytest.importorskip("torch")
    for a, b in PAIRS:
        assert types.can_cast(a, b) == torch.can_cast(getattr(torch, a.name), getattr(torch, b.name)), (a, b)


def test_can_cast_refuses_only_down_a_category():
    assert types.can_cast(types.int64, types.int8)  # narrowing within a category is allowed
    assert types.can_cast(types.float64, types.float16)
    assert types.can_cast(types.uint8, types.bfloat16)
    assert not types.can_cast(types.float16, types.int64)
    assert not types.can_cast(types.uint8, types.bool_)


@pytest.mark.parametrize("dtype", types.ALL_DTYPES, ids=lambda d: d.name)
def test_each_dtype_is_found_by_its_names(dtype):
    assert types.from_name(dtype.name) is dtype
    assert types.from_short(dtype.short) is dtype
    assert dtype.itemsize * 8 == dtype.bits


@pytest.mark.parametrize("dtype", [d for d in types.ALL_DTYPES if d is not types.bfloat16], ids=lambda d: d.name)
def test_from_numpy_keeps_each_numpy_dtype(dtype):
    assert types.from_numpy(dtype.np) is dtype
    assert dtype.np.itemsize == dtype.itemsize


def test_from_numpy_widens_widths_pytorch_lacks():
    import numpy as np
    assert types.from_numpy(np.uint32) is types.int64
    assert types.from_numpy(np.longdouble) is types.float64


@pytest.mark.skipif(not types.bfloat16_available(), reason="bfloat16 needs ml_dtypes")
def test_bfloat16_is_stored_as_ml_dtypes_bfloat16():
    import ml_dtypes
    assert types.bfloat16.np == ml_dtypes.bfloat16
    assert types.from_numpy(ml_dtypes.bfloat16) is types.bfloat16


def test_bfloat16_without_ml_dtypes_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(types, "_ml_dtypes", None)
    with pytest.raises(types.BFloat16Unavailable, match="pip install ml_dtypes"):
        _ = types.bfloat16.np
    assert types.float16.np.itemsize == 2  # the other dtypes are unaffected
