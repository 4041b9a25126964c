"""Starting rank programs under `mpiexec -n N` from a test (a subprocess with a timeout),
and skipping with the reason when this Python has no MPI (the `distributed` extra)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).resolve().parent / "rank_programs.py"
NO_MPI = "needs mpi4py and an MPI launcher: pip install -e '.[distributed]'"


def mpiexec() -> str | None:
    """The launcher of this Python's MPI (the mpich wheel puts it beside the interpreter)."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def has_mpi4py() -> bool:
    return importlib.util.find_spec("mpi4py") is not None


def require_mpiexec() -> str:
    launcher = mpiexec()
    if launcher is None or not has_mpi4py():
        pytest.skip(NO_MPI)
    return launcher


def run_ranks(*args: str, ranks: int = 2, timeout: float = 120, env: dict | None = None,
              script: Path = PROGRAMS) -> subprocess.CompletedProcess:
    """`mpiexec -n ranks python script args...`, with this worktree's tracegrad on the path
    and one kernel thread per rank (the ranks share the machine's cores)."""
    launcher = require_mpiexec()
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
                   "TRACEGRAD_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "TRACEGRAD_LOG": "",
                   **(env or {})}
    return subprocess.run([launcher, "-n", str(ranks), sys.executable, str(script), *args], capture_output=True,
                          text=True, timeout=timeout, env=environment, cwd=str(ROOT))
