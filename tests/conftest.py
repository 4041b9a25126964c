"""Shared test settings: deterministic seeds, a private kernel cache; the `composite_jumps`
fixture."""

import atexit
import os
import shutil
import tempfile

import numpy as np
import pytest

# Every kernel's IR is built even when its description finds it in a cache, and a
# description that ever stands for two different IRs fails the run (runtime/kernel_key.py).
os.environ["TRACEGRAD_CHECK_KERNEL_KEYS"] = "1"
# What test modules write to the disk cache while they are imported (the host's description,
# runtime/host.py) goes to a private directory too (`_private_kernel_cache` sets the run's).
os.environ["TRACEGRAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="tracegrad-test-cache-")

import tracegrad as tg

atexit.register(shutil.rmtree, os.environ["TRACEGRAD_CACHE_DIR"], ignore_errors=True)


@pytest.fixture(autouse=True)
def _seed():
    tg.manual_seed(0)
    np.random.seed(0)


@pytest.fixture(autouse=True, scope="session")
def _private_kernel_cache(tmp_path_factory):
    """Compiled kernels go to a per-run directory, not the user's cache."""
    import os
    previous = os.environ.get("TRACEGRAD_CACHE_DIR")
    os.environ["TRACEGRAD_CACHE_DIR"] = str(tmp_path_factory.mktemp("kernel-cache"))
    yield
    if previous is None:
        os.environ.pop("TRACEGRAD_CACHE_DIR", None)
    else:
        os.environ["TRACEGRAD_CACHE_DIR"] = previous


class _PoisonedNumpy:
    """NumPy as `codegen/kernels.py` sees it, except that `empty` fills its buffers with
    0x7F bytes: a kernel result that nothing wrote then shows as garbage, not as whatever
    zeros a reused block happened to hold."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def empty(*args, **kwargs):
        buffer = np.empty(*args, **kwargs)
        buffer.reshape(-1).view(np.uint8).fill(0x7F)
        return buffer


@pytest.fixture
def poisoned_kernel_outputs(monkeypatch):
    """Kernel output buffers start as garbage (see `_PoisonedNumpy`)."""
    from tracegrad.codegen import kernels
    monkeypatch.setattr(kernels, "np", _PoisonedNumpy())


@pytest.fixture
def composite_jumps(monkeypatch):
    """The composite functions a followed compiled call took in one step
    (`tracegrad.jit.composite`), by name, in order."""
    from tracegrad.jit import composite as compile_composite

    taken = []
    take = compile_composite._take

    def spy(replay, tracer, record, tensors):
        taken.append(record.function.__name__)
        return take(replay, tracer, record, tensors)

    monkeypatch.setattr(compile_composite, "_take", spy)
    return taken
