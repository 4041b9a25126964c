"""micrograd against tracegrad: micrograd's scalar autograd engine and its test suite, which
runs each expression through micrograd and through torch and compares the values and the
gradients; here tracegrad is the torch.

Source: karpathy/micrograd (commit c911406e5ace8742e5841a7e0df113ecb5d54685, 2020-04-18):
micrograd/engine.py (verbatim) and test/test_engine.py (its two tests, each split into its
micrograd half and its torch half, with the comparisons in `check`).
Ported: `import tracegrad as torch`; the engine is in this file; the inputs, fixed in the
tests (x = -4.0; a = -4.0, b = 2.0), are those at step 0 and drawn from a NumPy generator
at later steps; each torch half is a function of its leaf tensors so it can be compiled.
There is no training: a step evaluates both tests, and its "losses" are the compared
quantities, five per step: test_sanity_check's y and x.grad, test_more_ops' g, a.grad and
b.grad (the PyTorch run then compares tracegrad with torch directly).
"""

import time

import numpy as np

import tracegrad as torch

STEPS = 4
COMPILED_RTOL = 1e-12
TORCH_RTOL = 1e-12

# -----------------------------------------------------------------------------
# micrograd/engine.py
class Value:
    """ stores a single scalar value and its gradient """

    def __init__(self, data, _children=(), _op=''):
        self.data = data
        self.grad = 0
        # internal variables used for autograd graph construction
        self._backward = lambda: None
        self._prev = set(_children)
        self._op = _op # the op that produced this node, for graphviz / debugging / etc

    def __add__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        out = Value(self.data + other.data, (self, other), '+')

        def _backward():
            self.grad += out.grad
            other.grad += out.grad
        out._backward = _backward

        return out

    def __mul__(self, other):
        other = other if isinstance(other, Value) else Value(other)
        out = Value(self.data * other.data, (self, other), '*')

        def _backward():
            self.grad += other.data * out.grad
            other.grad += self.data * out.grad
        out._backward = _backward

        return out

    def __pow__(self, other):
        assert isinstance(other, (int, float)), "only supporting int/float powers for now"
        out = Value(self.data**other, (self,), f'**{other}')

        def _backward():
            self.grad += (other * self.data**(other-1)) * out.grad
        out._backward = _backward

        return out

    def relu(self):
        out = Value(0 if self.data < 0 else self.data, (self,), 'ReLU')

        def _backward():
            self.grad += (out.data > 0) * out.grad
        out._backward = _backward

        return out

    def backward(self):

        # topological order all of the children in the graph
        topo = []
        visited = set()
        def build_topo(v):
            if v not in visited:
                visited.add(v)
                for child in v._prev:
                    build_topo(child)
                topo.append(v)
        build_topo(self)

        # go one variable at a time and apply the chain rule to get its gradient
        self.grad = 1
        for v in reversed(topo):
            v._backward()

    def __neg__(self): # -self
        return self * -1

    def __radd__(self, other): # other + self
        return self + other

    def __sub__(self, other): # self - other
        return self + (-other)

    def __rsub__(self, other): # other - self
        return other + (-self)

    def __rmul__(self, other): # other * self
        return self * other

    def __truediv__(self, other): # self / other
        return self * other**-1

    def __rtruediv__(self, other): # other / self
        return other * self**-1

    def __repr__(self):
        return f"Value(data={self.data}, grad={self.grad})"

# -----------------------------------------------------------------------------
# test/test_engine.py

def sanity_check_micrograd(x):
    x = Value(x)
    z = 2 * x + 2 + x
    q = z.relu() + z * x
    h = (z * z).relu()
    y = h + q + q * x
    y.backward()
    xmg, ymg = x, y
    return xmg, ymg

def sanity_check_torch(x):
    z = 2 * x + 2 + x
    q = z.relu() + z * x
    h = (z * z).relu()
    y = h + q + q * x
    y.backward()
    return y

def more_ops_micrograd(a, b):
    a = Value(a)
    b = Value(b)
    c = a + b
    d = a * b + b**3
    c += c + 1
    c += 1 + c + (-a)
    d += d * 2 + (b + a).relu()
    d += 3 * d + (b - a).relu()
    e = c - d
    f = e**2
    g = f / 2.0
    g += 10.0 / f
    g.backward()
    amg, bmg, gmg = a, b, g
    return amg, bmg, gmg

def more_ops_torch(a, b):
    c = a + b
    d = a * b + b**3
    c = c + c + 1
    c = c + 1 + c + (-a)
    d = d + d * 2 + (b + a).relu()
    d = d + 3 * d + (b - a).relu()
    e = c - d
    f = e**2
    g = f / 2.0
    g = g + 10.0 / f
    g.backward()
    return g


def leaf(value):
    x = torch.Tensor([value]).double()
    x.requires_grad = True
    return x


def main(steps=STEPS, compiled=False, init=None):
    if init is None:
        rng = np.random.default_rng(0)
        # the tests' inputs, then random ones: x, a, b per step (float32 numbers, since the
        # torch halves build their leaves with torch.Tensor([...]), a float32 tensor)
        drawn = rng.uniform(-5.0, 5.0, size=(steps - 1, 3)).astype(np.float32)
        inputs = np.concatenate([[[-4.0, -4.0, 2.0]], drawn.astype(np.float64)])
    else:
        inputs = init["inputs"]
    sanity, more_ops = sanity_check_torch, more_ops_torch
    if compiled:
        sanity, more_ops = torch.compile(sanity), torch.compile(more_ops)
    losses, seconds, micrograd = [], [], []
    for x0, a0, b0 in inputs[:steps]:
        x, a, b = leaf(x0), leaf(a0), leaf(b0)
        start_time = time.perf_counter()
        y = sanity(x)
        g = more_ops(a, b)
        xpt, ypt, apt, bpt, gpt = x, y, a, b, g
        losses += [ypt.data.item(), xpt.grad.item(), gpt.data.item(), apt.grad.item(), bpt.grad.item()]
        seconds.append(time.perf_counter() - start_time)
        xmg, ymg = sanity_check_micrograd(float(x0))
        amg, bmg, gmg = more_ops_micrograd(float(a0), float(b0))
        micrograd += [ymg.data, xmg.grad, gmg.data, amg.grad, bmg.grad]
    return {"losses": losses, "init": {"inputs": np.asarray(inputs)}, "step_seconds": seconds,
            "micrograd": micrograd}


def check(result):
    for step in range(len(result["losses"]) // 5):
        ypt, xpt_grad, gpt, apt_grad, bpt_grad = result["losses"][5 * step:5 * step + 5]
        ymg, xmg_grad, gmg, amg_grad, bmg_grad = result["micrograd"][5 * step:5 * step + 5]

        # forward pass went well
        assert ymg == ypt
        # backward pass went well
        assert xmg_grad == xpt_grad

        tol = 1e-6
        # forward pass went well
        assert abs(gmg - gpt) < tol
        # backward pass went well
        assert abs(amg_grad - apt_grad) < tol
        assert abs(bmg_grad - bpt_grad) < tol
