"""Shared by train_digits.py and finetune_frozen.py: scikit-learn's bundled 8x8 digits
(no download), the MLP both examples use, and saving/loading its weights (with `tg.save`
when tracegrad has it, else `np.savez`). Not an example by itself."""

from __future__ import annotations

import os
import sys
import tempfile

import numpy as np

import tracegrad as tg

DEFAULT_OUT = os.path.join(tempfile.gettempdir(), "tracegrad-examples")
WEIGHTS_FILE = "digits_mlp.npz"


def load_digits_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): 1437 / 360 images of 64 pixels scaled to [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("this example needs scikit-learn: python -m pip install -e '.[examples]'")
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    split = int(0.8 * len(x))
    train, test = order[:split], order[split:]
    return x[train], y[train], x[test], y[test]


def make_mlp(hidden: int = 128) -> tg.nn.Sequential:
    """64 -> hidden -> hidden -> 10. Layers 0 and 2 are the base, layer 4 the head."""
    return tg.nn.Sequential(tg.nn.Linear(64, hidden), tg.nn.ReLU(), tg.nn.Linear(hidden, hidden), tg.nn.ReLU(),
                            tg.nn.Linear(hidden, 10))


def accuracy(model: tg.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with tg.no_grad():
        predicted = model(tg.tensor(x)).argmax(dim=1).numpy()
    return float((predicted == y).mean())


def save_weights(model: tg.nn.Module, path: str, extra: dict | None = None) -> str:
    """Write the parameters (and `extra`, e.g. the optimizer state) to `path`; say how."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if hasattr(tg, "save") and hasattr(model, "state_dict"):
        tg.save({"model": model.state_dict(), **(extra or {})}, path)
        return "tg.save"
    np.savez(path, **{name: p.detach().numpy() for name, p in model.named_parameters()})
    return "np.savez"


def load_weights(model: tg.nn.Module, path: str) -> None:
    """Load parameters written by `save_weights` into `model` (same architecture)."""
    if hasattr(tg, "load") and hasattr(model, "load_state_dict"):
        model.load_state_dict(tg.load(path)["model"])
        return
    arrays = np.load(path)
    with tg.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tg.tensor(arrays[name]))
