"""The program of a packed train step on XLA's path (what GPUs and TPUs run, and the
CPU with the native kernels off) grows linearly with the leaf count, and on the CPU
compiles no more kernels for more leaves of the same shape.

The gradient of cutting a packed buffer into its leaves must be one concatenation
(the transpose of one split). The gradient of separate slices pads a zero buffer of
the whole packed size per leaf, so such a step makes N full-size buffers for N
leaves: its work grows with the square of the leaf count.

XLA:CPU compiles one kernel per distinct fusion and reuses identical ones: the
leaves of one shape must be cut by one kernel, as the tree's leaves of one shape
share theirs, or a packed step compiles a kernel more per leaf than the tree.
"""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt

WIDTH = 8
# A StableHLO tensor type: its dimensions ("64x8x") and element type.
TENSOR = re.compile(r"tensor<((?:\d+x)*)[a-z]\w*>")
# In compiled HLO text: a computation's first line, a fusion's computation, a name.
COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$")
FUSED = re.compile(r"\bfusion\(.*?calls=%?([\w.\-]+)")
NAME = re.compile(r"%[\w.\-]+")


class Layers(eqx.Module):
    layers: list

    def __init__(self, n: int, key):
        self.layers = [
            eqx.nn.Linear(WIDTH, WIDTH, use_bias=False, key=k)
            for k in jax.random.split(key, n)
        ]

    def __call__(self, x):
        for layer in self.layers:
            x = jnp.tanh(layer(x))
        return x


def loss_fn(model, x):
    return jnp.mean(jax.vmap(model)(x) ** 2)


@pytest.fixture
def xla_path():
    eqxopt.set_native_kernels(False)
    yield
    eqxopt.set_native_kernels(True)


def packed_step(n_leaves: int):
    """The lowered train step of a packed model of `n_leaves` 8 x 8 matrices."""
    model = eqxopt.pack(Layers(n_leaves, jax.random.key(0)))
    opt = eqxopt.AdamW(1e-3, weight_decay=1e-2)
    step = eqxopt.make_train_step(loss_fn, opt)
    return step.lower(model, opt.init(model), jnp.ones((4, WIDTH)))


def elements_made(stablehlo: str) -> int:
    """The elements of every result of every operation in a StableHLO program: the
    bytes it writes, in elements."""
    total = 0
    for line in stablehlo.splitlines():
        if " = " not in line or " : " not in line:
            continue
        results = line.rsplit(" : ", 1)[1].split("->")[-1]
        for dims in TENSOR.findall(results):
            sizes = [int(d) for d in dims.split("x") if d]
            total += int(np.prod(sizes, dtype=np.int64))
    return total


def fusion_kernels(hlo: str) -> set[str]:
    """The distinct fusions of a compiled HLO program (each the kernel XLA compiles
    for it): each fused computation's instructions, names numbered in order of
    appearance and metadata left out, so that equal fusions compare equal."""
    bodies: dict[str, list[str]] = {}
    name, body = None, []
    for line in hlo.splitlines():
        if name is None:
            header = COMPUTATION.match(line)
            if header:
                name, body = header.group(1), []
        elif line == "}":
            bodies[name], name = body, None
        else:
            body.append(line)

    def canonical(lines: list[str]) -> str:
        names: dict[str, str] = {}
        out = []
        for line in lines:
            line = re.sub(r", metadata=\{[^}]*\}", "", line.strip())
            out.append(
                NAME.sub(lambda m: names.setdefault(m[0], f"%{len(names)}"), line)
            )
        return "\n".join(out)

    return {canonical(bodies[called]) for called in set(FUSED.findall(hlo))}


@pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="XLA:CPU's reuse of identical kernels"
)
def test_packed_step_on_xla_compiles_no_kernel_per_leaf(xla_path):
    kernels = {n: fusion_kernels(packed_step(n).compile().as_text()) for n in (16, 32)}
    # Sixteen more layers of the same shape: no more kernels, as for the tree (one
    # slice at a constant offset per leaf would be 16 more).
    assert len(kernels[32]) == len(kernels[16]), (
        f"{len(kernels[16])} distinct fusions for 16 layers, {len(kernels[32])} for 32"
    )


def test_packed_step_on_xla_grows_linearly_with_the_leaves(xla_path):
    made = {n: elements_made(packed_step(n).as_text()) for n in (20, 40, 80)}
    # Twice the leaves, twice the work (plus a constant part); one full-size pad
    # per leaf would make each doubling cost three to four times as much.
    assert made[40] / made[20] < 2.2, made
    assert made[80] / made[40] < 2.2, made


def test_packed_step_on_xla_pads_no_full_size_buffer(xla_path):
    n_leaves = 40
    size = n_leaves * WIDTH * WIDTH
    compiled = packed_step(n_leaves).compile().as_text()
    pads = re.findall(rf"= f32\[{size}\]\S* pad\(", compiled)
    assert pads == [], f"{len(pads)} pads of the whole packed buffer"
    # The compiled step still reads and writes the packed buffer (the pattern
    # above matches its type).
    assert f"f32[{size}]" in compiled
