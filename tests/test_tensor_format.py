"""`format(t, spec)` as PyTorch's: a 0-d tensor formats as its Python number, any other
tensor only with an empty spec (then as str)."""

import pytest

import tracegrad as tg


def test_a_zero_dim_tensor_formats_as_its_number():
    assert f"{tg.tensor(1.234):+.2f}" == "+1.23"
    assert f"{tg.tensor(2.5, dtype=tg.float64):.3e}" == "2.500e+00"
    assert f"{tg.tensor(7):>4}" == "   7"
    loss = (tg.ones(3, requires_grad=True) * 2).sum()
    assert f"loss {loss:.1f}" == "loss 6.0"


def test_other_tensors_need_an_empty_spec():
    t = tg.tensor([1.0, 2.0])
    assert f"{t}" == str(t)
    with pytest.raises(TypeError, match="unsupported format string passed to Tensor.__format__"):
        f"{t:.2f}"


def test_formatting_matches_pytorch():
    torch = pytest.importorskip("torch")
    for spec in ("", ".3f", "+.2e", ">10", "g"):
        assert format(tg.tensor(3.14159), spec) == format(torch.tensor(3.14159), spec)
