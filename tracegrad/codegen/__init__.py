"""Code generation: fusion planning (fusion.py, epilogue.py), lowering fused kernels to LLVM
IR (kernels.py, ir_builder.py, mathlib.py), the generated GEMM (gemm_ir.py, gemm.py,
gemm_narrow.py), the steps that build and run their code (KernelStep, matmul_steps.py,
fastcall.py) and building a Program from a Graph (program_builder.py). Compiling IR,
loading object code and running programs are the runtime's (`tracegrad/runtime/`)."""
