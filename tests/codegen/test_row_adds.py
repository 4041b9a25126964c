"""The generated loop adding rows at indices in order (`codegen/row_adds.py`)."""

import numpy as np
import pytest

from tracegrad.codegen import row_adds


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("count, rows, width", [(700, 1000, 200), (512, 65, 128), (5, 3, 1), (1, 1, 1), (0, 4, 3),
                                                (64, 7, 33)])
def test_add_rows_equals_numpys_add_at_to_the_bit(dtype, count, rows, width):
    # Terms of wildly different sizes: any other summation order changes the bits.
    rng = np.random.default_rng(count + width)
    index = np.minimum(rng.zipf(1.3, count) - 1, rows - 1)
    source = (rng.standard_normal((count, width)) * 10.0 ** rng.integers(-8, 8, (count, 1))).astype(dtype)
    source[::3] *= -0.0
    want = np.zeros((rows, width), dtype)
    np.add.at(want, index, source)
    table = np.zeros((rows, width), dtype)
    assert row_adds.add_rows(table, source, index)
    np.testing.assert_array_equal(table.view(np.uint8), want.view(np.uint8))


def test_add_rows_reads_a_strided_source_and_adds_into_what_the_table_holds():
    rng = np.random.default_rng(1)
    source = rng.standard_normal((6, 8))[:, ::2]
    index = np.array([2, 0, 2, 1, 2, 0], np.int32)
    table = rng.standard_normal((3, 4))
    want = table.copy()
    np.add.at(want, index, source)
    assert row_adds.add_rows(table, source, index)
    np.testing.assert_array_equal(table, want)


def test_add_rows_declines_dtypes_it_has_no_loop_for():
    table = np.zeros((2, 2), np.int64)
    assert not row_adds.add_rows(table, np.ones((3, 2), np.int64), np.array([0, 1, 1]))
    assert not row_adds.add_rows(np.zeros((2, 2), np.float32), np.ones((3, 2), np.float64), np.array([0, 1, 1]))
    assert not table.any()


def test_add_rows_rejects_a_source_that_does_not_fit_the_index():
    with pytest.raises(ValueError, match=r"add_rows: expected a source of shape \(3, 2\), got \(2, 2\)"):
        row_adds.add_rows(np.zeros((2, 2)), np.ones((2, 2)), np.array([0, 1, 1]))
