"""Data-dependent control flow in a compiled function: Newton's method until convergence.

Run: python examples/control_flow.py [--quick]

`tg.compile` re-runs the Python function on every call with lazy tensors. Where Python
needs a value (`bool(t)` in the `while` condition and the `if`), the graph so far is
compiled and run on the spot, and tracing goes on with the answer. Each distinct path
(number of iterations, branch taken) is compiled once and cached; calls that take a path
seen before only hit the cache. Prints the paths compiled and checks the results.
"""

from __future__ import annotations

import argparse

import numpy as np

import tracegrad as tg


@tg.compile
def newton_sqrt(a: tg.Tensor, tolerance: float = 1e-12) -> tuple[tg.Tensor, int]:
    """sqrt(a) by Newton's iteration x <- (x + a / x) / 2, from x = max(a, 1)."""
    if a.min() < 0:  # a branch on data
        raise ValueError("newton_sqrt: negative input")
    x = tg.maximum(a, tg.ones_like(a))
    iterations = 0
    while True:  # a loop whose length depends on the data
        x_next = (x + a / x) * 0.5
        iterations += 1
        if ((x_next - x).abs() / x_next).max() <= tolerance:
            return x_next, iterations
        x = x_next


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer inputs (for CI)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    scales = [1.0, 100.0, 1e6] if args.quick else [1.0, 10.0, 100.0, 1e4, 1e6, 1e9]
    seen_iterations = set()
    for repeat in range(2):  # the second round takes the same paths: cache hits only
        misses_before = newton_sqrt.cache_info().misses
        for scale in scales:
            values = rng.uniform(0.5, 1.0, 1000) * scale
            root, iterations = newton_sqrt(tg.tensor(values, dtype=tg.float64))
            np.testing.assert_allclose(root.numpy(), np.sqrt(values), rtol=1e-12)
            seen_iterations.add(iterations)
            print(f"round {repeat + 1}: inputs around {scale:8.0e}: {iterations:2d} Newton iterations")
        new_misses = newton_sqrt.cache_info().misses - misses_before
        print(f"round {repeat + 1}: {new_misses} graphs compiled")
    try:
        newton_sqrt(tg.tensor([4.0, -1.0], dtype=tg.float64))
    except ValueError as error:
        print(f"the other branch: {error}")
    info = newton_sqrt.cache_info()
    # Every realization point (the `if` in each iteration) runs a graph of its own, so a path
    # of k iterations needs k + 2 graphs; paths share the graphs of their common prefix.
    print(f"paths compiled: {len(seen_iterations)} loop lengths and the error branch, in {info.graphs} graphs "
          f"({info.hits} cache hits, {info.misses} misses)")
    assert new_misses == 0, "the second round should only hit the cache"
    assert len(seen_iterations) >= 2


if __name__ == "__main__":
    main()
