"""examples/train_digits_ddp.py under `mpiexec -n 2` with --quick: the script asserts its
own outcome (identical ranks, the checkpoint restoring them, one compiled step, 95%), so
the test checks the exit status and the lines that report it."""

from pathlib import Path

import pytest

from tests.distributed.launch import run_ranks

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_digits_ddp.py"


def test_train_digits_ddp_on_two_ranks_trains_identical_replicas_to_95_percent(tmp_path):
    pytest.importorskip("sklearn")
    result = run_ranks("--quick", "--out", str(tmp_path), script=EXAMPLE, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "on 2 ranks" in result.stdout
    assert "parameters identical on all 2 ranks: True" in result.stdout
    assert "restores them on every rank: True" in result.stdout
    accuracy = next(line for line in result.stdout.splitlines() if line.startswith("test accuracy"))
    assert float(accuracy.split()[2].rstrip("%")) >= 95.0
    assert (tmp_path / "digits_ddp.pt").exists()
