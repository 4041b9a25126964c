"""Running one program in each mode and capturing what it produced (`Outcome`).

The modes (the oracles): the reference (eager in reference mode, every speed layer off),
eager four times on fresh copies of the same inputs (the eager backward cache's direct,
cached-program and fused tiers), compiled (cold, a cache hit, new values of the same
shapes twice: a followed trace, then the first values again), compiled as a function
whose calls kept making new graphs (`jit.backoff`: a call run eagerly, one built
interpreted, then one with its kernels), compiled in reference mode (the traced graph
interpreted), a warm disk cache (`child.py`, another process), and optionally PyTorch.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings

import numpy as np

NEW_VALUES = 1_000_003  # the inputs' seed offset for "new values, same shapes"


@dataclasses.dataclass
class Outcome:
    """What a run left: the error it raised (type and message), or per key ("out3",
    "grad:a0", "arg:a1") an array (None for a missing tensor, e.g. a `.grad` never set)
    with its declared dtype name."""

    error: str | None = None
    values: dict = dataclasses.field(default_factory=dict)
    dtypes: dict = dataclasses.field(default_factory=dict)


def load(source: str, torch_module, seed: int) -> dict:
    """Execute a program's source with `torch` bound to `torch_module`: its namespace."""
    namespace = {"torch": torch_module, "np": np, "__name__": f"fuzz_program_{seed}"}
    code = compile(source, f"<fuzz program {seed}>", "exec")
    exec(code, namespace)  # noqa: S102 - generated test programs
    return namespace


def _dtype_name(tensor) -> str:
    return str(tensor.dtype).split(".")[-1]


def _capture(outcome: Outcome, key: str, tensor) -> None:
    if tensor is None:
        outcome.values[key] = None
        return
    detached = tensor.detach()
    outcome.values[key] = np.array(detached.numpy(), copy=True)
    outcome.dtypes[key] = _dtype_name(tensor)


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]


def call(function, namespace: dict, seed: int) -> Outcome:
    """Make the inputs of `seed`, call `function` on them, capture results, `.grad` of the
    leaves and the arguments' values after the call (in-place updates)."""
    outcome = Outcome()
    try:
        args, leaves = namespace["inputs"](seed)
    except Exception as error:  # noqa: BLE001 - a program whose inputs fail is reported as such
        outcome.error = "inputs: " + _error_text(error)
        return outcome
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            results = function(*args)
        except Exception as error:  # noqa: BLE001 - any error is an outcome to compare
            outcome.error = _error_text(error)
            return outcome
        try:
            for i, result in enumerate(results):
                _capture(outcome, f"out{i}", result)
            for i, leaf in enumerate(leaves):
                _capture(outcome, f"grad:{i}", leaf.grad)
            for i, arg in enumerate(args):
                _capture(outcome, f"arg:{i}", arg)
        except Exception as error:  # noqa: BLE001 - a result that cannot be read (a lazy tensor...)
            outcome.error = "reading results: " + _error_text(error)
    return outcome


def run_modes(source: str, seed: int, with_torch: bool = False) -> dict[str, tuple[Outcome, Outcome]]:
    """Every in-process mode of one program: {mode: (outcome, the reference it is compared with)}."""
    import tracegrad as tg
    namespace = load(source, tg, seed)
    program = namespace["program"]
    with tg.reference_mode():
        reference = call(program, namespace, seed)
        reference_new = call(program, namespace, seed + NEW_VALUES)
    runs: dict[str, tuple[Outcome, Outcome]] = {}
    for i in range(1, 5):
        runs[f"eager#{i}"] = (call(program, namespace, seed), reference)
    compiled = tg.compile(program)
    runs["compiled cold"] = (call(compiled, namespace, seed), reference)
    runs["compiled hit"] = (call(compiled, namespace, seed), reference)
    runs["compiled new values"] = (call(compiled, namespace, seed + NEW_VALUES), reference_new)
    runs["compiled new values again"] = (call(compiled, namespace, seed + NEW_VALUES), reference_new)
    # (a branch the new values took otherwise: the recording of the first values' path
    # is a relative of the new one's, followed from where the paths part: `Replay.switch`)
    runs["compiled first values again"] = (call(compiled, namespace, seed), reference)
    unsettled = tg.compile(program)
    unsettled._backoff.unsettled = True  # (as after calls that kept making new graphs)
    for tier in ("eager", "interpreted", "upgraded"):
        runs[f"compiled unsettled: {tier}"] = (call(unsettled, namespace, seed), reference)
    with tg.reference_mode():
        runs["reference compiled"] = (call(tg.compile(program), namespace, seed), reference)
    if with_torch:
        runs["torch"] = (run_torch(source, seed), reference)
    return runs


# A program whose inputs or body name any of these is not its float32 self at another
# precision (it mixes precisions on purpose), so it has no float64 arbiter (`run_float64`).
FLOAT64_BLOCKERS = ("float64", "double", "float16", "half", "bfloat16", ".float()")


def run_float64(source: str, seed: int) -> Outcome | None:
    """The reference of the program with its float32 tensors float64 (the default dtype
    too): the arbiter of a float32 difference (`compare.rounding_only`); None for a
    program that names another floating dtype."""
    own = source[source.find("def inputs("):]  # (the helpers before it are the same for every program)
    if any(text in own for text in FLOAT64_BLOCKERS):
        return None
    import tracegrad as tg
    namespace = load(source.replace("torch.float32", "torch.float64"), tg, seed)
    previous = tg.get_default_dtype()
    tg.set_default_dtype(tg.float64)
    try:
        with tg.reference_mode():
            return call(namespace["program"], namespace, seed)
    finally:
        tg.set_default_dtype(previous)


def run_torch(source: str, seed: int, saved_copies: bool = False) -> Outcome:
    """The program run by PyTorch; `saved_copies`: with every tensor autograd saves copied
    as it is saved (`saved_tensors_hooks`), so a backward reads the values the forward
    read whatever was modified in place since, and raises no version error."""
    import torch
    namespace = load(source, torch, seed)
    program = namespace["program"]
    if saved_copies:
        def program(*args, _program=program):
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
                return _program(*args)
    return call(program, namespace, seed)


def run_warm(source: str, seed: int) -> dict[str, tuple[Outcome, Outcome]]:
    """The compiled call of a process whose disk cache an earlier process filled."""
    import tracegrad as tg
    namespace = load(source, tg, seed)
    with tg.reference_mode():
        reference = call(namespace["program"], namespace, seed)
    return {"compiled warm disk cache": (call(tg.compile(namespace["program"]), namespace, seed), reference)}


def bisect(source: str, seed: int, mode: str) -> dict[str, Outcome]:
    """The compiled call of a failing mode through the interpreting backends (the traced
    graph, then the optimized graph), to say which stage goes wrong."""
    import tracegrad as tg
    namespace = load(source, tg, seed)
    input_seed = seed + NEW_VALUES if "new values" in mode else seed
    calls = 2 if mode != "compiled cold" and "warm" not in mode else 1
    found = {}
    for backend in ("interpret", "interpret-optimized"):
        compiled = tg.compile(namespace["program"], backend=backend)
        for _ in range(calls):
            outcome = call(compiled, namespace, input_seed)
        found[backend] = outcome
    return found


def torch_available() -> bool:
    if "torch" in sys.modules:
        return True
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
