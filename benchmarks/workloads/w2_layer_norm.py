"""W2: layer norm over the last axis of a (8192, 1024) float32 input, eps 1e-5, with
affine gamma and beta of shape (1024,); loss = (y * y).sum(). Forward+backward: the loss
and the gradients of x, gamma and beta.

Minimum traffic of a fully fused implementation: read x, gamma and beta once, write
grad_x, grad_gamma and grad_beta once.
"""

from __future__ import annotations

import numpy as np
import reference
from workloads._libs import compiled_step, dispatch, jax_array, jax_ready, torch_tensor, tracegrad_tensor

CASES = {"W2-fwdbwd": "W2 layer_norm (8192x1024), forward+backward"}
SHAPE, SMOKE_SHAPE = (8192, 1024), (64, 128)
EPS = 1e-5


def make_inputs(case: str, smoke: bool) -> dict:
    rng = np.random.default_rng(2)
    rows, cols = SMOKE_SHAPE if smoke else SHAPE
    return {"x": (rng.standard_normal((rows, cols), dtype=np.float32) * 2.0 + 0.5).astype(np.float32),
            "gamma": rng.uniform(0.5, 1.5, cols).astype(np.float32),
            "beta": rng.uniform(-0.5, 0.5, cols).astype(np.float32)}


def reference_outputs(case: str, inputs: dict) -> dict:
    return reference.reference_layer_norm(inputs, EPS)


def min_bytes(case: str, inputs: dict) -> int:
    return 2 * sum(a.nbytes for a in inputs.values())


def build(peer: str, case: str, inputs: dict):
    return dispatch(peer, numpy=lambda: _numpy(inputs),
                    tracegrad=lambda compiled: _tracegrad(inputs, compiled),
                    torch=lambda compiled: _torch(inputs, compiled),
                    jax=lambda: _jax(inputs))


def _numpy(inputs: dict):
    x, gamma, beta = inputs["x"], inputs["gamma"], inputs["beta"]
    n = x.shape[-1]

    def step():
        mean = x.mean(-1, keepdims=True)
        centered = x - mean
        rstd = 1.0 / np.sqrt((centered * centered).mean(-1, keepdims=True) + EPS)
        xhat = centered * rstd
        y = xhat * gamma + beta
        loss = (y * y).sum()
        dy = 2.0 * y
        dxhat = dy * gamma
        grad_x = (rstd / n) * (n * dxhat - dxhat.sum(-1, keepdims=True)
                               - xhat * (dxhat * xhat).sum(-1, keepdims=True))
        return {"loss": loss, "grad_x": grad_x, "grad_gamma": (dy * xhat).sum(0), "grad_beta": dy.sum(0)}
    return step


def _tracegrad(inputs: dict, compiled: bool):
    import tracegrad as tg
    import tracegrad.nn.functional as F
    x, gamma, beta = (tracegrad_tensor(inputs[k], True) for k in ("x", "gamma", "beta"))

    def fn(x, gamma, beta):
        y = F.layer_norm(x, (x.shape[-1],), gamma, beta, EPS)
        loss = (y * y).sum()
        grad_x, grad_gamma, grad_beta = tg.autograd.grad(loss, [x, gamma, beta])
        return {"loss": loss, "grad_x": grad_x, "grad_gamma": grad_gamma, "grad_beta": grad_beta}
    fn = tg.compile(fn) if compiled else fn
    return compiled_step(lambda: fn(x, gamma, beta), fn if compiled else None)


def _torch(inputs: dict, compiled: bool):
    import torch
    import torch.nn.functional as F
    x, gamma, beta = (torch_tensor(inputs[k], True) for k in ("x", "gamma", "beta"))

    def fn(x, gamma, beta):
        y = F.layer_norm(x, (x.shape[-1],), gamma, beta, EPS)
        loss = (y * y).sum()
        grad_x, grad_gamma, grad_beta = torch.autograd.grad(loss, [x, gamma, beta])
        return {"loss": loss, "grad_x": grad_x, "grad_gamma": grad_gamma, "grad_beta": grad_beta}
    fn = torch.compile(fn) if compiled else fn
    return lambda: fn(x, gamma, beta)


def _jax(inputs: dict):
    import jax
    import jax.numpy as jnp
    x, gamma, beta = (jax_array(inputs[k]) for k in ("x", "gamma", "beta"))

    def loss_fn(x, gamma, beta):
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + EPS) * gamma + beta
        return (y * y).sum()
    value_and_grad = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1, 2)))

    def step():
        loss, (grad_x, grad_gamma, grad_beta) = value_and_grad(x, gamma, beta)
        return jax_ready({"loss": loss, "grad_x": grad_x, "grad_gamma": grad_gamma, "grad_beta": grad_beta})
    return step
