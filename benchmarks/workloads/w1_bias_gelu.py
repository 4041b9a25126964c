"""W1: y = gelu_tanh(x * w + b), loss = y.sum(), on 4,194,304 float32 elements.

x has shape (4096, 1024); w and b have shape (1024,) and broadcast over the rows (a
per-feature scale and bias, as in a transformer MLP). Two cases: the forward pass alone
(the loss), and forward+backward (the loss and the gradients of x, w and b).

Minimum traffic of a fully fused implementation: read x, w and b once, write grad_x,
grad_w and grad_b once (the forward case writes only a scalar).
"""

from __future__ import annotations

import math

import numpy as np
import reference
from workloads._libs import compiled_step, dispatch, jax_array, jax_ready, torch_tensor, tracegrad_tensor

CASES = {
    "W1-fwd": "W1 bias+gelu_tanh, forward",
    "W1-fwdbwd": "W1 bias+gelu_tanh, forward+backward",
}
SHAPE, SMOKE_SHAPE = (4096, 1024), (64, 128)
C, A = math.sqrt(2.0 / math.pi), 0.044715


def make_inputs(case: str, smoke: bool) -> dict:
    rng = np.random.default_rng(1)
    rows, cols = SMOKE_SHAPE if smoke else SHAPE
    return {"x": rng.standard_normal((rows, cols), dtype=np.float32),
            "w": rng.uniform(0.5, 1.5, cols).astype(np.float32),
            "b": rng.uniform(-0.5, 0.5, cols).astype(np.float32)}


def reference_outputs(case: str, inputs: dict) -> dict:
    return reference.reference_bias_gelu(inputs, backward=case == "W1-fwdbwd")


def min_bytes(case: str, inputs: dict) -> int:
    read = sum(a.nbytes for a in inputs.values())
    return read + 4 if case == "W1-fwd" else 2 * read


def build(peer: str, case: str, inputs: dict):
    backward = case == "W1-fwdbwd"
    return dispatch(peer, numpy=lambda: _numpy(inputs, backward),
                    tracegrad=lambda compiled: _tracegrad(inputs, backward, compiled),
                    torch=lambda compiled: _torch(inputs, backward, compiled),
                    jax=lambda: _jax(inputs, backward))


def _numpy(inputs: dict, backward: bool):
    x, w, b = inputs["x"], inputs["w"], inputs["b"]

    def step():
        z = x * w + b
        z2 = z * z
        t = np.tanh(C * z * (1.0 + A * z2))
        half_z = 0.5 * z
        loss = (half_z * (1.0 + t)).sum()
        if not backward:
            return {"loss": loss}
        dz = 0.5 * (1.0 + t) + half_z * (1.0 - t * t) * C * (1.0 + 3.0 * A * z2)
        return {"loss": loss, "grad_x": dz * w, "grad_w": (dz * x).sum(0), "grad_b": dz.sum(0)}
    return step


def _tracegrad(inputs: dict, backward: bool, compiled: bool):
    import tracegrad as tg
    import tracegrad.nn.functional as F
    x, w, b = (tracegrad_tensor(inputs[k], backward) for k in ("x", "w", "b"))

    def fn(x, w, b):
        loss = F.gelu(x * w + b, approximate="tanh").sum()
        if not backward:
            return {"loss": loss}
        grad_x, grad_w, grad_b = tg.autograd.grad(loss, [x, w, b])
        return {"loss": loss, "grad_x": grad_x, "grad_w": grad_w, "grad_b": grad_b}
    fn = tg.compile(fn) if compiled else fn
    return compiled_step(lambda: fn(x, w, b), fn if compiled else None)


def _torch(inputs: dict, backward: bool, compiled: bool):
    import torch
    import torch.nn.functional as F
    x, w, b = (torch_tensor(inputs[k], backward) for k in ("x", "w", "b"))

    def fn(x, w, b):
        loss = F.gelu(x * w + b, approximate="tanh").sum()
        if not backward:
            return {"loss": loss}
        grad_x, grad_w, grad_b = torch.autograd.grad(loss, [x, w, b])
        return {"loss": loss, "grad_x": grad_x, "grad_w": grad_w, "grad_b": grad_b}
    fn = torch.compile(fn) if compiled else fn
    if not backward:
        return lambda: _no_grad(fn, x, w, b)
    return lambda: fn(x, w, b)


def _no_grad(fn, *args):
    import torch
    with torch.no_grad():
        return fn(*args)


def _jax(inputs: dict, backward: bool):
    import jax
    x, w, b = (jax_array(inputs[k]) for k in ("x", "w", "b"))

    def loss_fn(x, w, b):
        return jax.nn.gelu(x * w + b, approximate=True).sum()

    if not backward:
        forward = jax.jit(loss_fn)
        return lambda: jax_ready({"loss": forward(x, w, b)})
    value_and_grad = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1, 2)))

    def step():
        loss, (grad_x, grad_w, grad_b) = value_and_grad(x, w, b)
        return jax_ready({"loss": loss, "grad_x": grad_x, "grad_w": grad_w, "grad_b": grad_b})
    return step
