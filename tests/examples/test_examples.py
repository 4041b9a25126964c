"""Each example runs with --quick in a subprocess; the script asserts its own outcome
(accuracy, agreement with eager or finite differences, no recompiles), so a test checks the
exit status and the line that reports the outcome."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, *args: str, timeout: float = 300) -> str:
    result = subprocess.run([sys.executable, str(EXAMPLES / name), "--quick", *args], capture_output=True,
                            text=True, timeout=timeout, env={**os.environ, "TRACEGRAD_LOG": ""})
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def trained_digits(tmp_path_factory) -> tuple[Path, str]:
    pytest.importorskip("sklearn")
    out = tmp_path_factory.mktemp("digits")
    return out, run_example("train_digits.py", "--out", str(out))


def test_train_digits_reaches_95_percent_test_accuracy(trained_digits):
    _, output = trained_digits
    line = next(line for line in output.splitlines() if line.startswith("test accuracy"))
    assert float(line.split()[2].rstrip("%")) >= 95.0


def test_train_digits_reports_eager_and_compiled_step_times_and_the_cache(trained_digits):
    _, output = trained_digits
    assert "time per training step (batch 64): eager" in output
    assert "compile cache: CacheInfo(hits=" in output


def test_train_digits_prints_one_progress_line_per_epoch(trained_digits):
    _, output = trained_digits
    assert sum(line.startswith("epoch ") and "samples/s" in line for line in output.splitlines()) == 10


def test_train_digits_saves_its_weights(trained_digits):
    out, _ = trained_digits
    assert (out / "digits_mlp.npz").stat().st_size > 0


def test_train_digits_writes_the_loss_curve_when_matplotlib_is_installed(trained_digits):
    pytest.importorskip("matplotlib")
    out, _ = trained_digits
    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_finetune_frozen_trains_only_the_head_of_the_saved_model(trained_digits):
    out, _ = trained_digits
    output = run_example("finetune_frozen.py", "--out", str(out))
    assert f"loaded {out / 'digits_mlp.npz'}" in output
    assert "frozen parameters have no .grad: True; unchanged by training: True" in output
    assert "matmuls in the compiled step: 4 with the base frozen, 8 training everything" in output


def test_control_flow_compiles_each_path_once():
    output = run_example("control_flow.py")
    assert "round 2: 0 graphs compiled" in output
    assert "paths compiled: 3 loop lengths and the error branch" in output


def test_inspect_ir_prints_every_stage():
    output = run_example("inspect_ir.py")
    for heading in ("tg.ir.dump(loss)", "tg.autograd.backward_graph(loss, [w])", "fn.explain(x, w)",
                    "report.llvm_ir()"):
        assert heading in output
    assert "compiled result equals eager: ok" in output


def test_higher_order_hessian_vector_products_match_finite_differences():
    output = run_example("higher_order.py")
    assert "3 Hessian-vector products: worst relative difference to finite differences" in output


def test_train_mlp_reaches_90_percent_accuracy():
    output = run_example("train_mlp.py")
    assert "train accuracy" in output
