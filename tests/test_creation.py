"""`creation.py`'s ranges: linspace and logspace, values, dtypes and PyTorch's results."""

import numpy as np
import pytest

import tracegrad as tg


def test_logspace_spaces_the_exponent_evenly():
    out = tg.logspace(0, 3, 4)
    assert out.dtype == tg.float32 and out.tolist() == [1.0, 10.0, 100.0, 1000.0]
    assert tg.logspace(0, 4, 3, base=2, dtype=tg.float64).tolist() == [1.0, 4.0, 16.0]
    assert tg.logspace(1, 2, 0).shape == (0,)
    with pytest.raises(RuntimeError, match="non-negative"):
        tg.logspace(0, 1, -1)


def test_linspace_and_logspace_match_pytorch():
    torch = pytest.importorskip("torch")
    np.testing.assert_allclose(tg.logspace(-2, 2, 7).numpy(), torch.logspace(-2, 2, 7).numpy(), rtol=1e-6)
    np.testing.assert_allclose(tg.linspace(-1, 1, 5).numpy(), torch.linspace(-1, 1, 5).numpy(), rtol=1e-7)
