"""`tg.optim`: optimizers."""

from tracegrad.optim.optimizer import Optimizer  # noqa: F401
from tracegrad.optim.sgd import SGD  # noqa: F401
