"""The data addresses a step hands compiled code (`runtime/buffers.py`)."""

import numpy as np

from tracegrad.runtime import buffers


def test_a_kernel_reads_the_data_address_of_every_kind_of_array():
    base = np.arange(24.0).reshape(4, 6)
    arrays = [np.empty(5, np.float32), np.array(1.5), np.array(True), np.zeros(0),
              base[1:], base[:, 2:].copy(), np.broadcast_to(np.arange(3.0), (2, 3)),
              np.frombuffer(bytes(16), dtype=np.int64)]  # read-only, not owning its data
    for array in arrays:
        assert buffers.data_address(array) == array.ctypes.data
