"""Building LLVM IR: the IR types, `emit_loop` (the counted loop every generator emits),
and `ScalarBuilder`, the typed IR builder that primitives' `lower` functions use to
express one element of their result. What does not live here: compiling and loading a
module (`runtime/llvm_engine.py`)."""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from tracegrad.ir import types
from tracegrad.runtime import llvm_engine

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()


def register_type(dtype: types.DType) -> ir.Type:
    """The type of a value in registers (bool is i1)."""
    return {"float32": F32, "float64": F64, "int64": I64, "bool": I1}[dtype.name]


def memory_type(dtype: types.DType) -> ir.Type:
    """The type of an element in memory (NumPy bools are one byte)."""
    return I8 if dtype is types.bool_ else register_type(dtype)


def emit_loop(b: ir.IRBuilder, start, stop, step, carried: list, body: Callable,
              interleave: int | Callable[[], int | None] | None = None) -> list:
    """Emit `for i in range(start, stop, step)` carrying `carried` values through phis.

    `body(i, values)` emits the loop body and returns the next values; the values after
    the loop are returned. `interleave` (or a function giving it once the body is emitted)
    asks the loop vectorizer for that many vector iterations in flight: for a reduction,
    that many partial accumulators."""
    before = b.block
    head = b.append_basic_block("loop.head")
    body_block = b.append_basic_block("loop.body")
    done = b.append_basic_block("loop.done")
    b.branch(head)
    b.position_at_end(head)
    index = b.phi(I64)
    index.add_incoming(start, before)
    phis = []
    for value in carried:
        phi = b.phi(value.type)
        phi.add_incoming(value, before)
        phis.append(phi)
    b.cbranch(b.icmp_signed("<", index, stop), body_block, done)
    b.position_at_end(body_block)
    updated = body(index, phis)
    latch = b.block
    index.add_incoming(b.add(index, step if isinstance(step, ir.Value) else I64(step)), latch)
    for phi, value in zip(phis, updated):
        phi.add_incoming(value, latch)
    back_edge = b.branch(head)
    if callable(interleave):
        interleave = interleave()
    if interleave is not None:
        back_edge.set_metadata("llvm.loop", _loop_id(b.module, interleave))
    b.position_at_end(done)
    return phis


def _loop_id(module: ir.Module, interleave: int):
    """A new loop's metadata: a node whose first operand is itself (which makes it
    unique to the loop, as LLVM requires), then the hint."""
    hint = module.add_metadata([ir.MetaDataString(module, "llvm.loop.interleave.count"), I32(interleave)])
    count = len(module.metadata)  # an operand that keeps this node apart from other loops'
    loop_id = module.add_metadata([None, hint, ir.MetaDataString(module, f"tracegrad.loop.{count}")])
    loop_id.operands = (loop_id,) + tuple(loop_id.operands[1:])
    return loop_id


FLOAT_MINMAX_INTERLEAVE = 8


class ScalarBuilder:
    """Typed scalar IR operations. `in_types`/`out_type` describe the node being lowered."""

    def __init__(self, builder: ir.IRBuilder, module: ir.Module):
        self.ir = builder
        self.module = module
        self.in_types: tuple = ()
        self.out_type = None
        # Set by a reduction's combine step whose dependency chain is long enough that
        # the loop should keep this many vector accumulators in flight (see
        # `reduce_maximum`); the kernel emitter reads it after lowering the step.
        self.reduction_interleave: int | None = None

    # -- constants and types --
    def const(self, value, dtype: types.DType):
        typ = register_type(dtype)
        if dtype is types.bool_:
            return ir.Constant(typ, int(bool(value)))
        if dtype is types.int64:
            return ir.Constant(typ, int(value))
        return ir.Constant(typ, float(value))

    def like(self, value, x):
        """A constant of x's type."""
        return ir.Constant(x.type, float(value) if isinstance(x.type, (ir.FloatType, ir.DoubleType))
                           else int(value))

    @staticmethod
    def is_float(x) -> bool:
        return isinstance(x.type, (ir.FloatType, ir.DoubleType))

    def intrinsic(self, name: str, *args):
        """Call a same-typed LLVM intrinsic such as `sqrt`, `maxnum`, `maximum`, `smax`."""
        return self._call_intrinsic(name, args)

    def _call_intrinsic(self, name: str, args, fastmath=()):
        suffix = {F32: "f32", F64: "f64", I64: "i64"}[args[0].type]
        full_name = f"llvm.{name}.{suffix}"
        fn = self.module.globals.get(full_name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(args[0].type, [a.type for a in args]), full_name)
        return self.ir.call(fn, args, fastmath=fastmath)

    def fmuladd(self, a, b, c):
        """a*b + c, fused into one fma where the target has it (rounded once or twice: for
        polynomials, where either is accurate enough; exact splits use `intrinsic("fma")`)."""
        return self.intrinsic("fmuladd", a, b, c)

    def ldexp(self, x, n):
        """x * 2**n for a float x and an integer n of x's width (i32 for float32, i64 for
        float64), rounded once, with overflow to inf and gradual underflow. With AVX-512
        this is llvm.ldexp (one vscalef); otherwise two exact power-of-two factors, valid
        for |n| up to twice the exponent bias."""
        if llvm_engine.HAS_SCALEF:
            name = f"llvm.ldexp.{'f32' if x.type == F32 else 'f64'}.i32"
            fn = self.module.globals.get(name)
            if fn is None:
                fn = ir.Function(self.module, ir.FunctionType(x.type, [x.type, I32]), name)
            return self.ir.call(fn, [x, n if n.type == I32 else self.ir.trunc(n, I32)])
        int_type, mantissa_bits, bias = (I32, 23, 127) if x.type == F32 else (I64, 52, 1023)
        half = self.ir.ashr(n, int_type(1))
        for part in (half, self.ir.sub(n, half)):
            power = self.ir.bitcast(self.ir.shl(self.ir.add(part, int_type(bias)), int_type(mantissa_bits)), x.type)
            x = self.ir.fmul(x, power)
        return x

    def clamp(self, x, low: float, high: float):
        """x limited to [low, high], NaN kept: two compare+selects, each one x86 max/min
        instruction (llvm.maxnum/minnum would turn NaN into a bound)."""
        x = self.ir.select(self.ir.fcmp_ordered("<", x, self.like(low, x)), self.like(low, x), x)
        return self.ir.select(self.ir.fcmp_ordered(">", x, self.like(high, x)), self.like(high, x), x)

    # -- arithmetic (float, int or bool by operand type, with NumPy's meaning) --
    def add(self, a, b):
        if a.type == I1:
            return self.ir.or_(a, b)
        return self.ir.fadd(a, b) if self.is_float(a) else self.ir.add(a, b)

    def add_reassoc(self, a, b):
        """An add the vectorizer may reorder (sum reductions only). Only `reassoc`: with
        `nsz`, LLVM may fold acc + (v - v) to acc and lose a NaN."""
        if self.is_float(a):
            return self.ir.fadd(a, b, flags=("reassoc",))
        return self.add(a, b)

    def sub(self, a, b):
        return self.ir.fsub(a, b) if self.is_float(a) else self.ir.sub(a, b)

    def mul(self, a, b):
        if a.type == I1:
            return self.ir.and_(a, b)
        return self.ir.fmul(a, b) if self.is_float(a) else self.ir.mul(a, b)

    def div(self, a, b):
        return self.ir.fdiv(a, b)

    def neg(self, a):
        return self.ir.fneg(a) if self.is_float(a) else self.ir.neg(a)

    def maximum(self, a, b):
        """NumPy's maximum: a NaN in either operand propagates; otherwise a > b ? a : b
        (so maximum(-0.0, 0.0) is 0.0 and maximum(0.0, -0.0) is -0.0, as NumPy gives).
        A compare and select each, which x86 does as maxps and a masked move."""
        if a.type == I1:
            return self.ir.or_(a, b)
        if not self.is_float(a):
            return self.intrinsic("smax", a, b)
        return self.select(self.is_nan(a), a, self.select(self.compare(">", a, b), a, b))

    def minimum(self, a, b):
        """NumPy's minimum: NaN propagates; otherwise a < b ? a : b."""
        if a.type == I1:
            return self.ir.and_(a, b)
        if not self.is_float(a):
            return self.intrinsic("smin", a, b)
        return self.select(self.is_nan(a), a, self.select(self.compare("<", a, b), a, b))

    def reduce_maximum(self, acc, x):
        """A max reduction's combine step: llvm.maximum (NaN propagates), which the loop
        vectorizer turns into a vector reduction, where a compare+select recurrence would
        stay scalar. `nsz` lets it order -0.0 and 0.0 either way (NumPy's reductions do
        too), which saves x86 the sign fix-ups on the accumulator's dependency chain.
        That chain is still three instructions (max, NaN test, masked move): with LLVM's
        default of 4 accumulators a row max ran at 60% of a row sum's speed, with 8 as
        fast (8192x1000 float32: 1.13 -> 0.73 ms), hence `reduction_interleave`."""
        if acc.type == I1 or not self.is_float(acc):
            return self.maximum(acc, x)
        self.reduction_interleave = FLOAT_MINMAX_INTERLEAVE
        return self._call_intrinsic("maximum", (acc, x), fastmath=("nsz",))

    def reduce_minimum(self, acc, x):
        """A min reduction's combine step (see `reduce_maximum`)."""
        if acc.type == I1 or not self.is_float(acc):
            return self.minimum(acc, x)
        self.reduction_interleave = FLOAT_MINMAX_INTERLEAVE
        return self._call_intrinsic("minimum", (acc, x), fastmath=("nsz",))

    def compare(self, op: str, a, b):
        """op in < <= > >= == != ; float compares are ordered except != (NaN != NaN)."""
        if self.is_float(a):
            if op == "!=":
                return self.ir.fcmp_unordered("!=", a, b)
            return self.ir.fcmp_ordered(op, a, b)
        if a.type == I1:
            return self.ir.icmp_unsigned(op, a, b)
        return self.ir.icmp_signed(op, a, b)

    def select(self, cond, a, b):
        return self.ir.select(cond, a, b)

    def is_nan(self, x):
        return self.ir.fcmp_unordered("uno", x, x)

    def convert(self, x, source: types.DType, target: types.DType):
        if source is target:
            return x
        to = register_type(target)
        if source is types.bool_:
            return self.ir.uitofp(x, to) if target.is_floating else self.ir.zext(x, to)
        if target is types.bool_:
            return self.compare("!=", x, self.like(0, x))
        if source.is_floating and target.is_floating:
            return self.ir.fpext(x, to) if target.itemsize > source.itemsize else self.ir.fptrunc(x, to)
        if source.is_floating:
            return self.ir.fptosi(x, to)
        return self.ir.sitofp(x, to)

    def math(self, name: str, x):
        from tracegrad.codegen import mathlib
        return getattr(mathlib, name)(self, x)

    # -- index arithmetic for movement ops (i64) --
    @staticmethod
    def index_const(value: int):
        return I64(value)

    def wrap_index(self, i, size: int):
        """A data index as a position: negative counts from the end, then clamped into
        [0, size) so that a bad index can never read outside the buffer (indices are
        bounds-checked before the kernel runs, as eager checks them)."""
        i = self.ir.select(self.ir.icmp_signed("<", i, I64(0)), self.ir.add(i, I64(size)), i)
        i = self.ir.select(self.ir.icmp_signed("<", i, I64(0)), I64(0), i)
        return self.ir.select(self.ir.icmp_signed(">", i, I64(size - 1)), I64(size - 1), i)

    def affine(self, i, start: int, step: int):
        scaled = i if step == 1 else self.ir.mul(i, I64(step))
        return scaled if start == 0 else self.ir.add(scaled, I64(start))

    def reshape_index(self, index: list, source: tuple[int, ...], target: tuple[int, ...]) -> list:
        """Map an index of shape `target` to the same element's index in `source`.

        Dims are matched in blocks of equal element count, so inserting or removing size-1
        dims and merging/splitting dims costs only the arithmetic of their own block."""
        result, s, t = [], 0, 0
        while s < len(source) or t < len(target):
            if s < len(source) and source[s] == 1:
                result.append(I64(0))
                s += 1
                continue
            if t < len(target) and target[t] == 1:
                t += 1
                continue
            s_end, t_end = s + 1, t + 1
            s_count, t_count = source[s], target[t]
            while s_count != t_count:
                if s_count < t_count:
                    s_count *= source[s_end]
                    s_end += 1
                else:
                    t_count *= target[t_end]
                    t_end += 1
            if s_end - s == 1 and t_end - t == 1:
                result.append(index[t])
            else:
                flat = None
                for position in range(t, t_end):
                    term = index[position]
                    flat = term if flat is None else self.ir.add(self.ir.mul(flat, I64(target[position])), term)
                parts = []
                for position in reversed(range(s, s_end)):
                    size = source[position]
                    parts.append(self.ir.urem(flat, I64(size)) if position > s else flat)
                    if position > s:
                        flat = self.ir.udiv(flat, I64(size))
                result.extend(reversed(parts))
            s, t = s_end, t_end
        return result
