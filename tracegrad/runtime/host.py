"""What compiled code depends on about the host, known without loading LLVM when possible.

Every disk-cache key includes `description()`: LLVM's version, host CPU name and CPU
features, as LLVM reports them. Asking LLVM means importing `llvmlite.binding` (~20 ms:
loading LLVM's shared library), which a warm-cache first call otherwise never needs (its
kernels come from disk, `object_loader`). So the description LLVM gave is remembered in the
disk cache under a fingerprint of everything it is a function of, read cheaply: the
llvmlite build (version, and the path, size and modification time of its shared library),
the OS and machine, and the CPU as the kernel describes it (the first processor's block of
/proc/cpuinfo: vendor, family, model, stepping, microcode, flags, ... without the fields
that vary by core or over time). A fingerprint that cannot be taken (no /proc/cpuinfo, no
library file found) or no record under it: LLVM is asked, as before, and the answer
recorded. When a process loads LLVM anyway (to compile), it checks the recorded answer
against LLVM's and repairs the record if they differ (`confirm`).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import threading

from tracegrad.runtime import disk_cache

_RECORD = "host-description"
# Lines of a /proc/cpuinfo block that differ between cores or change while running.
_VOLATILE = {"processor", "cpu mhz", "bogomips", "core id", "apicid", "initial apicid", "physical id",
             "siblings", "cpu cores"}
# llvm-VERSION-CPU-FEATURES; a CPU name may hold "-" (x86-64), features start with + or -.
_FORMAT = re.compile(r"llvm-[0-9.]+-(\S+?)-([+-]\S*)?")

_lock = threading.Lock()
_description: str | None = None


def _library_identity() -> str | None:
    """Where llvmlite's shared library is and which file it is, without loading it."""
    try:
        import llvmlite
        name = ("libllvmlite.dylib" if sys.platform == "darwin" else "libllvmlite.so") if os.name == "posix" \
            else "llvmlite.dll"
        path = os.path.join(os.path.dirname(os.path.abspath(llvmlite.__file__)), "binding", name)
        status = os.stat(path)
        return f"llvmlite {llvmlite.__version__} {path} {status.st_size} {status.st_mtime_ns}"
    except (ImportError, OSError, AttributeError):
        return None


def _cpu_identity() -> str | None:
    """The first processor's block of /proc/cpuinfo, without its volatile lines."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            text = f.read(65536).decode("utf-8", "replace")
    except OSError:
        return None
    block = text.split("\n\n", 1)[0]
    lines = [line for line in block.splitlines()
             if ":" in line and line.split(":", 1)[0].strip().lower() not in _VOLATILE]
    return "\n".join(lines) if any(line.lower().startswith(("flags", "features")) for line in lines) else None


def fingerprint() -> str | None:
    library, cpu = _library_identity(), _cpu_identity()
    if library is None or cpu is None:
        return None
    machine = os.uname()
    return f"{sys.platform} {machine.machine} {machine.release}\n{library}\n{cpu}"


def _record_key(identity: str) -> str:
    return hashlib.sha256(f"{_RECORD}\n{identity}".encode()).hexdigest()


def from_llvm() -> str:
    """LLVM's own answer (loads LLVM)."""
    import llvmlite.binding as llvm
    return (f"llvm-{'.'.join(map(str, llvm.llvm_version_info))}-{llvm.get_host_cpu_name()}-"
            f"{llvm.get_host_cpu_features().flatten()}")


def description() -> str:
    """LLVM version, host CPU name and features: recorded, or asked of LLVM (and recorded)."""
    global _description
    with _lock:
        if _description is None:
            identity = fingerprint()
            recorded = None
            if identity is not None:
                found = disk_cache.load(_record_key(identity), _RECORD)
                if found is not None:
                    text = found.decode("ascii", "replace")
                    recorded = text if _FORMAT.fullmatch(text) else None
            if recorded is None:
                recorded = from_llvm()
                if identity is not None:
                    disk_cache.store(_record_key(identity), _RECORD, recorded.encode("ascii"))
            _description = recorded
        return _description


def confirm() -> None:
    """Check the description in use against LLVM's answer (LLVM is loaded already): if the
    record was wrong, repair it and use LLVM's answer from now on (kernels keyed by the
    old one are not found under the new)."""
    global _description
    live = from_llvm()
    with _lock:
        if _description is None or _description == live:
            _description = live
            return
        _description = live
    identity = fingerprint()
    if identity is not None:
        disk_cache.store(_record_key(identity), _RECORD, live.encode("ascii"))


def features() -> dict[str, bool]:
    """The host's CPU features, as LLVM names them ("avx512f": True, ...)."""
    match = _FORMAT.fullmatch(description())
    flattened = (match.group(2) or "") if match else ""
    return {item[1:]: item[0] == "+" for item in flattened.split(",") if item[:1] in "+-" and len(item) > 1}
