"""The compiler's front end: `@tracegrad.jit.function` (`function.py`: the compile trace and
`CompiledFunction`), the key and cache of traced calls, calls that follow an earlier
call's recorded trace (`replay.py`, `composite.py`), tensors sharing memory (`alias.py`),
state after an exception (`undo.py`, `checks.py`), cache events and `explain`
(`events.py`, `explain.py`, `input_names.py`) and whole-program logging (`inspect_log.py`).
It sits on top of every other package: nothing below imports it."""

from tracegrad.jit.function import compile  # noqa: F401,A004
