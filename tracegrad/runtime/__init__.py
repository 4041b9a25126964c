"""The runtime: what loads and runs compiled code, below the code generator (`codegen/`).

The disk cache of object code, the host description, the ELF object loader, the LLVM
engine that compiles and loads a module given its IR, the worker threads and their
spinning hand-off, buffers and programs. Nothing here generates a kernel from a graph;
the few small functions the runtime needs itself (the hand-off) it builds with llvmlite
directly."""
