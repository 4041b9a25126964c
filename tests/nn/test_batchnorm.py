"""BatchNorm1d/2d: normalization with batch statistics in training and running statistics
in eval; running statistics as buffers updated under no_grad with momentum (unbiased
variance), `num_batches_tracked`, the cumulative average of momentum=None, and the same
updates inside a compiled training step."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn


def _numpy(t):
    return t.detach().numpy()


def _batch(*shape):
    return tg.randn(*shape, dtype=tg.float64) * 3 + 1


def test_running_stats_are_buffers_in_the_state_dict_not_parameters():
    norm = nn.BatchNorm2d(3)
    assert [name for name, _ in norm.named_parameters()] == ["weight", "bias"]
    assert [name for name, _ in norm.named_buffers()] == ["running_mean", "running_var", "num_batches_tracked"]
    assert list(norm.state_dict())[2:] == ["running_mean", "running_var", "num_batches_tracked"]


def test_running_stats_start_at_zero_mean_unit_variance_and_zero_batches():
    norm = nn.BatchNorm1d(2)
    np.testing.assert_array_equal(_numpy(norm.running_mean), [0, 0])
    np.testing.assert_array_equal(_numpy(norm.running_var), [1, 1])
    assert norm.num_batches_tracked.dtype is tg.int64 and int(norm.num_batches_tracked) == 0


def test_training_normalizes_each_channel_with_the_batch_statistics():
    out = _numpy(nn.BatchNorm2d(3).double()(_batch(4, 3, 2, 2)))
    np.testing.assert_allclose(out.mean(axis=(0, 2, 3)), 0, atol=1e-12)
    np.testing.assert_allclose(out.var(axis=(0, 2, 3)), 1, atol=1e-4)


def test_training_moves_running_stats_by_momentum_with_the_unbiased_variance():
    norm = nn.BatchNorm2d(3, momentum=0.3).double()
    x = _batch(4, 3, 2, 2)
    norm(x)
    a = _numpy(x)
    np.testing.assert_allclose(_numpy(norm.running_mean), 0.3 * a.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(_numpy(norm.running_var), 0.7 + 0.3 * a.var(axis=(0, 2, 3), ddof=1),
                               rtol=1e-12)
    assert int(norm.num_batches_tracked) == 1


def test_momentum_none_keeps_the_cumulative_average_of_batch_means():
    norm = nn.BatchNorm1d(2, momentum=None).double()
    batches = [_batch(5, 2) for _ in range(3)]
    for x in batches:
        norm(x)
    expected = np.mean([_numpy(x).mean(0) for x in batches], axis=0)
    np.testing.assert_allclose(_numpy(norm.running_mean), expected, rtol=1e-12)


def test_eval_normalizes_with_the_running_stats_and_leaves_them_unchanged():
    norm = nn.BatchNorm1d(2).double()
    norm(_batch(6, 2))
    norm.eval()
    mean, var = _numpy(norm.running_mean).copy(), _numpy(norm.running_var).copy()
    x = _batch(3, 2)
    np.testing.assert_allclose(_numpy(norm(x)), (_numpy(x) - mean) / np.sqrt(var + 1e-5), rtol=1e-12)
    np.testing.assert_array_equal(_numpy(norm.running_mean), mean)
    assert int(norm.num_batches_tracked) == 1


def test_eval_output_differs_from_training_output():
    norm = nn.BatchNorm1d(2)
    x = _batch(6, 2).float()
    train_out = _numpy(norm(x))
    assert not np.allclose(_numpy(norm.eval()(x)), train_out)


def test_the_update_records_no_graph_and_the_buffers_never_require_grad():
    norm = nn.BatchNorm1d(2)
    out = norm(tg.randn(4, 2, requires_grad=True))
    out.sum().backward()
    assert not norm.running_mean.requires_grad and norm.running_mean.grad_fn is None


def test_without_tracked_stats_there_are_no_buffers_and_eval_uses_batch_stats():
    norm = nn.BatchNorm1d(2, track_running_stats=False).eval().double()
    assert list(norm.buffers()) == []
    out = _numpy(norm(_batch(6, 2)))
    np.testing.assert_allclose(out.mean(0), 0, atol=1e-12)


def test_affine_false_has_no_parameters():
    assert list(nn.BatchNorm2d(2, affine=False).parameters()) == []


def test_one_value_per_channel_in_training_raises():
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        nn.BatchNorm1d(3)(tg.randn(1, 3))


@pytest.mark.parametrize("layer, shape", [(nn.BatchNorm1d, (2, 3, 4, 4)), (nn.BatchNorm2d, (2, 3, 4))])
def test_input_of_the_wrong_rank_raises(layer, shape):
    with pytest.raises(ValueError, match="expected .* input \\(got"):
        layer(3)(tg.randn(*shape))


def test_compiled_training_steps_update_running_stats_as_eager_does():
    batches = [_batch(4, 2, 3, 3) for _ in range(3)]
    norms = [nn.BatchNorm2d(2).double() for _ in range(2)]

    def step(norm, x):
        return norm(x).sum()

    compiled = tg.compile(step)
    for x in batches:
        step(norms[0], x)
        compiled(norms[1], x)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        np.testing.assert_allclose(_numpy(getattr(norms[1], name)), _numpy(getattr(norms[0], name)),
                                   rtol=1e-12)
