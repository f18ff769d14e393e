"""Transforms and helpers ported from optax (issue 28), each against optax's own
numbers over many steps."""

import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from helpers import (
    assert_histories_close,
    grad_stream,
    nested_tree,
    run_eqxopt,
    run_optax,
)

optax = pytest.importorskip("optax")

STEPS = 30


# ------------------------------------------------------------------------ EMA


@pytest.mark.parametrize("debias", [True, False])
def test_ema_matches_optax(debias):
    params = nested_tree()
    grads = list(grad_stream(params, STEPS))
    expected = run_optax(
        optax.chain(optax.ema(0.8, debias), optax.scale(-0.05)), params, grads
    )
    actual = run_eqxopt(
        eqxopt.Chain(eqxopt.EMA(0.8, debias), eqxopt.ScaleByLearningRate(0.05)),
        params,
        grads,
    )
    assert_histories_close(actual, expected)


def test_ema_accumulator_dtype_matches_optax():
    params = nested_tree()
    grads = list(grad_stream(params, STEPS))
    expected = run_optax(
        optax.chain(optax.ema(0.9, accumulator_dtype=jnp.bfloat16), optax.scale(-0.05)),
        params,
        grads,
    )
    opt = eqxopt.Chain(
        eqxopt.EMA(0.9, ema_dtype=jnp.bfloat16), eqxopt.ScaleByLearningRate(0.05)
    )
    # optax multiplies the bfloat16 average by `decay` in bfloat16, eqxopt in
    # float32 before rounding once: bfloat16 roundings (2**-8) apart.
    assert_histories_close(
        run_eqxopt(opt, params, grads), expected, rtol=1e-2, atol=5e-3
    )
    # eqxopt's own rule exactly: the float32 average, rounded to bfloat16 to store.
    state = opt.init(params)
    ema = np.zeros(4, np.float32)
    for t, g in enumerate(grads, start=1):
        updates, state = opt.update(g, state, params)
        g = np.asarray(g["dense"]["b"])
        new = np.float32(0.9) * ema + np.float32(0.1) * g
        expected_u = -0.05 * new / (1 - np.float32(0.9) ** t)
        np.testing.assert_allclose(
            updates["dense"]["b"], expected_u, rtol=1e-5, atol=1e-7
        )
        ema = np.asarray(jnp.asarray(new).astype(jnp.bfloat16).astype(jnp.float32))
        assert state["EMA"].ema["dense"]["b"].dtype == jnp.bfloat16
        np.testing.assert_array_equal(
            state["EMA"].ema["dense"]["b"].astype(jnp.float32), ema
        )


def test_ema_refuses_bad_arguments():
    with pytest.raises(ValueError, match="decay"):
        eqxopt.EMA(1.0)
    with pytest.raises(ValueError, match="decay"):
        eqxopt.EMA(-0.1)
    with pytest.raises(TypeError, match="accumulator_dtype=: use ema_dtype="):
        eqxopt.EMA(0.9, accumulator_dtype=jnp.float32)
