"""The functions and methods generated from primitive entries (`Primitive.api`): an entry
that names a calling convention is reachable as `tg.<name>`, `Tensor.<name>` and, for a
unary op, the in-place `Tensor.<name>_`, with nothing else to edit."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.functional.arith import GENERATED
from tracegrad.ops import REGISTRY

ENTRIES = sorted(name for name, prim in REGISTRY.items() if prim.api is not None)
UNARY = [name for name in ENTRIES if REGISTRY[name].api in ("unary", "float_unary")]
BINARY = [name for name in ENTRIES if REGISTRY[name].api in ("binary", "float_binary")]


def test_every_entry_with_a_calling_convention_is_generated():
    assert ENTRIES and sorted(GENERATED) == ENTRIES


@pytest.mark.parametrize("name", ENTRIES)
def test_a_generated_op_is_a_function_and_a_method(name):
    assert getattr(tg, name) is GENERATED[name] and name in tg.functional.__all__
    assert getattr(tg.Tensor, name) is GENERATED[name]


@pytest.mark.parametrize("name", UNARY)
def test_a_generated_unary_op_has_an_in_place_method_that_writes_its_result(name):
    x = tg.tensor([0.25, 0.5, 0.75], dtype=tg.float64)
    want = getattr(tg, name)(x).numpy()
    version = x._version
    assert getattr(x, name + "_")() is x
    np.testing.assert_array_equal(x.numpy(), want)
    assert x._version == version + 1


@pytest.mark.parametrize("name", UNARY)
def test_a_generated_unary_op_names_itself_when_given_no_tensor(name):
    with pytest.raises(TypeError, match=rf"^{name}\(\): argument 'input' must be Tensor, not list"):
        getattr(tg, name)([1.0])


@pytest.mark.parametrize("name", BINARY)
def test_a_generated_binary_op_broadcasts_and_promotes_a_python_number(name):
    x = tg.tensor([[0.0, 1.0, 2.0]], dtype=tg.float64)
    got = getattr(tg, name)(x, 1.0)
    want = getattr(tg, name)(x, tg.ones(2, 3, dtype=tg.float64)[:1])
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert got.shape == (1, 3)


def test_float_unary_converts_an_integer_input_and_its_in_place_form_refuses_it():
    x = tg.tensor([1, 4])
    assert tg.sqrt(x).dtype is tg.float32
    with pytest.raises(RuntimeError, match="sqrt_: result type float32 can't be cast"):
        x.sqrt_()
