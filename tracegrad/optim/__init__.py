"""`tg.optim`: optimizers (SGD, Adam, AdamW) and `tg.optim.lr_scheduler`."""

from tracegrad.optim import lr_scheduler  # noqa: F401
from tracegrad.optim.adam import Adam, AdamW  # noqa: F401
from tracegrad.optim.optimizer import Optimizer  # noqa: F401
from tracegrad.optim.sgd import SGD  # noqa: F401
