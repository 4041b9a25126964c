"""`tg.nn.modules`: PyTorch's submodule paths name tg.nn's classes; `serialization.safe_globals`
accepts such allow-lists around `load`; `Module.share_memory` returns the module."""

import pytest

import tracegrad as tg


def test_submodule_paths_name_the_same_classes():
    assert tg.nn.modules.linear.Linear is tg.nn.Linear and tg.nn.modules.rnn.LSTM is tg.nn.LSTM
    assert tg.nn.modules.activation.MultiheadAttention is tg.nn.MultiheadAttention
    assert tg.nn.modules.sparse.Embedding is tg.nn.Embedding and tg.nn.modules.Module is tg.nn.Module
    assert issubclass(tg.nn.modules.linear.NonDynamicallyQuantizableLinear, tg.nn.Linear)


def test_every_listed_path_exists_in_pytorch_too():
    torch = pytest.importorskip("torch")
    from tracegrad.nn.modules import _LAYOUT
    for submodule, classes in _LAYOUT.items():
        for name in classes:
            assert hasattr(getattr(torch.nn.modules, submodule), name), f"torch.nn.modules.{submodule}.{name}"


def test_safe_globals_wraps_a_load(tmp_path):
    layer = tg.nn.Linear(2, 3)
    tg.save(layer.state_dict(), tmp_path / "w.pt")
    with tg.serialization.safe_globals([tg.nn.modules.linear.Linear]):
        state = tg.load(tmp_path / "w.pt", weights_only=True)
    assert state.keys() == layer.state_dict().keys()
    tg.serialization.add_safe_globals([tg.nn.Linear])
    assert tg.nn.Linear in tg.serialization.get_safe_globals()


def test_share_memory_returns_the_module():
    layer = tg.nn.Linear(2, 2)
    assert layer.share_memory() is layer
