"""The benchmark suite's correctness checks, in its tiny --smoke mode.

Runs `python benchmarks/run.py --smoke` for the peers that need nothing beyond
tracegrad's own dependencies (numpy, tracegrad eager and compiled): every workload
checks its result against its reference in a child process (W1-W5: float64 NumPy; the
real models W7-W11: the same program in PyTorch eager, or without PyTorch in tracegrad
eager float64), and the driver writes the table and the JSON. Optional peers (torch, jax)
are not required.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE_PEERS = ["numpy", "tracegrad-eager", "tracegrad-compiled"]


def test_smoke_suite_checks_every_pair(tmp_path):
    output = tmp_path / "smoke.json"
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(tmp_path / "kernels"))
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--smoke", "--peers", ",".join(CORE_PEERS),
         "--output", str(output)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    data = json.loads(output.read_text())
    results = data["results"]
    assert all(r["status"] == "ok" for r in results), [r for r in results if r["status"] != "ok"]
    steady = {(r["case"], r["peer"]) for r in results if r["kind"] == "steady"}
    cases = ["W1-fwd", "W1-fwdbwd", "W2-fwdbwd", "W3-fwdbwd", "W4-step", "W5-fwdbwd"]
    real_models = ["W7-gpt", "W8-lstm", "W9-mnist", "W10-charrnn", "W11-fixedpoint"]
    assert steady == ({(c, p) for c in cases for p in CORE_PEERS}
                      | {(c, p) for c in real_models for p in CORE_PEERS if p != "numpy"})
    modelled = {r["case"]: r for r in results if r["case"] in real_models}
    assert all(r["bound_s"] > 0 and r["gemm_share"] > 0 for r in modelled.values())
    assert set(data["meta"]["gemm_cases"]) == set(real_models)
    first_calls = {(r["case"], r["kind"]) for r in results if r["kind"] != "steady"}
    assert first_calls == {(c, k) for c in ("W1-fwdbwd", "W2-fwdbwd", "W4-step") for k in ("cold", "warm")}
    assert "| W1 fwd+bwd | tracegrad-compiled |" in done.stdout
    assert (tmp_path / "smoke.md").read_text() == data["markdown"]


def test_a_wrong_result_fails_loudly(tmp_path):
    """The check must catch a wrong implementation: perturb one output and expect a Mismatch."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import reference
        from workloads import w2_layer_norm
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    inputs = w2_layer_norm.make_inputs("W2-fwdbwd", smoke=True)
    outputs = {k: v for k, v in w2_layer_norm.build("numpy", "W2-fwdbwd", inputs)().items()}
    expected = reference.reference_layer_norm(inputs, w2_layer_norm.EPS)
    reference.check(outputs, expected, "numpy")  # passes as is
    outputs["grad_gamma"] = outputs["grad_gamma"] * 1.01
    try:
        reference.check(outputs, expected, "numpy")
    except reference.Mismatch as error:
        assert "grad_gamma" in str(error)
    else:
        raise AssertionError("a 1% error in grad_gamma was not detected")
