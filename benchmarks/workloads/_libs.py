"""Helpers shared by the workload modules: turning the shared float32 NumPy inputs into
each library's arrays, and dispatching a peer name to a workload's implementation."""

from __future__ import annotations

from collections.abc import Callable


def tracegrad_tensor(array, requires_grad: bool = False):
    """A tracegrad tensor sharing memory with `array`."""
    import tracegrad as tg
    tensor = tg.from_numpy(array)
    return tensor.requires_grad_() if requires_grad else tensor


def torch_tensor(array, requires_grad: bool = False):
    """A torch CPU tensor sharing memory with `array`."""
    import torch
    tensor = torch.from_numpy(array)
    return tensor.requires_grad_() if requires_grad else tensor


def jax_array(array):
    """A jax array on the CPU device (a copy of `array`)."""
    import jax.numpy as jnp
    return jnp.asarray(array)


def jax_ready(tree):
    """Wait for jax's asynchronous dispatch to finish (every timed call must include the work)."""
    import jax
    return jax.block_until_ready(tree)


def compiled_step(step: Callable, compiled) -> Callable:
    """Mark `step` with the compiled function it calls, so the worker can report its
    cache statistics (tg.compile's `cache_info()`); `compiled` may be None (eager)."""
    step.compiled = compiled
    return step


def dispatch(peer: str, *, numpy: Callable, tracegrad: Callable, torch: Callable, jax: Callable) -> Callable:
    """Call the implementation builder of `peer`; `compiled` tells the tracegrad and torch
    builders whether to wrap the step in tg.compile / torch.compile."""
    if peer == "numpy":
        return numpy()
    if peer in ("tracegrad-eager", "tracegrad-compiled"):
        return tracegrad(compiled=peer == "tracegrad-compiled")
    if peer in ("torch", "torch-compile"):
        return torch(compiled=peer == "torch-compile")
    if peer == "jax":
        return jax()
    raise KeyError(f"no implementation for peer {peer!r}")
