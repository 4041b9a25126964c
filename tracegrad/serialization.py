"""`tg.save(obj, f)` / `tg.load(f)`: state dicts (nested dicts, lists and tuples of tensors,
NumPy arrays, Python numbers, strings, booleans and None) in one `.npz` archive, with no
pickled code anywhere.

Each distinct tensor is one array of the archive (`tensor0`, `tensor1`, ...; a tensor that
appears twice is stored once and loads as one tensor). The structure around them is JSON in
the array `__structure__`: a dict is `{"dict": [[key, value], ...]}` (so int keys, as in an
optimizer's state, and key order survive), a tuple `{"tuple": [...]}`, a tensor
`{"tensor": name, "requires_grad": bool}` (with `"parameter": true` for an nn.Parameter; a
bfloat16 tensor, which .npy cannot hold, is stored as its bits in uint16 with
`"dtype": "bfloat16"`), a list a JSON list, and a scalar itself. Whole training checkpoints
(`{'model': ..., 'optimizer': ..., 'epoch': 3, 'args': {...}}`) are such structures. Loading
builds only these types: `weights_only` is accepted (the loader is always weights-only).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from typing import IO, Any

import numpy as np

from tracegrad.device import check_device
from tracegrad.ir import types
from tracegrad.tensor import Tensor

FORMAT = "tracegrad.save"
VERSION = 1
_STRUCTURE = "__structure__"


class _Encoder:
    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}
        self.names: dict[int, str] = {}

    def array_name(self, obj, array: np.ndarray) -> str:
        name = self.names.get(id(obj))
        if name is None:
            name = f"tensor{len(self.arrays)}"
            self.names[id(obj)] = name
            self.arrays[name] = array
        return name

    def encode(self, obj, where: str):
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, Tensor):
            array = obj.detach()._concrete()
            entry = {"requires_grad": obj.requires_grad}
            if obj.dtype is types.bfloat16:  # (.npy has no bfloat16: its bits, as uint16, and the dtype's name)
                array = array.view(np.uint16)
                entry["dtype"] = obj.dtype.name
            entry["tensor"] = self.array_name(obj, array)
            if getattr(type(obj), "_is_parameter", False):
                entry["parameter"] = True
            return entry
        if isinstance(obj, np.ndarray):
            if obj.dtype == object:
                raise TypeError(f"tg.save: cannot save an object array at {where}")
            return {"ndarray": self.array_name(obj, obj)}
        if isinstance(obj, types.DType):
            return {"dtype": obj.name}
        if isinstance(obj, dict):
            for key in obj:
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    raise TypeError(f"tg.save: cannot save a dict key of type "
                                    f"{type(key).__name__} at {where}")
            return {"dict": [[key, self.encode(value, f"{where}[{key!r}]")]
                             for key, value in obj.items()]}
        if isinstance(obj, list):
            return [self.encode(value, f"{where}[{i}]") for i, value in enumerate(obj)]
        if isinstance(obj, tuple):
            return {"tuple": [self.encode(value, f"{where}[{i}]") for i, value in enumerate(obj)]}
        raise TypeError(f"tg.save: cannot save an object of type {type(obj).__name__} at {where}: "
                        "only tensors, NumPy arrays, numbers, strings, None and dicts, lists and "
                        "tuples of them can be saved")


def save(obj: Any, f: str | os.PathLike | IO[bytes], pickle_module: Any = None, pickle_protocol: int = 2,
         _use_new_zipfile_serialization: bool = True, _disable_byteorder_record: bool = False) -> None:
    """Write `obj` (e.g. `model.state_dict()`, an optimizer's, or a dict of them with numbers
    and strings) to the path or binary file `f` as an .npz archive. The path is used as
    given (no ".npz" is appended). PyTorch's pickle options are accepted and unused."""
    encoder = _Encoder()
    structure = {"format": FORMAT, "version": VERSION, "object": encoder.encode(obj, "obj")}
    arrays = dict(encoder.arrays)
    arrays[_STRUCTURE] = np.array(json.dumps(structure))
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as file:
            np.savez(file, allow_pickle=False, **arrays)
    else:
        np.savez(f, allow_pickle=False, **arrays)


def _decode(obj, arrays, tensors: dict[str, Tensor]):
    if isinstance(obj, list):
        return [_decode(value, arrays, tensors) for value in obj]
    if not isinstance(obj, dict):
        return obj
    if "tensor" in obj:
        name = obj["tensor"]
        if name not in tensors:
            array = arrays[name]
            if obj.get("dtype") == types.bfloat16.name:
                array = array.view(types.bfloat16.np)
            tensor = Tensor(array)
            if obj.get("parameter"):
                tensor = _make_parameter(tensor, bool(obj.get("requires_grad")))
            elif obj.get("requires_grad"):
                tensor.requires_grad_(True)
            tensors[name] = tensor
        return tensors[name]
    if "ndarray" in obj:
        return arrays[obj["ndarray"]]
    if "dtype" in obj:
        return _dtype(obj["dtype"])
    if "tuple" in obj:
        return tuple(_decode(value, arrays, tensors) for value in obj["tuple"])
    if "dict" in obj:
        return OrderedDict((key, _decode(value, arrays, tensors)) for key, value in obj["dict"])
    raise ValueError(f"tg.load: unknown entry {obj!r} in the archive's structure")


def _dtype(name: str) -> types.DType:
    for dtype in types.ALL_DTYPES:
        if dtype.name == name:
            return dtype
    raise ValueError(f"tg.load: unknown dtype {name!r}")


def _make_parameter(tensor: Tensor, requires_grad: bool) -> Tensor:
    # nn sits above this layer: the Parameter class (marked `_is_parameter`) is looked up
    # among the Tensor subclasses when one is loaded.
    parameter_class = next(cls for cls in _subclasses(Tensor) if cls.__dict__.get("_is_parameter"))
    return parameter_class(tensor, requires_grad=requires_grad)


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub] + _subclasses(sub)
    return found


def _check_map_location(map_location: Any) -> None:
    """Every location is the CPU: a map_location naming another device is refused."""
    if map_location is None or callable(map_location):
        return
    targets = map_location.values() if isinstance(map_location, dict) else [map_location]
    for target in targets:
        check_device("tg.load", target)


def load(f: str | os.PathLike | IO[bytes], map_location: Any = None, pickle_module: Any = None, *,
         weights_only: bool | None = None, mmap: bool | None = None, **pickle_load_args: Any) -> Any:
    """Read an object written by `tg.save`: tensors come back as tracegrad Tensors (with
    their `requires_grad`; Parameters as Parameters), dicts as OrderedDicts. Everything is
    on the CPU: `map_location` may name it ("cpu", a device, a dict of locations) or be a
    function, which gets each tensor and "cpu" and returns the tensor to use."""
    _check_map_location(map_location)
    if mmap:
        raise RuntimeError("tg.load: mmap=True is not supported (the archive is a compressed-free .npz, read "
                           "into memory)")
    result = _read(f)
    if callable(map_location):
        result = _map_tensors(result, lambda tensor: map_location(tensor, "cpu"))
    return result


def _map_tensors(obj, function):
    if isinstance(obj, Tensor):
        return function(obj)
    if isinstance(obj, dict):
        return OrderedDict((key, _map_tensors(value, function)) for key, value in obj.items())
    if isinstance(obj, list):
        return [_map_tensors(value, function) for value in obj]
    if isinstance(obj, tuple):
        return tuple(_map_tensors(value, function) for value in obj)
    return obj


def _read(f: str | os.PathLike | IO[bytes]) -> Any:
    with np.load(f, allow_pickle=False) as archive:
        if _STRUCTURE not in archive.files:
            raise RuntimeError("tg.load: not a tracegrad archive (no __structure__ entry); "
                               "expected a file written by tg.save")
        structure = json.loads(str(archive[_STRUCTURE]))
        if structure.get("format") != FORMAT or structure.get("version") != VERSION:
            raise RuntimeError(f"tg.load: unsupported archive format {structure.get('format')!r} "
                               f"version {structure.get('version')!r}")
        arrays = {name: archive[name] for name in archive.files if name != _STRUCTURE}
    return _decode(structure["object"], arrays, {})


class safe_globals:  # noqa: N801 - PyTorch's name
    """Accepted for PyTorch programs that allow-list classes for `load(weights_only=True)`:
    tracegrad's loader never unpickles, so there is nothing to allow (a context manager)."""

    def __init__(self, safe_globals: list):
        self.safe_globals = list(safe_globals)

    def __enter__(self) -> safe_globals:
        return self

    def __exit__(self, *exc_info) -> bool:
        return False


_allowed_globals: list = []


def add_safe_globals(safe_globals: list) -> None:
    """Recorded (`get_safe_globals`) and otherwise a no-op, as `safe_globals`."""
    _allowed_globals.extend(safe_globals)


def get_safe_globals() -> list:
    return list(_allowed_globals)
