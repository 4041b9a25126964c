"""The libraries the suite compares ("peers"): how to detect, configure and import each.

Every peer runs in its own child process. `child_env` gives the environment the driver
sets before the child starts (thread counts must be fixed before a library loads its
thread pools); `setup` runs first in the child, imports the library and applies the
runtime thread settings; `to_numpy` converts a library array for the correctness check.

Threads (the machine has 2 cores; every row may use both):
- OPENBLAS_NUM_THREADS=2 for every child, so NumPy's matmul (the numpy and
  tracegrad-eager rows) runs on 2 threads; NumPy's elementwise ops are single-threaded.
  tracegrad-compiled splits big kernels and its generated matmul over both cores
  (TRACEGRAD_NUM_THREADS defaults to the core count); fused eager composites too.
- torch: torch.set_num_threads(2), one inter-op thread (OMP_NUM_THREADS=2).
- jax: XLA's CPU client uses all cores (2) by default; nothing is changed.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

THREADS = 2


@dataclass(frozen=True)
class Peer:
    name: str
    module: str  # import name that must be installed for the row to appear
    threads: str  # one line for the table header
    compiled: bool = False  # has a compile step (gets W6 cold/warm rows)

    def available(self) -> bool:
        return importlib.util.find_spec(self.module) is not None


PEERS: dict[str, Peer] = {p.name: p for p in [
    Peer("numpy", "numpy", f"OpenBLAS {THREADS} threads (matmul); elementwise ops single-threaded"),
    Peer("tracegrad-eager", "tracegrad",
         f"NumPy ops; OpenBLAS {THREADS} threads (matmul); fused composites on {THREADS} threads"),
    Peer("tracegrad-compiled", "tracegrad",
         f"LLVM kernels and generated matmul on up to {THREADS} threads", compiled=True),
    Peer("torch", "torch", f"torch.set_num_threads({THREADS}), CPU build"),
    Peer("torch-compile", "torch", f"torch.set_num_threads({THREADS}), inductor C++ backend", compiled=True),
    Peer("jax", "jax", f"jax.jit, XLA CPU client (uses all {THREADS} cores by default)", compiled=True),
]}


def child_env(base: dict[str, str], cache_dir: str) -> dict[str, str]:
    """The environment of every child: fixed thread counts and private compiler caches."""
    env = dict(base)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(THREADS)
    env["TRACEGRAD_CACHE_DIR"] = os.path.join(cache_dir, "tracegrad")
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, "inductor")
    env["JAX_COMPILATION_CACHE_DIR"] = os.path.join(cache_dir, "jax")
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("PYTHONHASHSEED", "0")
    return env


def setup(name: str, persistent_cache: bool = False):
    """Import the peer's library in this (child) process and apply its thread settings."""
    if name == "numpy":
        import numpy
        return numpy
    if name.startswith("tracegrad"):
        import tracegrad
        return tracegrad
    if name.startswith("torch"):
        import torch
        torch.set_num_threads(THREADS)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass  # already set (only allowed before any parallel work)
        return torch
    if name == "jax":
        import jax
        if persistent_cache:  # W6: let the second process find the first one's executables
            jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        return jax
    raise KeyError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")


def to_numpy(value):
    """A host NumPy array from any peer's array (tracegrad/torch tensors, jax arrays)."""
    import numpy as np
    if hasattr(value, "detach"):  # torch and tracegrad tensors
        value = value.detach()
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        return np.asarray(value.numpy())
    return np.asarray(value)
