"""`tg.optim`: optimizers (SGD, Adam, AdamW, RMSprop, Adagrad, Adadelta, Adamax, NAdam, RAdam,
LBFGS) and `tg.optim.lr_scheduler`."""

from tracegrad.optim import lr_scheduler  # noqa: F401
from tracegrad.optim.adam import Adam, AdamW  # noqa: F401
from tracegrad.optim.adam_variants import Adamax, NAdam, RAdam  # noqa: F401
from tracegrad.optim.lbfgs import LBFGS  # noqa: F401
from tracegrad.optim.optimizer import Optimizer  # noqa: F401
from tracegrad.optim.rmsprop import Adadelta, Adagrad, RMSprop  # noqa: F401
from tracegrad.optim.sgd import SGD  # noqa: F401
