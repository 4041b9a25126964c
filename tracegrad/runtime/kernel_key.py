"""The disk-cache key of a fused kernel, computed without generating its LLVM IR.

A kernel's IR is a function of the `FusedKernel` (its nodes, leaves, results and the
fusion decisions recorded on it) and of the code that lowers it. `kernel_description`
writes the first canonically (values numbered by first appearance, nodes as primitive
name, attributes, operands and types) and prefixes a hash of the second: the sources of
`tracegrad/codegen`, `tracegrad/runtime`, `tracegrad/ops` and `tracegrad/ir`, llvmlite's version and the
lowering's module-level switches (`llvm_engine.ir_settings`). A kernel
whose description is in the disk cache then loads without building its IR, which is most
of a warm-cache first call's compile time (the math library's polynomials are built in
Python).

Anything the serializer does not know (a new kind of field on a kernel) makes the
description None, and the caller keys by the IR text as before: never a guess. With
`TRACEGRAD_CHECK_KERNEL_KEYS=1` (the test suite sets it) every kernel's IR is built anyway
and `check_unique` raises if one description ever stood for two different IRs.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import threading
from collections.abc import Callable

import numpy as np

from tracegrad.ir.graph import Node, Value
from tracegrad.ir.types import DType, TensorType

_PACKAGES = ("codegen", "runtime", "ops", "ir")


class _Unknown(Exception):
    """The kernel holds something this serializer cannot describe."""


@functools.cache
def lowering_source_hash() -> str | None:
    """SHA-256 of every source file the generated IR can depend on, or None when a source
    is not readable (an install without sources: kernels are then keyed by their IR)."""
    import llvmlite

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256(f"llvmlite {llvmlite.__version__}\n".encode())
    try:
        for package in _PACKAGES:
            directory = os.path.join(root, package)
            for name in sorted(os.listdir(directory)):
                if name.endswith(".py"):
                    with open(os.path.join(directory, name), "rb") as source:
                        digest.update(f"{package}/{name}\n".encode() + source.read())
    except OSError:
        return None
    return digest.hexdigest()


def generator_key() -> str | None:
    """What a hand-written generator's IR (the GEMMs') depends on besides its parameters:
    the lowering sources, llvmlite and the lowering's switches; None if not hashable."""
    from tracegrad.runtime.llvm_engine import ir_settings
    source_hash = lowering_source_hash()
    return None if source_hash is None else f"{source_hash} {ir_settings()}"


def kernel_description(kernel, purpose: str = "kernel") -> str | None:
    """A text that determines the IR `purpose` (a kernel, or its combine function) builds
    from `kernel`, or None if the kernel cannot be described."""
    source_hash = lowering_source_hash()
    if source_hash is None:
        return None
    numbers: dict = {}
    try:
        body = _describe(kernel, numbers)
    except _Unknown:
        return None
    from tracegrad.runtime.llvm_engine import ir_settings
    return f"{purpose} {source_hash} {ir_settings()}\n{body}"


def _value_key(value: Value):
    """A key equal for equal values (the same output of the same node; an input is equal
    only to itself), without Value's Python-level __hash__ and __eq__: a warm-cache first
    call describes every kernel. Every value described is reachable from the kernel while
    it is described, so no id is reused meanwhile."""
    node = value.node
    return id(value) if node is None else (id(node), value.index)


def _numbered(key, type_: TensorType, numbers: dict) -> str:
    """"%number:type" of the value under `key`, numbered now if it is new. The type's text
    is remembered per type object (under ("type", id), apart from values' keys)."""
    number = numbers.get(key)
    if number is None:
        number = numbers[key] = numbers.get("count", 0)
        numbers["count"] = number + 1
    type_key = ("type", id(type_))
    text = numbers.get(type_key)
    if text is None:
        text = numbers[type_key] = str(type_)
    return f"%{number}:{text}"


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name != "name")


def _describe(thing, numbers: dict) -> str:
    """`numbers`: value keys (`_value_key`) -> their numbers, by first appearance."""
    if isinstance(thing, Value):
        return _numbered(_value_key(thing), thing.type, numbers)
    if isinstance(thing, Node):
        operands = ", ".join([_numbered(_value_key(v), v.type, numbers) if isinstance(v, Value)
                              else _describe(v, numbers) for v in thing.inputs])
        attrs = ", ".join([f"{k}={_attr_text(thing.attrs[k])}" for k in sorted(thing.attrs)])
        node = id(thing)  # its outputs' keys (`_value_key` of thing.output(i))
        outputs = ", ".join([_numbered((node, i), t, numbers) for i, t in enumerate(thing.out_types)])
        return f"{thing.op.name}({operands}; {attrs}) -> {outputs}"
    if isinstance(thing, (list, tuple)):
        return "[" + ", ".join(_describe(item, numbers) for item in thing) + "]"
    if isinstance(thing, (set, frozenset)):
        # Numbered already (sets only hold values the kernel's lists name), so sortable.
        if any(isinstance(item, Value) and _value_key(item) not in numbers for item in thing):
            raise _Unknown(thing)
        return "{" + ", ".join(sorted(_describe(item, numbers) for item in thing)) + "}"
    if isinstance(thing, dict):
        items = [(_describe(k, numbers), _describe(v, numbers)) for k, v in thing.items()]
        return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(items)) + "}"
    if dataclasses.is_dataclass(thing) and not isinstance(thing, type):
        fields = [f"{name}={_describe(getattr(thing, name), numbers)}" for name in _field_names(type(thing))]
        return f"{type(thing).__name__}(" + ", ".join(fields) + ")"
    if thing is None or isinstance(thing, (bool, int, float, str, TensorType)):
        return repr(thing)
    raise _Unknown(thing)


def _attr_text(value) -> str:
    """An attribute's exact text: only types whose repr round-trips are accepted (an array's
    repr, for one, elides elements)."""
    if isinstance(value, tuple):
        return "(" + ", ".join(_attr_text(item) for item in value) + ",)"
    if value is None or isinstance(value, (bool, int, float, str, DType, np.generic)):
        return repr(value)
    raise _Unknown(value)


def compile_described(kernel, purpose: str, build: Callable, small: bool = False,
                      strength_reduction: bool = True) -> tuple[object, str, bool, str | None]:
    """Compile the one-function module `build()` makes for `kernel` (a function named
    "kernel"), or find it in memory or the disk cache by the kernel's description (by its
    IR when it has none). `small` as in `llvm_engine.optimize`, `strength_reduction` as in
    `llvm_engine.emit_object`. Returns (its `llvm_engine.Code`, which the caller holds while it may call
    the kernel; symbol, loaded_from_disk, description)."""
    from tracegrad.runtime.llvm_engine import compile_kernel_held
    description = kernel_description(kernel, purpose)
    if description is not None and checking():
        check_unique(description, str(build()))
    code, from_disk = compile_kernel_held(description, "kernel", build, small, strength_reduction)
    return code, code.symbol, from_disk, description


_checked: dict[str, str] = {}
_checked_lock = threading.Lock()


def checking() -> bool:
    return os.environ.get("TRACEGRAD_CHECK_KERNEL_KEYS", "") == "1"


def check_unique(description: str, llvm_ir: str) -> None:
    """Raise if `description` was seen before with a different IR (a serializer gap)."""
    digest = hashlib.sha256(llvm_ir.encode()).hexdigest()
    with _checked_lock:
        seen = _checked.setdefault(description, digest)
    if seen != digest:
        raise AssertionError(f"kernel description does not determine the IR:\n{description}")
