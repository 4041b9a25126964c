"""The disk cache of compiled machine code.

One file per kernel, named by the SHA-256 of the kernel's LLVM IR and of the host (LLVM
version, CPU name and features), so a file can only ever be loaded for the code it was
built from. A file holds a magic tag, the SHA-256 of its payload, and the payload (a JSON
header and the object code). A truncated, corrupt or foreign file fails verification and
is rebuilt; files are written to a temporary name and renamed, so concurrent writers never
expose a partial file. Nothing is unpickled; object code is loaded only after its checksum
and header match. Only a regular file is read: an entry that is a FIFO, a device, a
directory (or a link to one) counts as absent, and opening it cannot block (`_read`).

`TRACEGRAD_CACHE_DIR` moves the cache (default: `$XDG_CACHE_HOME/tracegrad` or
`~/.cache/tracegrad`); `TRACEGRAD_CACHE=0` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile

from tracegrad import reference

MAGIC = b"TGOBJ1\n"


def cache_dir() -> str | None:
    if os.environ.get("TRACEGRAD_CACHE", "1") == "0" or reference.ACTIVE:
        return None
    configured = os.environ.get("TRACEGRAD_CACHE_DIR")
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tracegrad")


def kernel_key(llvm_ir: str, host: str) -> str:
    return hashlib.sha256(f"{host}\n{llvm_ir}".encode()).hexdigest()


def _path(directory: str, key: str) -> str:
    return os.path.join(directory, key[:2], key + ".o")


def load(key: str, host: str) -> bytes | None:
    """The object code stored under `key`, or None if absent or not verifiable."""
    directory = cache_dir()
    if directory is None:
        return None
    blob = _read(_path(directory, key))
    if blob is None or not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + 32:
        return None
    digest, payload = blob[len(MAGIC):len(MAGIC) + 32], blob[len(MAGIC) + 32:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    header_bytes, separator, obj = payload.partition(b"\0")
    if not separator:
        return None
    try:
        header = json.loads(header_bytes)
    except ValueError:
        return None
    if header != {"key": key, "host": host, "size": len(obj)}:
        return None
    return obj


def _read(path: str) -> bytes | None:
    """The contents of `path` if it is a regular file (following links), else None. Opened
    without blocking (a FIFO's open would wait for a writer) and checked on the open file,
    so the file read is the file checked."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb") as f:
            fd = -1  # (closed with f)
            return f.read()
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def store(key: str, host: str, obj: bytes) -> None:
    directory = cache_dir()
    if directory is None:
        return
    path = _path(directory, key)
    header = json.dumps({"key": key, "host": host, "size": len(obj)}, sort_keys=True).encode()
    payload = header + b"\0" + obj
    blob = MAGIC + hashlib.sha256(payload).digest() + payload
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(temporary, path)
    except OSError:
        pass  # a cache that cannot be written is only a slower cache
