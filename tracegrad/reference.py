"""The reference mode: one switch that turns every speed layer off, so that a program runs
the plainest way tracegrad has. It is the third opinion of the differential fuzzer
(`tests/fuzz/`) and the first step of bisecting a wrong compiled result.

`TRACEGRAD_REFERENCE=1` (read at import) or `tg.reference_mode(True)` turns it on for the
whole process; `with tg.reference_mode():` turns it on for a block and restores the
previous setting after. Each speed layer asks this module (`ACTIVE`) where it checks its
own switch:

| layer                                                        | its own switch              |
|--------------------------------------------------------------|-----------------------------|
| followed traces (`jit.replay`), composites taken in one step (`jit.composite`) | `TRACEGRAD_REPLAY=0` |
| traced-backward templates (`autograd/traced_backward.py`)    | none                        |
| the eager backward cache (`autograd/backward_cache.py`)      | none                        |
| eager fusion (`functional/eager_fusion.py`)                  | `TRACEGRAD_EAGER_COMPILE=0` |
| optimizer updates fused in place (`functional/fused_update.py`) | `TRACEGRAD_EAGER_COMPILE=0` |
| in-place arithmetic on data by NumPy in place (`tensor_methods._writes_data_only`) | none |
| a `TensorDataset` batch in one gather (`TensorDataset.collated_batch`) | none |
| an `nn.LSTM` layer's time loop as one op (`ops/lstm_layer.py`) | none              |
| the generated GEMM of large eager products (`matmul_steps`)  | `TRACEGRAD_MATMUL=numpy`    |
| index_add's rows added by a generated loop (`codegen/row_adds.py`) | none               |
| the in-memory program cache (`runtime/program_cache.py`)     | none                        |
| the disk cache of object code (`runtime/disk_cache.py`)      | `TRACEGRAD_CACHE=0`         |
| fused LLVM programs: graphs run by `ir.interpret` instead    | `backend="interpret"`       |

A compiled function in reference mode traces every call in full and runs the traced graph
(unpruned, unoptimized) through the NumPy interpreter. Outside reference mode, the compile
backends bisect a wrong result one stage at a time: `tg.compile(fn, backend="interpret")`
interprets the traced graph (the speed layers of tracing stay on), `"interpret-optimized"`
interprets the optimized graph the code generator would get, and `"llvm"` (the default)
runs fused kernels.
"""

from __future__ import annotations

import os

import numpy as np

ACTIVE: bool = os.environ.get("TRACEGRAD_REFERENCE", "").strip() == "1"

BACKENDS = ("llvm", "interpret", "interpret-optimized")


class reference_mode:  # noqa: N801 - a function-like name, as torch.set_grad_enabled
    """Turn the reference mode on (`reference_mode(False)`: off) for the whole process, now;
    as a context manager, restore the previous setting when the block ends."""

    def __init__(self, mode: bool = True):
        global ACTIVE
        self.previous = ACTIVE
        ACTIVE = bool(mode)

    def __enter__(self) -> reference_mode:
        return self

    def __exit__(self, *exc_info) -> None:
        global ACTIVE
        ACTIVE = self.previous


def is_reference_mode() -> bool:
    return ACTIVE


# The process environment's own mapping and the switch's key in it, where `os.environ`
# has them (CPython's `_Environ`): eager ops ask `eager_compile` on every call, and
# `os.environ.get` (a Mapping method encoding the key) costs about half a microsecond,
# while the switch must still follow the environment as it changes (tests set it).
_ENVIRONMENT = getattr(os.environ, "_data", None)
_SWITCH_KEY = os.environ.encodekey("TRACEGRAD_EAGER_COMPILE") if _ENVIRONMENT is not None else None
_OFF = os.environ.encodevalue("0") if _ENVIRONMENT is not None else None


def eager_compile() -> bool:
    """Whether eager execution may run compiled programs (eager fusion, the backward
    cache's LLVM tier): not in reference mode nor with `TRACEGRAD_EAGER_COMPILE=0`."""
    if ACTIVE:
        return False
    if _ENVIRONMENT is not None:
        return _ENVIRONMENT.get(_SWITCH_KEY) != _OFF
    return os.environ.get("TRACEGRAD_EAGER_COMPILE", "1") != "0"


class InterpretedProgram:
    """A graph run by the NumPy interpreter, with the interface `tracegrad.jit.function` uses of a
    `runtime.program.Program` (`run`, `feeds`, `kernel_count`)."""

    kernel_count = 0
    steps = ()
    interpreted = False  # (not a program the compile cache gives kernels when it runs again)
    nbytes = 0  # (what the compile cache counts: no machine code, no kept buffers)
    dropped_checks = None  # (the reference mode interprets the unpruned graph: every op checks)

    def __init__(self, graph):
        self.graph = graph
        self.name = graph.name
        self.feeds: tuple[int, ...] | None = None

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        from tracegrad.ir.interpreter import interpret
        return interpret(self.graph, list(arrays))


def interpreted_program(graph, donations: tuple = ()) -> InterpretedProgram:
    """A program builder (`tg.compile(builder=...)`) that runs the graph it is given through
    the interpreter; results never go into donated buffers."""
    return InterpretedProgram(graph)

