"""The real-model workloads of the benchmark suite (benchmarks/workloads/w7-w11): their
analytic counts agree with the programs, and their check catches a wrong update."""

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import reference
    from workloads import CASES, _models, w8_lstm_lm, w9_mnist_cnn
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

REAL_MODELS = [case for case, module in CASES.items() if hasattr(module, "CHECK_STEPS")]


def _run(module, case: str, inputs: dict, peer: str = "tracegrad-eager", dtype: str = "float32") -> dict:
    step = module.build(peer, case, {k: v.copy() for k, v in inputs.items()}, dtype=dtype)
    outputs = [step() for _ in range(module.CHECK_STEPS)]
    stacked = {k: np.stack([np.asarray(o[k].item() if hasattr(o[k], "item") and np.ndim(o[k]) == 0 else o[k],
                                       np.float64) for o in outputs]) for k in outputs[0]}
    return module.postprocess(stacked, inputs)


def test_every_real_model_is_registered_with_its_peers():
    assert REAL_MODELS == ["W7-gpt", "W8-lstm", "W9-mnist", "W10-charrnn", "W11-fixedpoint"]
    assert all(CASES[case].PEERS == _models.LIBRARY_PEERS for case in REAL_MODELS)


@pytest.mark.parametrize("case", REAL_MODELS)
@pytest.mark.parametrize("smoke", [True, False])
def test_the_analytic_parameter_count_is_the_programs(case, smoke):
    import tracegrad
    module = CASES[case]
    inputs = module.make_inputs(case, smoke)
    model = module.make_model(tracegrad, inputs)
    assert module.parameter_count(inputs) == sum(p.numel() for p in model.parameters())


def test_a_wrong_update_fails_the_check(monkeypatch):
    """The losses of the checked steps barely move, but their change since the first step
    does: a learning rate 2% off must be caught (W8: SGD after gradient clipping)."""
    case = "W8-lstm"
    inputs = w8_lstm_lm.make_inputs(case, smoke=True)
    expected = _run(w8_lstm_lm, case, inputs, dtype="float64")
    floors = w8_lstm_lm.check_floors(expected)
    reference.check(_run(w8_lstm_lm, case, inputs), expected, "float32", floors=floors)  # passes as is
    monkeypatch.setattr(w8_lstm_lm, "LR", w8_lstm_lm.LR * 1.02)
    with pytest.raises(reference.Mismatch, match="loss_change"):
        reference.check(_run(w8_lstm_lm, case, inputs), expected, "float32", floors=floors)


def test_the_same_program_agrees_in_torch_and_tracegrad():
    pytest.importorskip("torch")
    case = "W9-mnist"
    inputs = w9_mnist_cnn.make_inputs(case, smoke=True)
    reference.check(_run(w9_mnist_cnn, case, inputs), _run(w9_mnist_cnn, case, inputs, peer="torch"),
                    "tracegrad eager", against="torch eager")


def test_gemm_flops_count_two_flops_per_multiply_add():
    assert _models.gemm_flops(_models.linear_gemms(4, 3, 5, input_grad=False)) == 2 * (2 * 4 * 3 * 5)
    assert _models.gemm_flops([(2, 3, 4, 5, 6)]) == 2 * 2 * 3 * 4 * 5 * 6
