"""The resnet program in float64, eagerly and in PyTorch from the same weights: its float32
runs may differ by ~1e-3 (Adam turns rounding in near-zero gradients into lr-sized steps),
so this pins that the two compute the same thing, step by step to rounding in float64."""

import pytest

from tests.programs import harness


@pytest.fixture
def float64_default():
    torch = pytest.importorskip("torch")
    import tracegrad
    tracegrad.set_default_dtype(tracegrad.float64)
    torch.set_default_dtype(torch.float64)
    yield
    tracegrad.set_default_dtype(tracegrad.float32)
    torch.set_default_dtype(torch.float32)


def test_resnet_in_float64_gives_pytorchs_losses_to_rounding(float64_default):
    ours = harness.load("resnet").main(4)
    theirs = harness.load("resnet", "torch").main(4, init=ours["init"])
    assert ours["init"]["fc.weight"].dtype.name == "float64"
    harness.assert_losses_close(ours["losses"], theirs["losses"], 1e-10, "resnet in float64")
