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


def test_linspace_has_pytorchs_values_to_the_last_bit():
    # PyTorch's kernel: the first half start + step * i, the second end - step * (steps - 1 - i),
    # each rounded once; NumPy's linspace (used before) differed in the last bit of 7 of
    # these 75 float32 values (PyTorch 2.13's values, as hex).
    out = tg.linspace(0.5, 1.5, 75).numpy()
    pytorch = {11: "0x1.4c1bae0000000p-1", 18: "0x1.7c8a620000000p-1", 25: "0x1.acf9160000000p-1",
               33: "0x1.e453080000000p-1", 38: "0x1.03759e0000000p+0", 45: "0x1.1bacf80000000p+0",
               52: "0x1.33e4520000000p+0"}
    assert {i: float(out[i]).hex() for i in pytorch} == pytorch
    assert out[0] == 0.5 and out[-1] == 1.5 and out.dtype == np.float32
    out64 = tg.linspace(-2.0, 3.0, 75, dtype=tg.float64).numpy()
    assert [float(out64[i]).hex() for i in (10, 37, 60)] == [
        "-0x1.5306eb3e45307p+0", "0x1.ffffffffffffep-2", "0x1.06eb3e45306ebp+1"]


@pytest.mark.parametrize("steps", [0, 1, 2])
def test_linspace_of_few_steps(steps):
    out = tg.linspace(-1.0, 3.0, steps)
    assert out.shape == (steps,) and out.tolist() == [-1.0, 3.0][:steps]
    with pytest.raises(RuntimeError, match="linspace: number of steps must be non-negative"):
        tg.linspace(0, 1, -1)


def test_linspace_matches_pytorch_over_random_ranges():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    for _ in range(100):
        start, end, steps = float(rng.uniform(-10, 10)), float(rng.uniform(-10, 10)), int(rng.integers(0, 2000))
        np.testing.assert_array_equal(tg.linspace(start, end, steps).numpy(),
                                      torch.linspace(start, end, steps).numpy())
        # (float64: through the extended long double, not a fused multiply-add, so one value
        # in a few thousand may round twice: within an ulp)
        np.testing.assert_allclose(tg.linspace(start, end, steps, dtype=tg.float64).numpy(),
                                   torch.linspace(start, end, steps, dtype=torch.float64).numpy(), rtol=3e-16, atol=0)
