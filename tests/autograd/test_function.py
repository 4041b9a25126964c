"""Custom differentiable functions: `tg.autograd.Function` with forward/backward/apply."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd import Function

MODIFIED_MESSAGE = "one of the variables needed for gradient computation has been modified by an inplace operation"


class Square(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class Exp(Function):
    """Saves its output."""

    @staticmethod
    def forward(ctx, x):
        result = x.exp()
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad):
        (result,) = ctx.saved_tensors
        return grad * result


class ScaleBy(Function):
    """Mixes tensor and non-tensor arguments."""

    @staticmethod
    def forward(ctx, x, factor, y):
        ctx.factor = factor
        return x * factor + y

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None, grad


class WrongSquare(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 3 * x * grad


def test_apply_runs_forward():
    out = Square.apply(tg.tensor([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(out.numpy(), [1.0, 4.0, 9.0])


def test_apply_records_a_node_named_after_the_function():
    out = Square.apply(tg.tensor([1.0, 2.0], requires_grad=True))
    assert out.requires_grad
    assert out.grad_fn.name() == "SquareBackward"


def test_backward_runs_the_custom_backward():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    Square.apply(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0, 6.0])


def test_custom_function_composes_with_builtin_ops():
    x = tg.tensor([0.5, 1.0], requires_grad=True)
    (Square.apply(x.sin()) * 3).sum().backward()
    expected = 3 * 2 * np.sin([0.5, 1.0]) * np.cos([0.5, 1.0])
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-6)


def test_forward_runs_without_recording():
    seen = []

    class Probe(Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(tg.is_grad_enabled())
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    Probe.apply(tg.ones(2, requires_grad=True))
    assert seen == [False]


def test_apply_without_inputs_requiring_grad_records_nothing():
    out = Square.apply(tg.tensor([1.0, 2.0]))
    assert not out.requires_grad and out.grad_fn is None


def test_apply_under_no_grad_records_nothing():
    with tg.no_grad():
        out = Square.apply(tg.tensor([1.0, 2.0], requires_grad=True))
    assert not out.requires_grad and out.grad_fn is None


def test_saved_output_is_returned_by_saved_tensors():
    x = tg.tensor([0.0, 1.0], requires_grad=True)
    Exp.apply(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp([0.0, 1.0]), rtol=1e-6)


def test_saved_input_modified_in_place_raises():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1
    out = Square.apply(y)
    y.add_(1)
    with pytest.raises(RuntimeError, match=MODIFIED_MESSAGE):
        out.sum().backward()


def test_saved_output_modified_in_place_raises():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    out = Exp.apply(x)
    out.mul_(2)
    with pytest.raises(RuntimeError, match=MODIFIED_MESSAGE):
        out.sum().backward()


def test_saved_tensors_after_backward_raise():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    out = Square.apply(x)
    out.sum().backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        out.sum().backward()


class NeedsProbe(Function):
    """Records ctx.needs_input_grad as seen by forward and by backward."""

    seen: list = []

    @staticmethod
    def forward(ctx, x, factor, y):
        NeedsProbe.seen.append(("forward", ctx.needs_input_grad))
        return x * factor + y

    @staticmethod
    def backward(ctx, grad):
        NeedsProbe.seen.append(("backward", ctx.needs_input_grad))
        return grad, None, grad


def test_needs_input_grad_reports_each_argument_in_forward_and_backward():
    NeedsProbe.seen = []
    NeedsProbe.apply(tg.ones(2), 2.0, tg.ones(2, requires_grad=True)).sum().backward()
    assert NeedsProbe.seen == [("forward", (False, False, True)), ("backward", (False, False, True))]


def test_non_tensor_argument_gets_none_gradient_and_tensors_get_theirs():
    x = tg.ones(2, requires_grad=True)
    y = tg.ones(2, requires_grad=True)
    ScaleBy.apply(x, 4.0, y).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 4.0])
    np.testing.assert_allclose(y.grad.numpy(), [1.0, 1.0])


def test_ctx_attributes_reach_backward():
    x = tg.ones(2, requires_grad=True)
    ScaleBy.apply(x, 5.0, tg.zeros(2)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 5.0])


def test_backward_returning_wrong_number_of_gradients_raises():
    class TooFew(Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * y

        @staticmethod
        def backward(ctx, grad):
            return grad

    x = tg.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"function TooFewBackward returned an incorrect number of "
                                           r"gradients \(expected 2, got 1\)"):
        TooFew.apply(x, tg.ones(2)).sum().backward()


def test_custom_function_with_two_outputs():
    class SplitScale(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2, x * 3

        @staticmethod
        def backward(ctx, grad_a, grad_b):
            return grad_a * 2 + grad_b * 3

    x = tg.ones(2, requires_grad=True)
    a, b = SplitScale.apply(x)
    (a.sum() + (b * 10).sum()).backward()
    np.testing.assert_allclose(x.grad.numpy(), [32.0, 32.0])


def test_unused_output_gets_a_zero_gradient():
    class Pair(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2, x * 3

        @staticmethod
        def backward(ctx, grad_a, grad_b):
            return grad_a * 2 + grad_b * 3

    x = tg.ones(2, requires_grad=True)
    a, _ = Pair.apply(x)
    a.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])


def test_mark_non_differentiable_output_does_not_require_grad():
    class WithIndex(Function):
        @staticmethod
        def forward(ctx, x):
            doubled = x * 2
            flags = x > 0
            positive = x * 1
            ctx.mark_non_differentiable(positive)
            return doubled, flags, positive

        @staticmethod
        def backward(ctx, grad, _flags, _positive):
            return grad * 2

    x = tg.tensor([1.0, -1.0], requires_grad=True)
    doubled, flags, positive = WithIndex.apply(x)
    assert doubled.requires_grad
    assert not flags.requires_grad
    assert not positive.requires_grad


def test_custom_backward_made_of_differentiable_ops_supports_double_backward():
    x = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
    (g,) = tg.autograd.grad(Square.apply(x).sum(), x, create_graph=True)
    (g2,) = tg.autograd.grad(g.sum(), x)
    np.testing.assert_allclose(g2.numpy(), [2.0, 2.0])


def test_gradcheck_passes_for_a_correct_custom_function():
    x = tg.tensor(np.random.default_rng(0).standard_normal(4), requires_grad=True)
    assert tg.autograd.gradcheck(Square.apply, (x,))


def test_gradcheck_catches_a_wrong_custom_backward():
    x = tg.tensor(np.random.default_rng(0).standard_normal(4), requires_grad=True)
    with pytest.raises(tg.autograd.GradcheckError):
        tg.autograd.gradcheck(WrongSquare.apply, (x,))


def test_gradcheck_of_custom_function_with_non_tensor_argument():
    x = tg.tensor(np.random.default_rng(1).standard_normal(3), requires_grad=True)
    y = tg.tensor(np.random.default_rng(2).standard_normal(3), requires_grad=True)
    assert tg.autograd.gradcheck(lambda a, b: ScaleBy.apply(a, 1.5, b), (x, y))


def test_custom_function_matches_torch():
    torch = pytest.importorskip("torch")

    class TorchSquare(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 2 * x * grad

    data = np.array([0.5, -1.0, 2.0])
    theirs = torch.tensor(data, requires_grad=True)
    (TorchSquare.apply(theirs.sin()) * theirs).sum().backward()
    ours = tg.tensor(data, requires_grad=True)
    (Square.apply(ours.sin()) * ours).sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-12)


def test_custom_function_graph_is_freed_without_the_garbage_collector():
    import gc
    import weakref

    class Double(tg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    gc.disable()
    try:
        y = Double.apply(tg.ones(3, requires_grad=True))
        node = weakref.ref(y.grad_fn)
        del y
        assert node() is None
    finally:
        gc.enable()
