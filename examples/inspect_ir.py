"""Look inside tracegrad: the recorded eager graph, its backward IR, and what the compiler
makes of a small function (fused kernels and their LLVM IR).

Run: python examples/inspect_ir.py [--quick] [--llvm-lines N]

Every stage prints in one text format (docs/ir.md). The same views are available for whole
programs through TRACEGRAD_LOG=graphs,kernels,llvm (see the README).
"""

from __future__ import annotations

import argparse

import numpy as np

import tracegrad as tg


def softplus_loss(x: tg.Tensor, w: tg.Tensor) -> tg.Tensor:
    """mean(log(1 + exp(x @ w))): a matmul, elementwise ops and a reduction."""
    return ((x @ w).exp() + 1).log().mean()


def section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="accepted for CI; the example is already small")
    parser.add_argument("--llvm-lines", type=int, default=40, help="how much of the LLVM IR to print")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = tg.tensor(rng.normal(size=(8, 4)).astype(np.float32))
    w = tg.tensor(rng.normal(size=(4, 3)).astype(np.float32), requires_grad=True)

    section("1. the recorded eager graph of the loss: tg.ir.dump(loss)")
    loss = softplus_loss(x, w)
    recorded = tg.ir.dump(loss)
    print(recorded)

    section("2. its backward IR, from the reverse-mode transform: tg.autograd.backward_graph(loss, [w])")
    backward = tg.autograd.backward_graph(loss, [w])
    print(backward)
    (grad_w,) = tg.ir.interpret(backward, {**backward.bindings, backward.inputs[0]: np.float32(1.0)})
    loss.backward()
    np.testing.assert_allclose(grad_w, w.grad.numpy(), rtol=1e-5)
    print("interpreting the backward IR with NumPy gives w.grad: ok")

    section("3. the compiled function: fn.explain(x, w) (graphs, fusion into kernels)")
    compiled = tg.compile(softplus_loss)
    report = compiled.explain(x, w)
    print(report)

    section(f"4. the LLVM IR of its kernels: report.llvm_ir() (first {args.llvm_lines} lines)")
    llvm_ir = report.llvm_ir()
    lines = llvm_ir.splitlines()
    print("\n".join(lines[:args.llvm_lines]))
    if len(lines) > args.llvm_lines:
        print(f"... ({len(lines) - args.llvm_lines} more lines)")

    assert "matmul" in recorded and "exp" in recorded
    assert "define" in llvm_ir
    assert report.misses >= 1
    np.testing.assert_allclose(compiled(x, w).item(), loss.item(), rtol=1e-5)
    print("\ncompiled result equals eager: ok")


if __name__ == "__main__":
    main()
