"""Tracing a donated step with native kernels: each custom call's result shapes come
from its inputs, so the trace never traces XLA's version of the rule for them (that
cost a few milliseconds per leaf)."""

import jax
import jax.numpy as jnp
import pytest

import eqxopt
from eqxopt._native import _build, _fused


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
