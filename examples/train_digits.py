"""Train an MLP on scikit-learn's 8x8 handwritten digits with a compiled training step.

Run: python examples/train_digits.py [--quick] [--epochs N] [--out DIR]

One `tg.compile`d function holds the whole step (forward, backward, AdamW update); a
cosine learning rate schedule changes the rate every step without recompiling, because the
rate reaches the compiled graph as a runtime scalar. Prints one progress line per epoch
(loss, throughput), then the test accuracy (asserted >= 95%), milliseconds per step eager
vs compiled, and the compile cache statistics. Writes loss_curve.png (when matplotlib is
installed) and the trained weights (digits_mlp.npz, read by finetune_frozen.py) to --out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import tracegrad as tg
import tracegrad.nn.functional as F
from digits_data import DEFAULT_OUT, WEIGHTS_FILE, accuracy, load_digits_split, make_mlp, save_weights

BATCH = 64


def make_train_step(model: tg.nn.Module, optimizer: tg.optim.Optimizer):
    def train_step(x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss
    return train_step


def batches(x: np.ndarray, y: np.ndarray, rng: np.random.Generator):
    """Shuffled full batches: every batch has one shape, so one compiled graph serves all."""
    order = rng.permutation(len(x))
    for start in range(0, len(x) - BATCH + 1, BATCH):
        index = order[start:start + BATCH]
        yield tg.tensor(x[index]), tg.tensor(y[index])


def progress_line(epoch: int, epochs: int, done: int, total: int, loss: float, rate: float) -> str:
    filled = int(20 * done / total)
    bar = "#" * filled + "." * (20 - filled)
    return f"epoch {epoch:3d}/{epochs} [{bar}] loss {loss:.4f}  {rate:8.0f} samples/s"


def train(model, x_train, y_train, epochs: int) -> tuple[list[float], tg.compile, tg.optim.Optimizer]:
    steps_per_epoch = len(x_train) // BATCH
    optimizer = tg.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    scheduler = tg.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * steps_per_epoch)
    train_step = tg.compile(make_train_step(model, optimizer))
    rng = np.random.default_rng(0)
    interactive = sys.stdout.isatty()
    losses = []
    for epoch in range(1, epochs + 1):
        start, epoch_losses = time.perf_counter(), []
        for i, (x, y) in enumerate(batches(x_train, y_train, rng), 1):
            epoch_losses.append(train_step(x, y).item())
            scheduler.step()
            if interactive:
                rate = i * BATCH / (time.perf_counter() - start)
                print("\r" + progress_line(epoch, epochs, i, steps_per_epoch, epoch_losses[-1], rate), end="")
        rate = steps_per_epoch * BATCH / (time.perf_counter() - start)
        losses.extend(epoch_losses)
        print(("\r" if interactive else "")
              + progress_line(epoch, epochs, steps_per_epoch, steps_per_epoch, float(np.mean(epoch_losses)), rate),
              flush=True)
    return losses, train_step, optimizer


def milliseconds_per_step(step, x: tg.Tensor, y: tg.Tensor, repeats: int) -> float:
    """The best of 5 blocks of `repeats` steps (other processes only ever add time)."""
    for _ in range(3):  # warm up: compiles (the eager backward is cached too)
        step(x, y)
    blocks = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            step(x, y).item()
        blocks.append((time.perf_counter() - start) / repeats)
    return 1e3 * min(blocks)


def compare_eager_and_compiled(x_train, y_train, repeats: int) -> tuple[float, float]:
    """Time the same step eagerly and compiled, on fresh copies of the model."""
    x, y = tg.tensor(x_train[:BATCH]), tg.tensor(y_train[:BATCH])
    timings = []
    for compiled in (False, True):
        tg.manual_seed(1)
        model = make_mlp()
        step = make_train_step(model, tg.optim.AdamW(model.parameters(), lr=1e-3))
        timings.append(milliseconds_per_step(tg.compile(step) if compiled else step, x, y, repeats))
    return timings[0], timings[1]


def plot_losses(losses: list[float], path: str) -> bool:
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot(losses, linewidth=0.8)
    axes.set_xlabel("step")
    axes.set_ylabel("training loss")
    axes.set_yscale("log")
    axes.set_title("MLP on 8x8 digits (tracegrad, compiled step)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer epochs and timing repeats (for CI)")
    parser.add_argument("--epochs", type=int, default=None, help="default: 30 (10 with --quick)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="where to write loss_curve.png and the weights")
    args = parser.parse_args()
    epochs = args.epochs or (10 if args.quick else 30)

    x_train, y_train, x_test, y_test = load_digits_split()
    print(f"digits: {len(x_train)} training and {len(x_test)} test images of 8x8 pixels, 10 classes")
    tg.manual_seed(0)
    model = make_mlp()
    losses, train_step, optimizer = train(model, x_train, y_train, epochs)

    test_accuracy = accuracy(model, x_test, y_test)
    print(f"test accuracy {test_accuracy:.1%}")
    eager_ms, compiled_ms = compare_eager_and_compiled(x_train, y_train, repeats=10 if args.quick else 40)
    print(f"time per training step (batch {BATCH}): eager {eager_ms:.2f} ms, compiled {compiled_ms:.2f} ms "
          f"({eager_ms / compiled_ms:.1f}x)")
    info = train_step.cache_info()
    print(f"compile cache: {info}")

    os.makedirs(args.out, exist_ok=True)
    curve = os.path.join(args.out, "loss_curve.png")
    print(f"loss curve: {curve}" if plot_losses(losses, curve) else "loss curve: skipped (matplotlib not installed)")
    weights = os.path.join(args.out, WEIGHTS_FILE)
    how = save_weights(model, weights, {"optimizer": optimizer.state_dict(), "test_accuracy": test_accuracy})
    print(f"weights: {weights} ({how})")

    assert test_accuracy >= 0.95, f"test accuracy {test_accuracy:.1%} below 95%"
    # One graph per step: the schedule's changing learning rate must not recompile.
    assert info.misses <= 2, f"the training step compiled {info.misses} times"


if __name__ == "__main__":
    main()
