"""Fine-tune only a new head on a frozen base ("Autograd mechanics": excluding subgraphs).

Run: python examples/finetune_frozen.py [--quick] [--out DIR]

Loads the MLP that train_digits.py saved (trains one first when the file is missing),
freezes its hidden layers with `requires_grad_(False)`, replaces the 10-class head with a
new 2-class head (is the digit odd?), and trains the head alone with a compiled step.
Shows that frozen parameters get no `.grad` and stay unchanged, and that the compiled
graph has no backward for the frozen part: it holds one matmul per layer for the forward
and a single one for the head's weight gradient (training everything needs five).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import tracegrad as tg
from digits_data import DEFAULT_OUT, WEIGHTS_FILE, accuracy, load_digits_split, make_mlp, load_weights
from train_digits import make_train_step, train


def pretrained_base(path: str, x_train: np.ndarray, y_train: np.ndarray, quick: bool) -> tg.nn.Sequential:
    model = make_mlp()
    if os.path.exists(path):
        load_weights(model, path)
        print(f"loaded {path}")
    else:
        print(f"{path} not found: training the base first")
        train(model, x_train, y_train, epochs=5 if quick else 20)
    model.zero_grad()  # the base's own training left gradients behind
    return model


def matmul_count(compiled_step, x: tg.Tensor, y: tg.Tensor) -> int:
    """Matmuls in the graph one call of `compiled_step` runs (forward and backward)."""
    report = compiled_step.explain(x, y)
    return sum(node.op.name == "matmul" for graph in report.graphs for node in graph.graph.nodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps (for CI)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="where train_digits.py wrote its weights")
    args = parser.parse_args()
    x_train, y_train, x_test, y_test = load_digits_split()
    odd_train, odd_test = y_train % 2, y_test % 2  # the new task: two classes

    tg.manual_seed(0)
    base = pretrained_base(os.path.join(args.out, WEIGHTS_FILE), x_train, y_train, args.quick)
    print(f"pretrained model, digit accuracy on the test set: {accuracy(base, x_test, y_test):.1%}")
    base.requires_grad_(False)  # freeze everything that exists now ...
    model = tg.nn.Sequential(base[0], base[1], base[2], base[3], tg.nn.Linear(128, 2))  # ... then a new head
    frozen = [p for layer in (base[0], base[2]) for p in layer.parameters()]
    frozen_before = [p.detach().numpy().copy() for p in frozen]
    trainable = [p for p in model.parameters() if p.requires_grad]
    print(f"frozen parameters: {sum(p.numel() for p in frozen)}, trainable: {sum(p.numel() for p in trainable)}")

    optimizer = tg.optim.Adam(trainable, lr=0.05)  # only the head is optimized
    step = tg.compile(make_train_step(model, optimizer))
    x_all, odd_all = tg.tensor(x_train), tg.tensor(odd_train)
    for i in range(1, (100 if args.quick else 300) + 1):  # full batch: the head is small
        loss = step(x_all, odd_all)
        if i % 25 == 0:
            print(f"step {i:4d}  loss {loss.item():.4f}")

    no_grads = all(p.grad is None for p in frozen)
    unchanged = all(np.array_equal(p.detach().numpy(), before) for p, before in zip(frozen, frozen_before))
    odd_accuracy = accuracy(model, x_test, odd_test)
    print(f"frozen parameters have no .grad: {no_grads}; unchanged by training: {unchanged}")
    print(f"odd/even test accuracy with the new head: {odd_accuracy:.1%}")

    x, y = tg.tensor(x_train[:64]), tg.tensor(odd_train[:64])
    frozen_matmuls = matmul_count(step, x, y)
    model.requires_grad_(True)  # for comparison: the same step training everything (lr 0)
    full_matmuls = matmul_count(tg.compile(make_train_step(model, tg.optim.SGD(model.parameters(), lr=0.0))), x, y)
    print(f"matmuls in the compiled step: {frozen_matmuls} with the base frozen, {full_matmuls} training everything")
    assert no_grads and unchanged
    assert frozen_matmuls == 4 and full_matmuls == 8, (frozen_matmuls, full_matmuls)
    assert odd_accuracy >= 0.9, f"accuracy {odd_accuracy:.1%} below 90%"


if __name__ == "__main__":
    main()
