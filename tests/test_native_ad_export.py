"""With the native kernels on: every mode of differentiation through
`Packed.unpack()`, and `jax.export` of packed losses and donated steps (exported
programs take XLA's code, serialize, and give the same numbers)."""

import jax
import jax.numpy as jnp
import pytest

import eqxopt
from catalog import swept
from helpers import assert_trees_close
from test_catalog import extra_for
from test_native import with_native
from test_native_special import ELEMENTWISE

# The native backend's own tests: skipped where the kernels are not available.
pytestmark = pytest.mark.needs_compiler


def tree():
    return {
        "a": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3),
        "b": jnp.arange(3.0) - 1.0,
        "s": jnp.float32(0.5),
        "act": jax.nn.relu,  # not an array: kept outside the buffers
    }


def loss(packed):
    t = packed.unpack()
    return (
        jnp.sum(jnp.sin(t["a"]) ** 2)
        + jnp.sum(t["b"] ** 3) * t["s"]
        + jnp.sum(t["act"](t["a"][0]) * t["b"])
    )


def tangent(packed, phase=0.0):
    return jax.tree.map(
        lambda b: jnp.cos(jnp.arange(b.size, dtype=b.dtype) + phase), packed
    )


MODES = {
    "grad": lambda p: jax.grad(loss)(p),
    "jvp": lambda p: jax.jvp(loss, (p,), (tangent(p),)),
    "linearize": lambda p: jax.linearize(loss, p)[1](tangent(p)),
    "hvp": lambda p: jax.jvp(jax.grad(loss), (p,), (tangent(p),))[1],
    "grad-of-grad": lambda p: jax.grad(lambda q: third(q, p))(p),
    "hessian": lambda p: jax.hessian(loss)(p),
    "vmap-jvp": lambda p: jax.vmap(lambda t: jax.jvp(loss, (p,), (t,))[1])(
        jax.tree.map(lambda *x: jnp.stack(x), tangent(p), tangent(p, 1.0))
    ),
}


@pytest.mark.parametrize("mode", MODES, ids=list(MODES))
def test_every_derivative_through_unpack_matches_xla(mode):
    packed = eqxopt.pack(tree())

    def run():
        # A function of one's own, jitted now, is traced with the kernels as they
        # are now (one jitted before keeps the code it was traced with).
        fn = jax.jit(lambda p: MODES[mode](p))
        assert ("eqxopt_split" in fn.lower(packed).as_text()) == (
            eqxopt.native_kernels_available()
        )
        return fn(packed)

    native = with_native(True, run)
    xla = with_native(False, run)
    assert_trees_close(native, xla, rtol=1e-6, atol=1e-6)


def third(q, p):
    """A scalar of the gradient, to differentiate again."""
    g = jax.grad(loss)(q)
    return sum(jnp.vdot(x, y) for x, y in zip(g.buffers, tangent(p).buffers))


def export_round_trip(fn, *args):
    """`fn` exported, serialized and deserialized; with the custom calls' targets."""
    exported = jax.export.export(jax.jit(fn))(*args)
    text = exported.mlir_module()
    back = jax.export.deserialize(exported.serialize())
    return back, text


def test_export_of_a_packed_loss_serializes():
    packed = eqxopt.pack(tree())
    layout = packed.layout

    def fn(buffers):
        packed = eqxopt.Packed(buffers, layout)
        return loss(packed), jax.grad(loss)(packed).buffers

    assert "eqxopt_split" in jax.jit(fn).lower(packed.buffers).as_text()
    back, text = export_round_trip(fn, packed.buffers)
    assert "eqxopt_" not in text
    assert_trees_close(back.call(packed.buffers), jax.jit(fn)(packed.buffers))


@pytest.mark.needs_compiler
@pytest.mark.parametrize("case", swept(ELEMENTWISE))
def test_export_of_a_donated_step_serializes(case):
    params = {"w": jnp.linspace(-1.0, 1.0, 8), "b": jnp.full((2, 3), 0.5)}
    grads = jax.tree.map(lambda x: jnp.cos(3 * x), params)
    opt = case.make()
    extra = extra_for(
        case, lambda p: sum(jnp.sum(x**2) for x in jax.tree.leaves(p)), params
    )
    leaves, treedef = jax.tree.flatten((params, opt.init(params), grads))

    def step(*leaves):
        params, state, grads = jax.tree.unflatten(treedef, leaves)
        return jax.tree.leaves(opt.step(grads, state, params, donate=True, **extra))

    assert "eqxopt_elementwise" in jax.jit(step).lower(*leaves).as_text()
    back, text = export_round_trip(step, *leaves)
    assert "eqxopt_" not in text
    fresh = [jnp.array(x, copy=True) for x in leaves]
    assert_trees_close(back.call(*leaves), jax.jit(step)(*fresh), rtol=2e-6, atol=1e-7)
