"""Shared test settings: deterministic seeds."""

import numpy as np
import pytest

import tracegrad as tg


@pytest.fixture(autouse=True)
def _seed():
    tg.manual_seed(0)
    np.random.seed(0)
