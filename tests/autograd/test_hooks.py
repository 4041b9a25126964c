"""Tensor hooks (`register_hook`), `retain_grad` and the non-leaf `.grad` warning."""

import warnings

import numpy as np
import pytest

import tracegrad as tg


def test_leaf_hook_receives_the_gradient():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    seen = []
    x.register_hook(lambda grad: seen.append(grad.numpy().copy()))
    (x * x).sum().backward()
    np.testing.assert_allclose(seen[0], [2.0, 4.0])


def test_leaf_hook_return_value_replaces_the_gradient():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    x.register_hook(lambda grad: grad * 10)
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [20.0, 40.0])


def test_hook_returning_none_keeps_the_gradient():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    x.register_hook(lambda grad: None)
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])


def test_non_leaf_hook_receives_the_gradient():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    seen = []
    y.register_hook(lambda grad: seen.append(grad.numpy().copy()))
    (y * y).sum().backward()
    np.testing.assert_allclose(seen[0], [4.0, 8.0])


def test_non_leaf_hook_return_value_changes_the_upstream_gradient():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.register_hook(lambda grad: grad * 10)
    (y * y).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [80.0, 160.0])


def test_hooks_run_in_registration_order_and_chain():
    x = tg.tensor([1.0], requires_grad=True)
    y = x * 1
    y.register_hook(lambda grad: grad + 1)
    y.register_hook(lambda grad: grad * 3)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6.0])


def test_removed_leaf_hook_no_longer_runs():
    x = tg.tensor([1.0], requires_grad=True)
    handle = x.register_hook(lambda grad: grad * 100)
    handle.remove()
    (x * 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0])


def test_removed_non_leaf_hook_no_longer_runs():
    x = tg.tensor([1.0], requires_grad=True)
    y = x * 2
    handle = y.register_hook(lambda grad: grad * 100)
    handle.remove()
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0])


def test_removing_a_hook_twice_is_harmless():
    x = tg.tensor([1.0], requires_grad=True)
    handle = x.register_hook(lambda grad: grad)
    handle.remove()
    handle.remove()


def test_hook_on_tensor_not_requiring_grad_raises():
    with pytest.raises(RuntimeError, match="cannot register a hook on a tensor that doesn't require gradient"):
        tg.ones(2).register_hook(lambda grad: grad)


def test_leaf_hook_runs_for_autograd_grad():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    x.register_hook(lambda grad: grad * 3)
    (g,) = tg.autograd.grad((x * 2).sum(), x)
    np.testing.assert_allclose(g.numpy(), [6.0, 6.0])


def test_non_leaf_hook_runs_for_autograd_grad_with_respect_to_it():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.register_hook(lambda grad: grad * 3)
    (g,) = tg.autograd.grad((y * 2).sum(), y)
    np.testing.assert_allclose(g.numpy(), [6.0, 6.0])


def test_hook_of_node_outside_the_backward_pass_does_not_run():
    x = tg.tensor([1.0], requires_grad=True)
    unrelated = x * 5
    calls = []
    unrelated.register_hook(lambda grad: calls.append(grad))
    (x * 2).sum().backward()
    assert calls == []


def test_retain_grad_populates_non_leaf_grad():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.retain_grad()
    (y * y).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), [4.0, 8.0])


def test_retain_grad_sets_retains_grad():
    x = tg.tensor([1.0], requires_grad=True)
    y = x * 2
    assert not y.retains_grad
    y.retain_grad()
    assert y.retains_grad


def test_retained_grad_accumulates_across_backward_calls():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.retain_grad()
    z = (y * 3).sum()
    z.backward(retain_graph=True)
    z.backward()
    np.testing.assert_allclose(y.grad.numpy(), [6.0, 6.0])


def test_retained_grad_sees_the_hook_modified_gradient():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.retain_grad()
    y.register_hook(lambda grad: grad * 10)  # registered later, still runs before retain_grad
    y.sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), [10.0, 10.0])
    np.testing.assert_allclose(x.grad.numpy(), [20.0, 20.0])


def test_retain_grad_works_with_autograd_grad():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.retain_grad()
    tg.autograd.grad((y * y).sum(), x)
    np.testing.assert_allclose(y.grad.numpy(), [4.0, 8.0])


def test_retain_grad_called_twice_does_not_double_the_gradient():
    x = tg.tensor([1.0], requires_grad=True)
    y = x * 2
    y.retain_grad()
    y.retain_grad()
    y.sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), [1.0])


def test_retained_grad_does_not_alias_the_leaf_gradient():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x + 0
    y.retain_grad()
    y.sum().backward()
    x.grad.add_(5)
    np.testing.assert_allclose(y.grad.numpy(), [1.0, 1.0])


def test_retain_grad_on_leaf_is_a_no_op():
    x = tg.tensor([1.0], requires_grad=True)
    x.retain_grad()
    (x * 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0])


def test_retain_grad_on_tensor_not_requiring_grad_raises():
    with pytest.raises(RuntimeError, match="can't retain_grad on Tensor that has requires_grad=False"):
        tg.ones(2).retain_grad()


def test_retained_tensor_does_not_keep_itself_alive():
    import gc
    import weakref
    x = tg.tensor([1.0], requires_grad=True)
    y = x * 2
    y.retain_grad()
    z = y * 3
    ref = weakref.ref(y)
    del y
    gc.collect()
    assert ref() is None
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6.0])


def test_reading_grad_of_non_leaf_warns():
    y = tg.ones(2, requires_grad=True) * 2
    with pytest.warns(UserWarning, match="The .grad attribute of a Tensor that is not a leaf Tensor "
                                         "is being accessed"):
        _ = y.grad


def test_reading_grad_of_retained_non_leaf_does_not_warn():
    y = tg.ones(2, requires_grad=True) * 2
    y.retain_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _ = y.grad


def test_reading_grad_of_leaf_does_not_warn():
    x = tg.ones(2, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _ = x.grad


def test_non_leaf_grad_warning_matches_torch():
    torch = pytest.importorskip("torch")
    with pytest.warns(UserWarning) as theirs:
        _ = (torch.ones(2, requires_grad=True) * 2).grad
    with pytest.warns(UserWarning) as ours:
        _ = (tg.ones(2, requires_grad=True) * 2).grad
    assert str(theirs[0].message).startswith(str(ours[0].message))


def test_hooks_match_torch():
    torch = pytest.importorskip("torch")

    def run(lib):
        x = lib.tensor([1.0, -2.0, 3.0], requires_grad=True)
        x.register_hook(lambda grad: grad + 1)
        y = x * x
        y.retain_grad()
        y.register_hook(lambda grad: grad * 2)
        (y.exp() * 0.1).sum().backward()
        return x.grad.detach().numpy(), y.grad.detach().numpy()

    for ours, theirs in zip(run(tg), run(torch)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_retain_grad_follows_the_tensor_through_an_inplace_op():
    x = tg.ones(2, requires_grad=True)
    y = x * 2
    y.retain_grad()
    y.mul_(3)
    y.sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), [1.0, 1.0])
    np.testing.assert_allclose(x.grad.numpy(), [6.0, 6.0])


def test_hook_registered_before_an_inplace_op_sees_the_old_value_gradient():
    x = tg.ones(2, requires_grad=True)
    y = x * 2
    seen = []
    y.register_hook(lambda grad: seen.append(grad.numpy().copy()) or grad * 10)
    y.mul_(3)
    y.sum().backward()
    np.testing.assert_allclose(seen[0], [3.0, 3.0])
    np.testing.assert_allclose(x.grad.numpy(), [60.0, 60.0])


def _branch_not_asked_for(hooked):
    """A loss of `t * x` with t = w * 2 hooked (retain_grad or a hook): the gradient asked
    for is x's only, so t's node (leading to w) is not needed."""
    w = tg.tensor([1.0, 2.0], requires_grad=True)
    x = tg.tensor([3.0, 4.0], requires_grad=True)
    t = w * 2
    seen = []
    if hooked == "retain_grad":
        t.retain_grad()
    else:
        t.register_hook(lambda g: seen.append(g.tolist()))
    (gx,) = tg.autograd.grad((t * x).sum(), [x])
    return gx.tolist(), t.grad, seen


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("hooked", ["retain_grad", "hook"])
def test_a_node_no_asked_for_gradient_needs_runs_no_hook(hooked, compiled):
    # As PyTorch: autograd.grad (or backward(inputs=...)) runs only the nodes on a path to
    # what was asked for; a tensor off that path gets no retained .grad and its hooks do
    # not run (fuzz seed 84810532 with the PyTorch oracle: t.grad was set).
    fn = tg.compile(_branch_not_asked_for) if compiled else _branch_not_asked_for
    for _ in range(2 if compiled else 1):
        gx, retained, seen = fn(hooked)
        assert gx == [2.0, 4.0] and retained is None and seen == []


def test_a_hook_on_the_asked_for_tensor_or_on_the_way_to_it_still_runs():
    w = tg.tensor([1.0, 2.0], requires_grad=True)
    t = w * 2
    t.retain_grad()
    (gw,) = tg.autograd.grad((t * t).sum(), [w])  # t lies between the loss and w
    assert gw.tolist() == [8.0, 16.0] and t.grad.tolist() == [4.0, 8.0]
    u = w * 2
    u.register_hook(lambda g: g * 10)
    (gu,) = tg.autograd.grad((u * u).sum(), [u])  # the asked-for tensor's own hook
    assert gu.tolist() == [40.0, 80.0]
    v = w * 2
    v.retain_grad()
    x = tg.tensor([3.0, 4.0], requires_grad=True)
    (v * x).sum().backward(inputs=[x])
    assert v.grad is None and x.grad.tolist() == [2.0, 4.0] and w.grad is None
