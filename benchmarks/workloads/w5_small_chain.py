"""W5: per-call overhead. A 16-element float32 tensor goes through a chain of 10
elementwise ops (mul, add, sin, mul, exp, sub, tanh, mul, sigmoid, div) and a sum;
forward+backward (the loss and the gradient of x). The arithmetic is negligible, so the
time is the library's fixed cost per op and per call (dispatch, autograd bookkeeping,
tracing and cache lookup for tg.compile). Reported in microseconds per call.
"""

from __future__ import annotations

import numpy as np
import reference
from workloads._libs import compiled_step, dispatch, jax_array, jax_ready, torch_tensor, tracegrad_tensor

CASES = {"W5-fwdbwd": "W5 16 elements, 10 elementwise ops + sum, forward+backward"}
SIZE = 16


def make_inputs(case: str, smoke: bool) -> dict:
    rng = np.random.default_rng(5)
    return {"x": rng.uniform(-1.0, 1.0, SIZE).astype(np.float32)}


def reference_outputs(case: str, inputs: dict) -> dict:
    return reference.reference_small_chain(inputs)


def min_bytes(case: str, inputs: dict) -> None:
    return None  # overhead-bound


def chain(x, sin, exp, tanh, sigmoid):
    """The ten ops, written once for every library that overloads the operators."""
    y = x * 1.5
    y = y + 0.25
    y = sin(y)
    y = y * x
    y = exp(y)
    y = y - 1.0
    y = tanh(y)
    y = y * y
    y = sigmoid(y)
    return y / 2.0


def build(peer: str, case: str, inputs: dict):
    return dispatch(peer, numpy=lambda: _numpy(inputs),
                    tracegrad=lambda compiled: _tracegrad(inputs, compiled),
                    torch=lambda compiled: _torch(inputs, compiled),
                    jax=lambda: _jax(inputs))


def _numpy(inputs: dict):
    x = inputs["x"]

    def step():
        v2 = x * 1.5 + 0.25
        v3 = np.sin(v2)
        v5 = np.exp(v3 * x)
        v7 = np.tanh(v5 - 1.0)
        v9 = 1.0 / (1.0 + np.exp(-(v7 * v7)))
        loss = (v9 / 2.0).sum()
        d4 = 0.5 * v9 * (1.0 - v9) * 2.0 * v7 * (1.0 - v7 * v7) * v5
        return {"loss": loss, "grad_x": d4 * v3 + np.cos(v2) * 1.5 * d4 * x}
    return step


def _tracegrad(inputs: dict, compiled: bool):
    import tracegrad as tg
    x = tracegrad_tensor(inputs["x"], True)

    def fn(x):
        loss = chain(x, tg.sin, tg.exp, tg.tanh, tg.sigmoid).sum()
        (grad,) = tg.autograd.grad(loss, [x])
        return {"loss": loss, "grad_x": grad}
    fn = tg.compile(fn) if compiled else fn
    return compiled_step(lambda: fn(x), fn if compiled else None)


def _torch(inputs: dict, compiled: bool):
    import torch
    x = torch_tensor(inputs["x"], True)

    def fn(x):
        loss = chain(x, torch.sin, torch.exp, torch.tanh, torch.sigmoid).sum()
        (grad,) = torch.autograd.grad(loss, [x])
        return {"loss": loss, "grad_x": grad}
    fn = torch.compile(fn) if compiled else fn
    return lambda: fn(x)


def _jax(inputs: dict):
    import jax
    import jax.numpy as jnp
    x = jax_array(inputs["x"])
    value_and_grad = jax.jit(jax.value_and_grad(
        lambda x: chain(x, jnp.sin, jnp.exp, jnp.tanh, jax.nn.sigmoid).sum()))

    def step():
        loss, grad = value_and_grad(x)
        return jax_ready({"loss": loss, "grad_x": grad})
    return step
