"""Devices, as PyTorch programs name them: tracegrad computes on the CPU only.

`device("cpu")` is the one device tensors live on (`Tensor.device`). A program may still
name another (`device("cuda" if cuda.is_available() else "cpu")` is how most start), and
constructing one is allowed as in PyTorch; putting a tensor or a module there raises
`check_device`'s error, before anything is made or changed.
"""

from __future__ import annotations

_KNOWN = ("cpu", "cuda", "mps", "xpu", "meta", "xla", "hip", "privateuseone")


class device:  # noqa: N801 - PyTorch's name
    """A device: a type and an optional index (`device("cuda:1")`, `device("cuda", 1)`)."""

    __slots__ = ("type", "index")

    def __init__(self, type, index: int | None = None):  # noqa: A002 - PyTorch's parameter name
        if isinstance(type, device):
            type, index = type.type, type.index if index is None else index
        elif isinstance(type, int):  # device(0): the first accelerator
            type, index = "cuda", type
        elif not isinstance(type, str):
            raise TypeError(f"device() received an invalid combination of arguments: got {type!r}")
        else:
            name, _, number = type.partition(":")
            if number:
                if index is not None or not number.isdigit():
                    raise RuntimeError(f"Invalid device string: '{type}'")
                index = int(number)
            type = name
        if type not in _KNOWN:
            raise RuntimeError(f"Expected one of {', '.join(_KNOWN)} device type at start of device "
                               f"string: {type}")
        if index is not None and (not isinstance(index, int) or index < 0):
            raise RuntimeError(f"Device index must not be negative (got {index!r})")
        self.type, self.index = type, index

    def __repr__(self) -> str:
        return f"device(type='{self.type}')" if self.index is None else \
            f"device(type='{self.type}', index={self.index})"

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            try:
                other = device(other)
            except RuntimeError:
                return False
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __reduce__(self):
        return (device, (self.type, self.index))


CPU = device("cpu")


def check_device(where: str, target) -> None:
    """Raise the error for a device tracegrad cannot put tensors on (`target`: None, a string,
    a `device` or an index). `where` names the call, as in "tensor" or "Tensor.to"."""
    if target is None:
        return
    if isinstance(target, str) and target == "cpu":  # (the usual case, without parsing)
        return
    named = target if isinstance(target, device) else device(target)
    if named.type != "cpu":
        raise RuntimeError(f"{where}: tracegrad runs on the CPU only, so it cannot use device "
                           f"'{named}' (tracegrad.cuda.is_available() is False); use 'cpu'")


def is_device(value) -> bool:
    """Whether `value` names a device (a `device`, or a string such as "cpu" or "cuda:0")."""
    if isinstance(value, device):
        return True
    if isinstance(value, str):
        try:
            device(value)
        except RuntimeError:
            return False
        return True
    return False
