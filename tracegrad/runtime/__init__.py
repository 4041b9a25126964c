"""The runtime: what loads and runs compiled code, below the code generator (`codegen/`).

The disk cache of object code and the kernels' cache keys, the host description, the ELF
object loader, the LLVM engine that compiles and loads a module given its IR, the worker
threads and their spinning hand-off, buffers, programs and their step timings, and the
one in-memory cache of built programs (`program_cache.py`). Nothing
here generates a kernel from a graph; the one small function the runtime needs itself
(the hand-off) it builds with llvmlite directly."""
