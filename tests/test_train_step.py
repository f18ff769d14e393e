"""Whole train steps (forward, backward and the optimizer step in one `jit`): the
donated step writes every weight in place with no copy, and the train-step helper."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import eqxopt
from helpers import assert_trees_close


class Block(eqx.Module):
    """A transformer block: attention's query, key and value projections all read the
    same input, so the backward pass reads each weight in three parallel branches."""

    ln: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, width: int, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.ln = eqx.nn.LayerNorm(width)
        self.attn = eqx.nn.MultiheadAttention(4, width, key=k1)
        self.up = eqx.nn.Linear(width, 2 * width, key=k2)
        self.down = eqx.nn.Linear(2 * width, width, key=k3)

    def __call__(self, x):
        h = jax.vmap(self.ln)(x)
        x = x + self.attn(h, h, h)
        return x + jax.vmap(lambda v: self.down(jax.nn.gelu(self.up(v))))(x)


def small_model(width: int = 256):
    # Width 256: the weights are large enough for a kernel call each; the norms
    # and biases share calls.
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return [
        eqx.nn.Linear(8, width, key=k1),
        Block(width, k2),
        Block(width, k3),
        eqx.nn.Linear(width, 1, key=k3),
    ]


def loss_fn(model, x, y):
    h = jax.vmap(model[0])(x)
    for block in model[1:-1]:
        h = block(h)
    return jnp.mean((jax.vmap(model[-1])(h) - y) ** 2)


def batch():
    x = jax.random.normal(jax.random.key(1), (6, 8))
    return x, jnp.sin(x[:, :1])


def copies_of_inputs(hlo: str) -> list[str]:
    """Copies in an optimized HLO module of an entry parameter (or of such a copy)."""
    inputs = set(re.findall(r"(%\S+) = \S+ parameter\(", hlo))
    found = []
    for name, shape, operand in re.findall(
        r"(%\S+) = (\S+?)\{[^}]*\} copy\((%[^)]+)\)", hlo
    ):
        if operand in inputs:
            inputs.add(name)
            found.append(f"{shape} copy({operand})")
    return found


def fresh(tree):
    """Own buffers for every array (a donated step consumes its inputs)."""
    return jax.tree.map(lambda v: jnp.copy(v) if eqx.is_array(v) else v, tree)


def hand_written_step(opt):
    @eqx.filter_jit(donate="all-except-first")
    def step(opt, model, state, x, y):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        model, state = opt.step(grads, state, model, donate=True)
        return model, state, loss

    return step


@pytest.mark.parametrize(
    "opt",
    [eqxopt.AdamW(1e-3), eqxopt.SGD(1e-2, momentum=0.9)],
    ids=["AdamW", "SGD-momentum"],
)
def test_donated_train_step_copies_no_weight(opt):
    """The in-place writes of the native kernels come after every read of the
    weights in the backward pass, so XLA keeps no copy of any of them (it did: a
    full copy of every weight matrix, from reads such as `dx = dy @ w.T` that nothing
    ordered before the write)."""
    assert eqxopt.native_kernels_available()
    model, (x, y) = small_model(), batch()
    state = opt.init(model)
    step = hand_written_step(opt)
    compiled = step.lower(opt, model, state, x, y).compile()
    text = compiled.compiled.as_text()
    assert "eqxopt_elementwise" in text
    assert copies_of_inputs(text) == []
    # The same numbers as XLA's own code.
    got = step(opt, *fresh((model, state)), x, y)
    eqxopt.set_native_kernels(False)
    try:
        expected = hand_written_step(opt)(opt, model, state, x, y)
    finally:
        eqxopt.set_native_kernels(True)
    assert_trees_close(got, expected, rtol=1e-5, atol=1e-6)
