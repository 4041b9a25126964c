"""`legacy.py`: the typed tensor classes construct tensors and check dtypes with isinstance,
`Size` is a tuple with numel, `as_tensor` shares memory where it can, and the thread and
determinism settings are recorded."""

import numpy as np
import pytest

import tracegrad as tg


def test_typed_tensor_classes_build_and_check_by_dtype():
    assert tg.LongTensor([1, 2]).dtype == tg.int64 and tg.FloatTensor([1, 2]).dtype == tg.float32
    assert tg.FloatTensor(2, 3).shape == (2, 3) and tg.ByteTensor(np.array([1, 2])).dtype == tg.uint8
    assert tg.DoubleTensor(tg.ones(2)).dtype == tg.float64
    assert isinstance(tg.tensor([1]), tg.LongTensor) and not isinstance(tg.tensor([1.0]), tg.LongTensor)
    assert isinstance(tg.ones(2, dtype=tg.bool), tg.BoolTensor)
    with pytest.raises(RuntimeError, match="CPU only"):
        tg.FloatTensor([1.0], device="cuda")


def test_size_is_a_tuple_of_ints():
    size = tg.Size([2, 3])
    assert size == (2, 3) and size.numel() == 6 and isinstance(size, tuple)
    assert tg.zeros(size).shape == (2, 3) and tg.FloatTensor(size).shape == (2, 3)
    with pytest.raises(TypeError, match="takes an iterable of 'int'"):
        tg.Size([2.5])


def test_as_tensor_shares_memory_with_an_array_and_returns_a_tensor_itself():
    array = np.zeros(3, dtype=np.float32)
    t = tg.as_tensor(array)
    array[0] = 5.0
    assert t[0].item() == 5.0
    x = tg.ones(2)
    assert tg.as_tensor(x) is x and tg.as_tensor(x, dtype=tg.float64).dtype == tg.float64
    assert tg.as_tensor([1, 2]).dtype == tg.int64


def test_thread_and_determinism_settings_are_recorded():
    before = tg.get_num_threads()
    tg.set_num_threads(1)
    assert tg.get_num_threads() == 1
    tg.set_num_threads(before)
    with pytest.raises(RuntimeError, match="must be positive"):
        tg.set_num_threads(0)
    tg.use_deterministic_algorithms(True)
    assert tg.are_deterministic_algorithms_enabled()
    tg.use_deterministic_algorithms(False)


def test_matches_pytorch():
    torch = pytest.importorskip("torch")
    assert tg.LongTensor([[1, 2]]).tolist() == torch.LongTensor([[1, 2]]).tolist()
    assert tuple(tg.Size([4, 5])) == tuple(torch.Size([4, 5])) and tg.Size([4, 5]).numel() == 20
