"""`tg.save(obj, f)` / `tg.load(f)`: state dicts (nested dicts, lists and tuples of tensors,
NumPy arrays, Python numbers, strings, booleans and None) in one `.npz` archive, with no
pickled code anywhere.

Each distinct tensor is one array of the archive (`tensor0`, `tensor1`, ...; a tensor that
appears twice is stored once and loads as one tensor). The structure around them is JSON in
the array `__structure__`: a dict is `{"dict": [[key, value], ...]}` (so int keys, as in an
optimizer's state, and key order survive), a tuple `{"tuple": [...]}`, a tensor
`{"tensor": name, "requires_grad": bool}` (a bfloat16 tensor, which .npy cannot hold, is stored
as its bits in uint16 with `"dtype": "bfloat16"`), a list a JSON list, and a scalar itself.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from typing import IO, Any

import numpy as np

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
            if obj.dtype is types.bfloat16:  # (.npy has no bfloat16: its bits, as uint16, and the dtype's name)
                name = self.array_name(obj, array.view(np.uint16))
                return {"tensor": name, "requires_grad": obj.requires_grad, "dtype": obj.dtype.name}
            name = self.array_name(obj, array)
            return {"tensor": name, "requires_grad": obj.requires_grad}
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


def save(obj: Any, f: str | os.PathLike | IO[bytes]) -> None:
    """Write `obj` (e.g. `model.state_dict()` or an optimizer's) to the path or binary file
    `f` as an .npz archive. The path is used as given (no ".npz" is appended)."""
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
            if obj.get("requires_grad"):
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


def load(f: str | os.PathLike | IO[bytes]) -> Any:
    """Read an object written by `tg.save`: tensors come back as tracegrad Tensors (with
    their `requires_grad`), dicts as OrderedDicts."""
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
