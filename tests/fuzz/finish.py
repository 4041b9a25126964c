"""The end of a generated program: a scalar loss over results that require grad, its
backward (`backward()`, `autograd.grad`, twice with `retain_graph`, or a non-scalar backward
with an explicit gradient), and the list of tensors `program` returns."""

from __future__ import annotations


def _terms(b) -> list:
    return [v for v in b.pool if v.requires_grad and v.is_float and v.static
            and (v.numel or b.allows("size0_reduce"))]


def _piece(b, v) -> str:
    """A scalar of `v` for the loss: a plain sum or mean of exact values only (a sum of
    inexact values may cancel to rounding noise, as layer_norm's outputs do). Inexact
    values enter squared with weights that differ by position: the plain sum of squares of
    a normalization's output is constant (each group's squares sum to its size), so its
    gradient is rounding noise alone (fuzz seeds 43000277, 53007257)."""
    b.needs("size0_reduce", not v.numel)  # (terms are chosen so that it holds)
    if not v.exact:
        return f"(({v.name} * {v.name}).flatten() * torch.linspace(0.5, 1.5, {v.numel})).sum() * 0.5"
    options = [f"({v.name} * {v.name}).sum() * 0.5"]
    if v.numel:
        options += [f"({v.name} * {v.name}).mean()", f"{v.name}.mean()"]
    return b.rng.choice(options + [f"{v.name}.sum()"])


def _from_updated_leaf_allowed(b, v) -> bool:
    """A backward rooted at a leaf written in place is the feature `backward_from_updated_leaf`."""
    if not (v.leaf and v.name in b.written):
        return True
    if not b.allows("backward_from_updated_leaf"):
        return False
    b.tags.append("backward_from_updated_leaf")
    return True


# Optimizer updates whose values follow the gradients smoothly: a gradient that is rounding
# noise in one mode and zero in another moves the parameter by noise (Adam and Adagrad divide
# by the gradient's size: their eps is large here for that).
OPTIMIZERS = ("torch.optim.SGD({}, lr=0.25)",
              "torch.optim.SGD({}, lr=0.25, momentum=0.5, weight_decay=0.125)",
              "torch.optim.SGD({}, lr=0.25, momentum=0.5, nesterov=True)",
              "torch.optim.Adam({}, lr=0.25, eps=0.5)",
              "torch.optim.Adadelta({})",
              "torch.optim.Adagrad({}, lr=0.25, eps=0.5)")


def _optimizer_steps(b) -> None:
    """Two steps of an optimizer over the arguments that are plain leaves with grad (after
    `loss.backward()`): the arguments `program` leaves are then its updated parameters."""
    params = [v.name for v in b.args if v.leaf and v.requires_grad and v.dtype in ("float32", "float64")
              and v.base is None and v.static and v.name not in b.written and not b.aliases.get(v.name)
              and v.name not in b.contiguous_aliases and v.name not in b.detached_aliases]
    if not params or not b.chance(0.25) or not b.needs("optimizer_step"):
        return
    optimizer = b.rng.choice(OPTIMIZERS).format("[" + ", ".join(params) + "]")
    b.emit(f"optimizer = {optimizer}\n    optimizer.step()\n    optimizer.step()", "optimizer_step",
           checked=False)
    b.written.update(params)


def loss_and_outputs(b) -> list[str]:
    """Emit the loss and backward; the names (expressions) `program` returns."""
    args = {v.name for v in b.args}
    returned = [v.name for v in b.pool if v.name not in args][-5:]
    terms = _terms(b)
    if not terms:
        return returned
    recent = terms[-4:]
    chosen = b.rng.sample(recent, min(len(recent), b.rng.randint(1, 3)))
    updated = [v for v in terms if v.leaf and v.name in b.written and v.ndim]
    if updated and b.chance(0.3):  # (a backward from it is `backward_from_updated_leaf`)
        chosen.insert(0, b.rng.choice(updated))
    chosen += [v for v in terms if v.name in b.fresh_leaves and v not in chosen]
    retained = None
    if b.allows("retain_grad") and b.chance(0.15):
        candidates = [v for v in terms if not v.leaf]
        if candidates:
            retained = b.rng.choice(candidates)
            b.emit(f"{retained.name}.retain_grad()", "retain_grad", checked=False)
    b.emit("loss = " + " + ".join(_piece(b, v) for v in chosen), "loss", checked=False)
    kind = b.rng.choices(["backward", "autograd_grad", "backward_twice", "backward_gradient"], [65, 15, 10, 10])[0]
    if chosen[0].leaf and chosen[0].name in b.written and b.chance(0.5):
        kind = "backward_gradient"
    targets = [v.name for v in b.args if v.requires_grad]
    if kind == "autograd_grad" and targets:
        b.emit(f"grads = torch.autograd.grad(loss, [{', '.join(targets)}], allow_unused=True)", kind, checked=False)
        returned.append("*grads")
    elif kind == "backward_twice":
        b.emit("loss.backward(retain_graph=True)\n    loss.backward()", kind, checked=False)
    elif kind == "backward_gradient" and chosen[0].ndim and _from_updated_leaf_allowed(b, chosen[0]):
        v = chosen[0]
        b.emit(f"{v.name}.backward(torch.ones_like({v.name}))", kind, checked=False)
    else:
        b.emit("loss.backward()", "backward", checked=False)
        _optimizer_steps(b)
    returned.append("loss")
    if retained is not None:
        returned.append(f"{retained.name}.grad")
    returned.extend(f"{name}.grad" for name in b.fresh_leaves)
    return returned
