"""In-place ops, setitem and autograd constructs for the op catalogue (`catalog.py`):
in-place updates of leaves (under no_grad) and non-leaves, detach/clone, no_grad blocks,
requires_grad_, custom Functions, `.item()` and Python branches, deliberate errors, and
the argument layouts of `inputs()` that carry history or share memory."""

from __future__ import annotations

from .catalog import guarded, scalar_bits
from .catalog_shape import _basic_key
from .model import add_bits, broadcast, exact_bits, mul_bits


def _inplace_category(b, target, op: str) -> str | None:
    """The feature an in-place `op` on `target` exercises, or None when it is not generated."""
    if target.base == "<expanded>":
        return "inplace_expanded_input"
    if target.name in b.contiguous_aliases:
        return "inplace_on_contiguous_alias"
    if target.name in b.internal_views:
        return "inplace_on_internal_view"
    if target.base is not None and target.base != "<input>":
        # A write through a view reaches its base (with grad: PyTorch's CopySlices). Its base
        # must be a variable of the program, not a hidden tensor an argument views.
        # Generated where it rebases the base (a root in the graph, not a leaf): writes
        # without grad through views (expand to the same shape is read-only in tracegrad,
        # not in PyTorch) are left out as before.
        root = _view_root(b, target)
        if root is None or root.base is not None or root.leaf or not root.requires_grad:
            return None
        if not target.requires_grad:
            return None  # (a view taken under no_grad: PyTorch refuses to write it with grad)
        return "inplace_on_view"
    if target.leaf:
        return "inplace_leaf_no_grad"
    if not target.requires_grad:
        return "inplace_nonleaf"
    if target in b.args:
        return "inplace_nonleaf_argument"
    return "inplace_nonleaf_grad_scale" if op in ("mul_", "div_", "pow_") else "inplace_nonleaf_grad"


def _view_root(b, target):
    """The variable a view `target` views in the end (its base's base ...), or None when
    one of them is not known any more."""
    known = {v.name: v for v in (*b.args, *b.pool)}
    var = target
    while var.base is not None and var.base not in ("<input>", "<expanded>"):
        var = known.get(var.base)
        if var is None:
            return None
    return var


def _write_into_view(b, target, line: str, value_grad: bool) -> tuple[str, bool]:
    """The line of a write into the view `target` and whether it carries grad: under no_grad
    when its root is a leaf that requires grad (PyTorch refuses it otherwise)."""
    root = _view_root(b, target)
    if root.leaf and root.requires_grad:
        return f"with torch.no_grad():\n        {line}", False
    return line, value_grad or root.requires_grad


def _after_view_write(b, target, bits, grad: bool) -> None:
    """Update the model after a write into the view `target`: its root takes the new values;
    with grad, the root and the view are rebased (PyTorch's CopySlices) and the other views
    of the root are regenerated from its new history at their next use; other tensors
    sharing its memory (detached or contiguous() aliases) are not used any more."""
    root = _view_root(b, target)
    b.written.update((target.name, root.name))
    target.bits = exact_bits(target.dtype, bits)
    if grad:
        b.tags.append("inplace_on_view_grad")
        regenerated = _regenerated_views(b, root)
        keep = {target.name, root.name} | regenerated
        b.pool = [v for v in b.pool if v.name in keep or v.name not in b.aliases_of(target)]
        _take_grad(b, regenerated)
        target.requires_grad = root.requires_grad = True
        if root.leaf:  # (an input without grad: it joins the graph)
            root.leaf = False
            if root.name in b.leaves:
                b.leaves.remove(root.name)
    for v in b.pool:
        if v is not target and v.name in b.aliases_of(target):
            v.bits = None


def _regenerated_views(b, root) -> set[str]:
    """The variables that view `root` through view ops alone (not through a detached or a
    contiguous() alias, which may be a copy): after a write with grad of `root`, or through
    one of them, their history is regenerated from `root`'s new one."""
    known = {v.name: v for v in (*b.args, *b.pool)}
    found = set()
    for name in b.aliases_of(root):
        var = known.get(name)
        while var is not None and var.name not in b.detached_aliases and var.name not in b.contiguous_aliases:
            if var.base == root.name:
                found.add(name)
                break
            var = known.get(var.base) if var.base is not None else None
    return found


def _take_grad(b, names: set[str]) -> None:
    """The views `names` of a root written with grad require grad from now on (their
    regenerated history reads the root's)."""
    for v in b.pool:
        if v.name in names and v.is_float:
            v.requires_grad = True


def _patterns(b, target) -> list[str]:
    """The patterns an in-place write into `target` makes that decide known failures:
    other variables sharing its memory are live, or it is a leaf requiring grad that ops
    read before the write."""
    found = []
    if b.aliases_of(target) & {v.name for v in b.pool}:
        found.append("inplace_with_live_aliases")
    if target.leaf and target.requires_grad and target.name in b.used:
        found.append("inplace_grad_leaf_after_use")
    return found


def _pattern_allowed(b, target) -> bool:
    patterns = _patterns(b, target)
    if not all(b.allows(p) for p in patterns):
        return False
    b.tags.extend(patterns)
    return True


def _value_for(b, target, allow_tensor: bool = True):
    """(source, bits, requires_grad) of a value to write into `target`."""
    tensor = b.pick(lambda v: v.static and v is not target and broadcast(target.shape, v.shape) == target.shape
                    and v.dtype != "bool" and (target.is_float or v.dtype == "int64")
                    ) if allow_tensor and b.chance(0.5) else None
    if tensor is not None:
        return tensor.name, tensor.bits, tensor.requires_grad
    value = b.rng.choice([0.5, 2.0, -1.5, 0.25] if target.is_float else [1, 2, -3])
    return str(value), scalar_bits(value), False


def _after_write(b, target, bits, requires_grad: bool) -> None:
    """Update the model after an in-place write into `target`."""
    b.written.add(target.name)
    target.bits = exact_bits(target.dtype, bits)
    aliases = b.aliases_of(target)
    if requires_grad and not target.requires_grad and not target.leaf:
        target.requires_grad = True
        # Views taken before the write are regenerated from its new history at their next
        # use (as PyTorch does): they require grad now. Other tensors sharing its memory
        # (detached or contiguous() aliases) are not used any more.
        regenerated = _regenerated_views(b, target)
        b.pool = [v for v in b.pool if v.name not in aliases or v.name in regenerated]
        _take_grad(b, regenerated)
        for v in b.pool:
            if v.name in regenerated:
                v.bits = None
        return
    for v in b.pool:
        if v.name in aliases and (target.bits is None or v.bits is None):
            v.bits = None


def _target(b, predicate):
    """A variable to write in place: sometimes one whose write makes an interesting pattern
    (a leaf requiring grad that ops read, a variable with live aliases)."""
    if b.chance(0.3):
        pool = {v.name for v in b.pool}
        target = b.pick(lambda v: predicate(v) and ((v.leaf and v.requires_grad and v.name in b.used)
                                                    or bool(b.aliases_of(v) & pool)))
        if target is not None:
            return target
    return b.pick(predicate)


def inplace(b) -> bool:
    target = _target(b, lambda v: v.static and v.dtype != "bool")
    if target is None:
        return False
    op = b.rng.choice(["add_", "sub_", "mul_", "div_", "clamp_", "zero_", "fill_", "copy_", "pow_", "iadd"])
    if op in ("div_", "pow_") and not target.is_float:
        op = "add_"
    if op == "clamp_" and not target.exact:
        op = "add_"
    category = _inplace_category(b, target, op)
    if category is None:
        return False
    value, vbits, value_grad = _value_for(b, target, allow_tensor=op not in ("clamp_", "zero_", "fill_", "pow_"))
    if op in ("add_", "sub_", "iadd"):
        line = f"{target.name} += {value}" if op == "iadd" else f"{target.name}.{op}({value})"
        bits = add_bits(target.bits, vbits)
    elif op == "mul_":
        line, bits = f"{target.name}.mul_({value})", mul_bits(target.bits, vbits)
    elif op == "div_":
        divisor = "2" if b.chance(0.5) else guarded_value(b, value)
        line, bits = f"{target.name}.div_({divisor})", None
        value_grad = value_grad and divisor != "2"
    elif op == "pow_":
        line, bits = f"{target.name}.pow_(2)", mul_bits(target.bits, target.bits)
    elif op == "clamp_":
        low = -1 if target.dtype == "int64" else -0.5
        line, bits = f"{target.name}.clamp_(min={low})", target.bits
    elif op == "zero_":
        line, bits, value_grad = f"{target.name}.zero_()", (0, 0), False
    elif op == "fill_":
        line, bits, value_grad = f"{target.name}.fill_({value})", vbits, False
    else:
        line, bits = f"{target.name}.copy_({value})", vbits
    if category == "inplace_on_view":
        line, grad = _write_into_view(b, target, line, value_grad)
        if not b.allows(category) or not _pattern_allowed(b, target):
            return False
        b.emit(line, category)
        b.tags.append(op)
        _after_view_write(b, target, bits, grad)
        return True
    if target.leaf and (target.requires_grad or b.chance(0.5)):
        line = f"with torch.no_grad():\n        {line}"
        value_grad = False
    elif target.leaf and value_grad:
        if target.base is not None:
            return False  # eager tracegrad refuses a grad-carrying write into a view (documented)
        category = "inplace_argument_with_grad"
        if op in ("mul_", "div_", "pow_"):
            category = "inplace_nonleaf_grad_scale"  # (it becomes a non-leaf scaled by a grad value)
    elif category == "inplace_nonleaf" and value_grad and op in ("mul_", "div_", "pow_"):
        category = "inplace_nonleaf_grad_scale"  # (a scaling by a value that requires grad)
    if not b.allows(category) or not _pattern_allowed(b, target):
        return False
    if target.leaf and value_grad:  # (the argument becomes a non-leaf)
        target.leaf = False
        if target.name in b.leaves:
            b.leaves.remove(target.name)
    b.emit(line, category)
    b.tags.append(op)
    _after_write(b, target, bits, value_grad)
    return True


def guarded_value(b, value: str) -> str:
    var = next((v for v in b.pool if v.name == value), None)
    return guarded(var) if var is not None else value


def setitem(b) -> bool:
    target = _target(b, lambda v: v.static and v.ndim >= 1 and v.dtype != "bool")
    if target is None:
        return False
    category = _inplace_category(b, target, "setitem")
    if category is None or not b.allows(category) or not _pattern_allowed(b, target):
        return False
    kind = b.rng.choice(["basic", "basic", "mask", "index"])
    if kind == "mask":
        mask = b.pick(lambda v: v.dtype == "bool" and v.static and v.shape == target.shape)
        mask = mask or b.bool_input(target.shape)
        key, indexed = mask.name, ()
    elif kind == "index" and target.shape[0] > 1:
        rows = b.rng.sample(range(target.shape[0]), b.rng.randint(1, target.shape[0]))
        key, indexed = str(rows), (len(rows),) + target.shape[1:]
    else:
        items, indexed = _basic_key(b, target)
        key = ", ".join(items) if items else "..."
    # (Through index tensors PyTorch's index_put_ takes a tensor value of the target's dtype only.)
    value_var = b.pick(lambda v: v.static and v is not target and broadcast(indexed, v.shape) == indexed
                       and (target.is_float or v.dtype in ("int64", "bool"))
                       and (kind == "basic" or v.dtype == target.dtype))
    if value_var is not None and b.chance(0.5):
        value, vbits, value_grad = value_var.name, value_var.bits, value_var.requires_grad
    else:
        scalar = b.rng.choice([0.5, -1.0, 2.0] if target.is_float else [0, 3])
        value, vbits, value_grad = str(scalar), scalar_bits(scalar), False
    if not b.needs("size0_reduce", (0 in indexed or kind == "mask") and value_grad):
        return False  # (the value's gradient sums over the empty region)
    line = f"{target.name}[{key}] = {value}"
    if category == "inplace_on_view":
        line, grad = _write_into_view(b, target, line, value_grad)
        b.emit(line, category)
        b.tags.append(f"setitem_{kind}")
        _after_view_write(b, target, add_bits(target.bits, vbits), grad)
        return True
    if target.leaf and (target.requires_grad or b.chance(0.5)):
        line = f"with torch.no_grad():\n        {line}"
        value_grad = False
    elif target.leaf and value_grad:
        return False
    b.emit(line, category)
    b.tags.append(f"setitem_{kind}")
    _after_write(b, target, add_bits(target.bits, vbits), value_grad)
    return True


def detach_clone(b) -> bool:
    x = b.pick(lambda v: True)
    if x is None:
        return False
    kind = b.rng.choice(["detach", "clone", "contiguous", "detach_clone"])
    line = {"detach": f"{x.name}.detach()", "clone": b.rng.choice([f"{x.name}.clone()", f"torch.clone({x.name})"]),
            "contiguous": f"{x.name}.contiguous()", "detach_clone": f"{x.name}.detach().clone()"}[kind]
    grad = x.requires_grad and kind in ("clone", "contiguous")
    # (contiguous() returns x itself when x is contiguous, which size-1 dims can make any
    # layout: taken as an alias always)
    shares = kind in ("detach", "contiguous")
    out = b.result(x.shape, x.dtype, grad, x.bits, base=x.name if shares else None)
    if shares:
        b.note_alias(out, x)
    if kind == "detach":
        b.detached_aliases.add(out.name)
    if kind == "contiguous":
        b.contiguous_aliases.add(out.name)
    b.emit(f"{out.name} = {line}", kind, out)
    return True


def no_grad_block(b) -> bool:
    from .catalog import binary, unary_smooth
    if not b.rng.choice([binary, unary_smooth])(b):
        return False
    b.body[-1] = "    with torch.no_grad():\n    " + b.body[-1]
    b.pool[-1].requires_grad = False
    b.tags.append("no_grad")
    return True


def requires_grad_argument(b) -> bool:
    if not b.allows("requires_grad_argument"):
        return False
    x = b.pick(lambda v: v.leaf and v.is_float and not v.requires_grad and v.base in (None, "<input>", "<expanded>"))
    if x is None:
        return False
    b.emit(f"{x.name}.requires_grad_()", "requires_grad_argument")
    x.requires_grad = True
    return True


def custom_function(b) -> bool:
    if not b.allows("custom_function"):
        return False
    x = b.pick(lambda v: v.static and v.is_float)
    if x is None:
        return False
    y = b.pick(lambda v: v.static and v.shape == x.shape and v.dtype == x.dtype and v is not x)
    if y is not None and b.chance(0.5):
        b.functions.add("MulAdd")
        line, grad = f"MulAdd.apply({x.name}, {y.name}, 0.5)", x.requires_grad or y.requires_grad
    else:
        b.functions.add("Square")
        line, grad = f"Square.apply({x.name})", x.requires_grad
    out = b.result(x.shape, x.dtype, grad, None)
    b.emit(f"{out.name} = {line}", "custom_function", out)
    return True


def fresh_requires_grad(b) -> bool:
    """A new leaf inside the program (class 1 of issue 20): its .grad is an output."""
    x = b.pick(lambda v: v.static and v.is_float)
    kind = b.rng.choice(["constant", "detach"] if x is not None else ["constant"])
    feature = "fresh_requires_grad" if kind == "constant" else "detach_requires_grad"
    if not b.allows(feature):
        return False
    if kind == "constant":
        values = [b.rng.choice([-4.0, 0.5, 1.5]) for _ in range(b.rng.randint(1, 3))]
        line = b.rng.choice([f"torch.tensor({values}).requires_grad_()",
                             f"torch.tensor({values}).double().requires_grad_()"])
        shape, dtype = (len(values),), "float64" if ".double()" in line else "float32"
    else:
        line, shape, dtype = f"{x.name}.detach().requires_grad_()", x.shape, x.dtype
    out = b.result(shape, dtype, True, None)
    out.leaf = True
    b.emit(f"{out.name} = {line}", feature, out)
    b.fresh_leaves.append(out.name)
    return True


def item_and_branch(b) -> bool:
    x = b.pick(lambda v: v.static and v.exact and v.dtype != "bool" and v.numel)
    y = b.pick(lambda v: v.static and v.dtype != "bool")
    if x is None or y is None or not b.needs("realization_after_inplace", bool(b.written)):
        return False
    if b.chance(0.5):
        s = b.name("s")
        conversion = b.rng.choice([f"{x.name}.sum().item()", f"float({x.name}.sum())"])
        # (the sum of an integer or bool tensor is a Python int: y keeps an integer dtype)
        dtype = y.dtype if y.is_float else ("float32" if x.is_float else "int64")
        out = b.result(y.shape, dtype, y.requires_grad, None)
        b.emit(f"{s} = {conversion}\n    {out.name} = {y.name} * {s}", "item", out)
        return True
    out = b.result(y.shape, y.dtype, y.requires_grad, add_bits(y.bits, (1, 0)))
    b.emit(f"if ({x.name} > 0).any():\n        {out.name} = {y.name} * 2\n    else:\n"
           f"        {out.name} = {y.name} - 1", "branch", out)
    return True


def invalid_op(b) -> bool:
    """A statement that raises (shape mismatch, bad reshape, index out of range): eager and
    compiled must both raise."""
    x = b.pick(lambda v: v.static and v.ndim >= 1 and v.numel)
    if x is None:
        return False
    kind = b.rng.choice(["add", "reshape", "index", "matmul"])
    if kind == "add":
        line = f"{x.name} + torch.ones({x.shape[-1] + 1})"
    elif kind == "reshape":
        line = f"{x.name}.reshape({x.numel + 1})"
    elif kind == "index":
        line = f"{x.name}[{x.shape[0]}]"
    else:
        line = f"{x.name} @ torch.ones({x.shape[-1] + 2}, 2, dtype={'torch.' + x.dtype})"
    b.emit(f"{b.name()} = {line}", "invalid_op")
    return True


# --- argument layouts (from `catalog.make_inputs`) ---------------------------------------


def eager_history_input(b) -> None:
    """An argument with history recorded outside the program (class 13 of issue 20)."""
    from .generator import TORCH_DTYPE
    shape = b.sub_shape()
    dtype = b.main_dtype
    leaf = b.name("w")
    make = f"torch.tensor(grid(rng, {shape}), dtype={TORCH_DTYPE[dtype]}, requires_grad=True)"
    b.input_lines.append(f"    {leaf} = {make}")
    b.leaves.append(leaf)
    from .model import Var
    var = Var(b.name("h"), shape, dtype, requires_grad=True, leaf=False, bits=None)
    b.add_input(var, f"({leaf} * 1.5).tanh()", leaf=False)
    b.tags.append("eager_history_input")


def aliased_argument(b) -> None:
    """A second argument sharing memory with an earlier one (class 3 of issue 20)."""
    base = next((v for v in b.args if v.is_float and v.leaf and v.base is None and v.static and v.ndim >= 1), None)
    if base is None:
        return
    from .model import Var
    kind = b.rng.choice(["same", "transposed", "overlap"] if base.ndim >= 2 else ["same", "overlap"])
    if kind == "overlap" and base.shape[0] < 2:
        kind = "same"
    if not b.needs("eager_history_input", base.requires_grad and kind != "same"):
        return  # (a view of a leaf requiring grad is an argument with history)
    if kind == "same":
        make, shape = base.name, base.shape
    elif kind == "transposed":
        make, shape = f"{base.name}.transpose(-1, -2)", base.shape[:-2] + (base.shape[-1], base.shape[-2])
    else:
        make, shape = f"{base.name}[1:]", (base.shape[0] - 1,) + base.shape[1:]
    var = Var(b.name("v"), shape, base.dtype, requires_grad=base.requires_grad, leaf=kind == "same" or not
              base.requires_grad, base=base.name, bits=base.bits, contiguous=kind != "transposed")
    b.add_input(var, make, leaf=False)
    b.note_alias(var, base)
    b.tags.append("aliased_arguments")
    b.aliased_pairs.append((base, var))


def write_then_read_alias(b) -> bool:
    """The pattern of class 3: write one of two arguments sharing memory, read the other."""
    if not b.aliased_pairs:
        return False
    base, alias = b.rng.choice(b.aliased_pairs)
    if base.dtype != "float32" and base.dtype != "float64" or alias not in b.pool:
        return False
    write = f"{base.name}.add_(1)"
    if base.requires_grad:
        write = f"with torch.no_grad():\n        {write}"
    out = b.result(alias.shape, alias.dtype, alias.requires_grad, None)
    b.emit(f"{write}\n    {out.name} = {alias.name} * 2", "aliased_write_read", out)
    b.written.add(base.name)
    base.bits = alias.bits = None
    return True
