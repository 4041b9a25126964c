"""Train a small MLP on two interleaved spirals with tracegrad's eager autograd.

Run: python examples/train_mlp.py [--quick]
Prints the loss every few epochs and the final training accuracy (asserted >= 90%).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import tracegrad as tg
import tracegrad.nn.functional as F


def spirals(n_per_class: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.sqrt(rng.random(n_per_class)) * 3 * np.pi
    arm = np.stack([t * np.cos(t), t * np.sin(t)], axis=1) / (3 * np.pi)
    x = np.concatenate([arm, -arm]) + rng.normal(0, 0.02, (2 * n_per_class, 2))
    y = np.concatenate([np.zeros(n_per_class), np.ones(n_per_class)]).astype(np.int64)
    return x.astype(np.float32), y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer steps (for CI)")
    args = parser.parse_args()
    tg.manual_seed(0)
    x_np, y_np = spirals(256)
    x, y = tg.tensor(x_np), tg.tensor(y_np)
    model = tg.nn.Sequential(tg.nn.Linear(2, 64), tg.nn.ReLU(), tg.nn.Linear(64, 64), tg.nn.ReLU(),
                             tg.nn.Linear(64, 2))
    optimizer = tg.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    steps = 300 if args.quick else 1500
    start = time.perf_counter()
    for step in range(1, steps + 1):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % (steps // 5) == 0:
            print(f"step {step:5d}  loss {loss.item():.4f}")
    elapsed = time.perf_counter() - start
    with tg.no_grad():
        accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    print(f"train accuracy {accuracy:.1%}  ({1e3 * elapsed / steps:.2f} ms/step eager)")
    assert accuracy >= 0.9, f"accuracy {accuracy:.1%} below 90%"


if __name__ == "__main__":
    main()
