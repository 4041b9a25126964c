"""Hessian-vector products with `create_graph=True`, eager and compiled, checked against
finite differences of the gradient.

Run: python examples/higher_order.py [--quick]

With `create_graph=True`, `tg.autograd.grad` records the backward pass itself, so the
gradient can be differentiated again: H v = d/dx (grad f(x) . v), without forming H.
Inside `tg.compile` the same code traces forward, backward and double backward into one
graph.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import tracegrad as tg


def energy(x: tg.Tensor, a: tg.Tensor) -> tg.Tensor:
    """A smooth non-quadratic function: sum(tanh(A x)^2) + 0.1 * sum(x^4)."""
    return (a @ x).tanh().pow(2).sum() + 0.1 * x.pow(4).sum()


def gradient(x: tg.Tensor, a: tg.Tensor) -> tg.Tensor:
    x = x.detach().requires_grad_(True)
    (g,) = tg.autograd.grad(energy(x, a), [x])
    return g


def hessian_vector_product(x: tg.Tensor, a: tg.Tensor, v: tg.Tensor) -> tg.Tensor:
    x = x.detach().requires_grad_(True)
    (g,) = tg.autograd.grad(energy(x, a), [x], create_graph=True)  # g is differentiable
    (hv,) = tg.autograd.grad((g * v).sum(), [x])
    return hv


def finite_difference_hvp(x: tg.Tensor, a: tg.Tensor, v: tg.Tensor, eps: float = 1e-5) -> np.ndarray:
    plus, minus = gradient(x + eps * v, a), gradient(x - eps * v, a)
    return (plus.numpy() - minus.numpy()) / (2 * eps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer vectors (for CI)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    n = 16
    a = tg.tensor(rng.normal(size=(n, n)) / np.sqrt(n), dtype=tg.float64)
    x = tg.tensor(rng.normal(size=n), dtype=tg.float64)
    compiled_hvp = tg.compile(hessian_vector_product)
    vectors = 3 if args.quick else 20
    worst, timings = 0.0, {"eager": 0.0, "compiled": 0.0}
    for i in range(vectors):
        v = tg.tensor(rng.normal(size=n), dtype=tg.float64)
        start = time.perf_counter()
        eager = hessian_vector_product(x, a, v).numpy()
        timings["eager"] += time.perf_counter() - start
        start = time.perf_counter()
        compiled = compiled_hvp(x, a, v).numpy()
        if i > 0:  # the first call compiles
            timings["compiled"] += time.perf_counter() - start
        reference = finite_difference_hvp(x, a, v)
        error = np.abs(eager - reference).max() / np.abs(reference).max()
        worst = max(worst, error)
        np.testing.assert_allclose(compiled, eager, rtol=1e-10, atol=1e-12)
        if i < 3:
            print(f"v{i}: |Hv| = {np.linalg.norm(eager):.4f}, relative difference to finite differences "
                  f"{error:.1e}, compiled == eager")
    print(f"{vectors} Hessian-vector products: worst relative difference to finite differences {worst:.1e}")
    print(f"time per product: eager {1e3 * timings['eager'] / vectors:.2f} ms, compiled "
          f"{1e3 * timings['compiled'] / (vectors - 1):.2f} ms after the first call "
          f"({compiled_hvp.cache_info()})")

    # The full Hessian, one product per basis vector, is symmetric.
    hessian = np.stack([hessian_vector_product(x, a, tg.tensor(e)).numpy() for e in np.eye(n)])
    asymmetry = np.abs(hessian - hessian.T).max()
    print(f"Hessian from {n} products: symmetric to {asymmetry:.1e}")
    assert worst < 1e-6, f"Hessian-vector products differ from finite differences by {worst:.1e}"
    assert asymmetry < 1e-12


if __name__ == "__main__":
    main()
