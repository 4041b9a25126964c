"""Code generation (fusion, LLVM lowering, runtime, kernel cache): built by the compiler
issue on top of the primitive table's `kind` field. Empty for now."""
