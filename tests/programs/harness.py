"""Running the ported real programs of `tests/programs/` with tracegrad (eagerly and with
their training step compiled) and, where it is installed, with PyTorch from the same
initial weights.

A program is a module `tests/programs/ports/<name>.py`: a public PyTorch program ported with only
the import changed (`import tracegrad as torch`, and `tracegrad.nn` etc. for `torch.nn`)
and its data source made synthetic. Its header names the source (repository, path, commit
or date). It defines

    def main(steps: int, compiled: bool = False, init: dict | None = None) -> dict

which trains for `steps` steps in a reduced configuration and returns at least
`{"losses": [float per step], "init": {name: np.ndarray}, "step_seconds": [float per step]}`:
the initial weights it trained from (its models' state_dicts, names prefixed per model when
there are several) and the wall time of each training step (for docs/programs.md). Given
`init`, it loads those weights instead of its own initialization, so the same run can be
repeated compiled and in PyTorch. `compiled=True` runs the training step through
`torch.compile`. Data comes from NumPy generators, never from torch's random numbers (the
two libraries draw different sequences); dropout, where a program has it, is off in the
reduced configuration so runs are comparable.

It also defines `STEPS` (the reduced run's length), `check(result)` (asserts the program's
outcome, e.g. the loss falls), and `COMPILED_RTOL` / `TORCH_RTOL`: the step-by-step
tolerance of the compiled run and of the PyTorch run against eager. None says the runs
cannot agree step by step (randomness inside the step that the libraries draw differently,
such as a VAE's noise): then the run is only held to `check`.

`load(name, library)` loads the program's source with `library` ("tracegrad" or "torch")
as `torch`: the PyTorch run executes the same text with the import lines swapped back.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PORTS = HERE / "ports"  # (the ported programs keep their authors' style: pyproject's lint exemption)

# The import lines a port changed, and their PyTorch spelling.
_SWAPS = [(re.compile(r"\btracegrad\b"), "torch")]


def source(name: str) -> str:
    return (PORTS / f"{name}.py").read_text()


def load(name: str, library: str = "tracegrad") -> types.ModuleType:
    """The program `name` as a fresh module, with `library` as its torch."""
    if library == "tracegrad":
        spec = importlib.util.spec_from_file_location(f"tests.programs.ports.{name}", PORTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    if library != "torch":
        raise ValueError(f"load: library must be 'tracegrad' or 'torch', not {library!r}")
    text = source(name)
    for pattern, replacement in _SWAPS:
        text = pattern.sub(replacement, text)
    module = types.ModuleType(f"torch_port_of_{name}")
    module.__file__ = str(PORTS / f"{name}.py")
    sys.modules[module.__name__] = module  # (dataclasses and pickling look the module up)
    exec(compile(text, module.__file__, "exec"), module.__dict__)
    return module


def assert_losses_close(got: list[float], want: list[float], rtol: float, what: str) -> None:
    """Step-by-step agreement of two loss curves (same length, finite, within rtol)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: {got.shape[0]} losses against {want.shape[0]}"
    assert np.isfinite(got).all(), f"{what}: non-finite losses {got}"
    worst = int(np.argmax(np.abs(got - want) / np.maximum(np.abs(want), 1e-12)))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 1e-2,
                               err_msg=f"{what}: first bad step near {worst}: {got[worst]} vs {want[worst]}")
