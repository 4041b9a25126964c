"""Helpers shared by the real-model workloads (W7-W11): one program text for both libraries.

Each real-model workload writes its model and training step once, as a function of the
library module (`program(torch)`, called with `torch` or with `tracegrad`, which a user
imports `as torch`), so the PyTorch and tracegrad rows run the same source. This module
holds what every such workload needs around that program:

- `library(peer)`: the module a peer runs the program with; `compile_step`: the step
  wrapped in `torch.compile` / `tg.compile` for the compiled peers.
- `load_parameters`: every parameter drawn once with NumPy (seeded by its name), so both
  libraries start from the same weights whatever their own initialization draws.
- `linear_gemms`, `gemm_flops`, `state_bytes`: the analytic GEMM count and the roofline's
  minimum traffic, from the model's shapes (documented in benchmarks/README.md).
- `postprocess`, `check_floors`: what the check compares, and its float32 floor.

Their correctness check is not a float64 NumPy reference: the worker runs the same
program in PyTorch eager (float32) in a separate process, or, without PyTorch, in
tracegrad eager in float64 (`worker.py reference`), and compares the losses of the first
`CHECK_STEPS` steps and their changes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np

# The rows a real-model workload has: no NumPy by hand (a training step of a GPT written out
# with its backward is not what anyone runs) and no jax (no fair version is written yet).
LIBRARY_PEERS = ("tracegrad-eager", "tracegrad-compiled", "torch", "torch-compile")
CHECK_STEPS = 4  # training steps compared with the reference (losses and their changes)


def library(peer: str):
    """The module the program runs with: `torch` for the torch peers, else tracegrad."""
    if peer in ("torch", "torch-compile"):
        import torch
        return torch
    if peer in ("tracegrad-eager", "tracegrad-compiled"):
        import tracegrad
        return tracegrad
    raise KeyError(f"no real-model implementation for peer {peer!r}; known: {', '.join(LIBRARY_PEERS)}")


def compile_step(lib, step: Callable, peer: str) -> Callable:
    """`step` itself (eager peers) or `lib.compile(step)` (torch.compile / tg.compile)."""
    return lib.compile(step) if peer.endswith("compiled") or peer.endswith("compile") else step


def parameter_array(seed: int, name: str, shape: tuple, init: str = "fan_in") -> np.ndarray:
    """A float64 array for parameter `name`, drawn from a generator seeded by (seed, name):
    uniform in ±1/sqrt(fan_in) (fan_in: the product of all but the first dim, or the size of
    a vector), or normal(0, 0.02) for init="normal" (GPT's)."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if init == "normal":
        return rng.normal(0.0, 0.02, shape)
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    bound = 1.0 / np.sqrt(fan_in)
    return rng.uniform(-bound, bound, shape)


def load_parameters(lib, model, seed: int, init: Callable[[str, tuple], str] | None = None,
                    overrides: dict[str, np.ndarray] | None = None) -> None:
    """Overwrite every parameter of `model` (except LayerNorm's, whose ones and zeros both
    libraries agree on) with `parameter_array(seed, name, shape)`, in the model's dtype."""
    keep = {f"{module_name}.{p}".lstrip(".") for module_name, module in model.named_modules()
            if isinstance(module, lib.nn.LayerNorm) for p in ("weight", "bias")}
    overrides = overrides or {}
    with lib.no_grad():
        for name, parameter in model.named_parameters():
            if name in keep:
                continue
            shape = tuple(parameter.shape)
            array = overrides.get(name)
            if array is None:
                array = parameter_array(seed, name, shape, init(name, shape) if init else "fan_in")
            parameter.copy_(lib.from_numpy(np.ascontiguousarray(array)).to(parameter.dtype))


def float_inputs(lib, array: np.ndarray, dtype: str):
    """`array` as a tensor of the run's float dtype (float32 timed, float64 for the reference)."""
    return lib.from_numpy(np.ascontiguousarray(array, dtype=dtype))


def postprocess(outputs: dict, inputs: dict) -> dict:
    """The compared quantities: the losses of the checked steps and their change since the
    first (the change measures the updates, which the losses alone hide below the float32
    tolerance), plus any other per-step outputs (e.g. W11's iteration counts)."""
    result = {k: np.asarray(v, np.float64) for k, v in outputs.items()}
    loss = result["loss"]
    result["loss_change"] = loss[1:] - loss[0]
    return result


def check_floors(expected: dict) -> dict:
    """`loss_change` is a difference of float32 losses: it cannot be closer than their rounding
    (a mean over thousands of terms summed in another order: a few ulps, 2e-6 of the loss)."""
    return {"loss_change": 2e-6 * float(np.abs(expected["loss"]).max())}


def gemm_flops(gemms: list[tuple[int, int, int, int, int]]) -> float:
    """FLOPs of (count, batch, M, K, N) products: 2 M K N each."""
    return float(sum(2.0 * count * batch * m * k * n for count, batch, m, k, n in gemms))


def linear_gemms(rows: int, fan_in: int, fan_out: int, input_grad: bool = True, count: int = 1) -> list:
    """The products of a linear layer on `rows` rows, forward and backward: y = x W^T,
    grad_W = grad_y^T x and, when the input needs a gradient, grad_x = grad_y W."""
    gemms = [(count, 1, rows, fan_in, fan_out), (count, 1, fan_out, rows, fan_in)]
    return gemms + ([(count, 1, rows, fan_out, fan_in)] if input_grad else [])


def state_bytes(parameters: int, arrays_read_and_written: int, input_bytes: int) -> int:
    """Roofline traffic of a training step: every parameter-sized array of the update (the
    parameters and the optimizer state) read once and written once, the batch read once.
    Gradients and activations are assumed to stay in cache: a lower bound."""
    return 4 * parameters * 2 * arrays_read_and_written + input_bytes
