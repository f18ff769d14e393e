"""Tracing a donated step with native kernels: each custom call's result shapes come
from its inputs, so the trace never traces XLA's version of the rule for them (that
cost a few milliseconds per leaf), and a step of gradients passed in as arrays
orders its calls after none of them (each wait is a kernel for XLA to compile)."""

import jax
import jax.numpy as jnp
import pytest

import eqxopt
from helpers import assert_trees_close

# The native backend's own tests: skipped where the kernels are not available.
pytestmark = pytest.mark.needs_compiler

_build = pytest.importorskip("eqxopt._native._build")
_fused = pytest.importorskip("eqxopt._native._fused")


@pytest.mark.parametrize(
    "storage, target",
    [
        (None, _build.ELEMENTWISE_TARGET),
        (eqxopt.Blockwise8bit(), _build.QUANTIZED_TARGET),
        (eqxopt.Blockwise4bit(), _build.QUANTIZED_TARGET),
    ],
)
def test_tracing_a_donated_step_does_not_trace_the_reference(
    needs_compiler, monkeypatch, storage, target
):
    # Shapes no other test uses, so that no cached abstract evaluation hides a call.
    params = {"w": jnp.ones((263, 257)), "b": jnp.ones(263), "s": jnp.ones((3, 5))}
    grads = jax.tree.map(lambda x: x * 0.5, params)
    opt = eqxopt.AdamW(1e-3, weight_decay=0.1, mu_dtype=storage, nu_dtype=storage)
    state = opt.init(params)
    calls = []
    reference = _fused.reference

    def counted(*args, **kwargs):
        calls.append(1)
        return reference(*args, **kwargs)

    monkeypatch.setattr(_fused, "reference", counted)
    jaxpr = jax.make_jaxpr(lambda g, s, p: opt.step(g, s, p, donate=True))(
        grads, state, params
    )
    assert target in str(jaxpr)  # the native calls are there
    assert calls == []
    # The step's results keep the shapes and dtypes of the parameters and state.
    new_params, new_state = opt.step(grads, state, params, donate=True)
    for new, old in ((new_params, params), (new_state, state)):
        assert jax.tree.map(lambda x: (x.shape, x.dtype), new) == jax.tree.map(
            lambda x: (x.shape, x.dtype), old
        )


def test_kernels_wait_only_for_gradients_the_program_computes(
    needs_compiler, monkeypatch
):
    # A step of gradients passed in as arrays is a program of its own: nothing in it
    # computes them, so its kernels wait for none (no `order_after` slices to
    # compile). Inside a trace that computes the gradients they still wait.
    params = {"w": jnp.ones((271, 269)), "b": jnp.ones(271), "c": jnp.ones(269)}
    grads = jax.tree.map(lambda x: x * 0.5, params)
    opt = eqxopt.AdamW(1e-3, weight_decay=0.1)
    waits = []
    order_after = _fused.order_after

    def counted(x):
        waits.append(1)
        return order_after(x)

    monkeypatch.setattr(_fused, "order_after", counted)
    copy = lambda tree: jax.tree.map(lambda x: jnp.array(x, copy=True), tree)  # noqa: E731
    got = opt.step(grads, opt.init(params), copy(params), donate=True)
    assert waits == []

    def step(p, s, g):
        return opt.step(g, s, p, donate=True)

    in_jit = jax.jit(step, donate_argnums=(0, 1))(copy(params), opt.init(params), grads)
    assert waits
    assert_trees_close(got, in_jit, rtol=0, atol=0)
