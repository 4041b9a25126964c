"""Grad modes: no_grad, enable_grad, set_grad_enabled (context managers and decorators) and
inference_mode."""

import threading

import numpy as np
import pytest

import tracegrad as tg

INFERENCE_SAVE_MESSAGE = "Inference tensors cannot be saved for backward"


def _records(fn=lambda: None):
    x = tg.ones(2, requires_grad=True)
    return (x * 2).requires_grad


def test_grad_is_enabled_by_default():
    assert tg.is_grad_enabled()
    assert _records()


def test_no_grad_context_stops_recording():
    x = tg.ones(2, requires_grad=True)
    with tg.no_grad():
        y = x * 2
    assert not y.requires_grad and y.grad_fn is None


def test_no_grad_context_restores_grad_mode():
    with tg.no_grad():
        assert not tg.is_grad_enabled()
    assert tg.is_grad_enabled()


def test_no_grad_restores_grad_mode_after_exception():
    with pytest.raises(ValueError):
        with tg.no_grad():
            raise ValueError("boom")
    assert tg.is_grad_enabled()


def test_no_grad_decorator_with_parentheses():
    @tg.no_grad()
    def double(t):
        return t * 2
    assert not double(tg.ones(2, requires_grad=True)).requires_grad


def test_no_grad_decorator_without_parentheses():
    @tg.no_grad
    def double(t):
        return t * 2
    assert not double(tg.ones(2, requires_grad=True)).requires_grad


def test_decorating_does_not_change_the_current_mode():
    @tg.no_grad()
    def noop():
        return None
    assert tg.is_grad_enabled()


def test_decorator_keeps_function_name_and_restores_mode():
    @tg.no_grad()
    def my_function():
        return tg.is_grad_enabled()
    assert my_function.__name__ == "my_function"
    assert my_function() is False
    assert tg.is_grad_enabled()


def test_decorated_function_can_be_called_repeatedly_and_nested():
    @tg.no_grad()
    def inner():
        return tg.is_grad_enabled()

    @tg.enable_grad()
    def outer():
        return inner(), tg.is_grad_enabled()

    with tg.no_grad():
        assert outer() == (False, True)
        assert outer() == (False, True)
        assert not tg.is_grad_enabled()


def test_enable_grad_inside_no_grad_records():
    x = tg.ones(2, requires_grad=True)
    with tg.no_grad():
        with tg.enable_grad():
            y = x * 2
        z = x * 2
    assert y.requires_grad and not z.requires_grad


def test_enable_grad_decorator_records_inside_no_grad():
    @tg.enable_grad()
    def double(t):
        return t * 2
    with tg.no_grad():
        assert double(tg.ones(2, requires_grad=True)).requires_grad


def test_enable_grad_decorator_without_parentheses():
    @tg.enable_grad
    def double(t):
        return t * 2
    with tg.no_grad():
        assert double(tg.ones(2, requires_grad=True)).requires_grad


def test_set_grad_enabled_false_as_context_manager():
    x = tg.ones(2, requires_grad=True)
    with tg.set_grad_enabled(False):
        y = x * 2
    assert not y.requires_grad
    assert tg.is_grad_enabled()


def test_set_grad_enabled_true_as_context_manager_inside_no_grad():
    x = tg.ones(2, requires_grad=True)
    with tg.no_grad():
        with tg.set_grad_enabled(True):
            y = x * 2
        assert not tg.is_grad_enabled()
    assert y.requires_grad


def test_set_grad_enabled_as_a_function_sets_the_mode():
    try:
        tg.set_grad_enabled(False)
        assert not tg.is_grad_enabled()
        assert not _records()
    finally:
        tg.set_grad_enabled(True)
    assert tg.is_grad_enabled()


def test_set_grad_enabled_decorator():
    @tg.set_grad_enabled(False)
    def double(t):
        return t * 2
    assert tg.is_grad_enabled()
    assert not double(tg.ones(2, requires_grad=True)).requires_grad
    assert tg.is_grad_enabled()


def test_set_grad_enabled_follows_a_flag():
    x = tg.ones(2, requires_grad=True)
    for training in (True, False):
        with tg.set_grad_enabled(training):
            assert (x * 2).requires_grad == training


def test_no_grad_update_of_a_leaf_is_allowed():
    w = tg.tensor([1.0, 2.0], requires_grad=True)
    (w * w).sum().backward()
    with tg.no_grad():
        w -= 0.5 * w.grad
    np.testing.assert_allclose(w.detach().numpy(), [0.0, 0.0])
    assert w.is_leaf and w.requires_grad


def test_grad_mode_is_per_thread():
    seen = []
    with tg.no_grad():
        thread = threading.Thread(target=lambda: seen.append(tg.is_grad_enabled()))
        thread.start()
        thread.join()
    assert seen == [True]


def test_inference_mode_stops_recording():
    x = tg.ones(2, requires_grad=True)
    with tg.inference_mode():
        y = x * 2
    assert not y.requires_grad and y.grad_fn is None


def test_inference_mode_is_reported_only_inside():
    assert not tg.is_inference_mode_enabled()
    with tg.inference_mode():
        assert tg.is_inference_mode_enabled()
        assert not tg.is_grad_enabled()
    assert not tg.is_inference_mode_enabled()
    assert tg.is_grad_enabled()


def test_tensors_made_in_inference_mode_are_inference_tensors():
    with tg.inference_mode():
        made = tg.ones(2)
        computed = tg.ones(2) * 2
    assert made.is_inference() and computed.is_inference()


def test_tensors_made_outside_inference_mode_are_not_inference_tensors():
    assert not tg.ones(2).is_inference()
    with tg.no_grad():
        assert not (tg.ones(2) * 2).is_inference()


def test_inference_mode_false_behaves_like_normal_mode():
    x = tg.ones(2, requires_grad=True)
    with tg.inference_mode(False):
        y = x * 2
    assert y.requires_grad and not y.is_inference()


def test_inference_mode_decorator():
    @tg.inference_mode()
    def double(t):
        return t * 2
    out = double(tg.ones(2, requires_grad=True))
    assert out.is_inference() and not out.requires_grad
    assert not tg.is_inference_mode_enabled()


def test_inference_mode_decorator_without_parentheses():
    @tg.inference_mode
    def double(t):
        return t * 2
    assert double(tg.ones(2)).is_inference()


def test_inference_tensor_cannot_be_saved_for_backward():
    with tg.inference_mode():
        frozen = tg.ones(2)
    w = tg.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=INFERENCE_SAVE_MESSAGE):
        w * frozen


def test_inference_tensor_save_message_matches_torch():
    torch = pytest.importorskip("torch")
    with torch.inference_mode():
        frozen = torch.ones(2)
    with pytest.raises(RuntimeError) as theirs:
        torch.ones(2, requires_grad=True) * frozen
    with tg.inference_mode():
        ours_frozen = tg.ones(2)
    with pytest.raises(RuntimeError) as ours:
        tg.ones(2, requires_grad=True) * ours_frozen
    assert str(ours.value) == str(theirs.value)


def test_inference_tensor_can_be_used_in_ops_that_save_nothing():
    with tg.inference_mode():
        frozen = tg.ones(2)
    w = tg.ones(2, requires_grad=True)
    (w + frozen).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [1.0, 1.0])


def test_clone_of_inference_tensor_outside_inference_mode_is_normal():
    with tg.inference_mode():
        frozen = tg.ones(2)
    usable = frozen.clone()
    w = tg.ones(2, requires_grad=True)
    (w * usable).sum().backward()
    assert not usable.is_inference()


def test_inplace_on_inference_tensor_outside_inference_mode_raises():
    with tg.inference_mode():
        frozen = tg.ones(2)
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        frozen.add_(1)


def test_requires_grad_on_inference_tensor_outside_inference_mode_raises():
    with tg.inference_mode():
        frozen = tg.ones(2)
    with pytest.raises(RuntimeError, match="Setting requires_grad=True on inference tensor outside "
                                           "InferenceMode is not allowed."):
        frozen.requires_grad_()
