"""The composable building blocks (`ScaleByAdam`, `Trace`, ...) against optax's,
and `AdamW` as a chain of them."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from helpers import (
    assert_histories_close,
    assert_moved,
    compiles,
    grad_stream,
    nested_tree,
    run_eqxopt,
    run_optax,
)

optax = pytest.importorskip("optax")

STEPS = 30


def _double_big(updates, params):
    # a module-level function: the same static value for every Stateless built
    return jax.tree.map(lambda u, p: u * 2.0 + 0.1 * p, updates, params)


CASES = [
    ("adam", lambda: eqxopt.ScaleByAdam(0.8, 0.95, 1e-6, eps_root=1e-9),
     lambda: optax.scale_by_adam(0.8, 0.95, 1e-6, eps_root=1e-9)),
    ("adam-nesterov", lambda: eqxopt.ScaleByAdam(nesterov=True),
     lambda: optax.scale_by_adam(nesterov=True)),
    ("rms", lambda: eqxopt.ScaleByRms(0.9, 1e-6, initial_scale=0.5),
     lambda: optax.scale_by_rms(0.9, 1e-6, initial_scale=0.5)),
    ("rms-corrected", lambda: eqxopt.ScaleByRms(0.8, 1e-6, eps_in_sqrt=False,
                                                bias_correction=True),
     lambda: optax.scale_by_rms(0.8, 1e-6, eps_in_sqrt=False, bias_correction=True)),
    ("sign", eqxopt.ScaleBySign, optax.scale_by_sign),
    ("trust-ratio", lambda: eqxopt.ScaleByTrustRatio(0.1, 0.5, 1e-3),
     lambda: optax.scale_by_trust_ratio(0.1, 0.5, 1e-3)),
    ("trace", lambda: eqxopt.Trace(0.9), lambda: optax.trace(0.9)),
    ("trace-nesterov", lambda: eqxopt.Trace(0.8, nesterov=True),
     lambda: optax.trace(0.8, nesterov=True)),
    ("identity", eqxopt.Identity, optax.identity),
    ("stateless", lambda: eqxopt.Stateless(_double_big),
     lambda: optax.stateless(_double_big)),
]  # fmt: skip


# The variants of a block run in `make test-slow` only.
SLOW = {"adam-nesterov", "rms-corrected", "trace-nesterov", "identity"}


@pytest.mark.parametrize(
    "name,ours,theirs",
    [
        pytest.param(*c, id=c[0], marks=[pytest.mark.slow] if c[0] in SLOW else [])
        for c in CASES
    ],
)
def test_block_matches_optax(name, ours, theirs):
    # Each block followed by the same learning rate, so the parameters move.
    params = nested_tree()
    grads = list(grad_stream(params, STEPS))
    lr = 0.01
    expected = run_optax(optax.chain(theirs(), optax.scale(-lr)), params, grads)
    actual = run_eqxopt(
        eqxopt.Chain(ours(), eqxopt.ScaleByLearningRate(lr)), params, grads
    )
    # Nesterov's estimate cancels near zero: a few 1e-6 in 30 steps (as for Adam's).
    atol = 1e-5 if "nesterov" in name else 2e-6
    assert_histories_close(actual, expected, rtol=2e-5, atol=atol)


def test_scale_by_learning_rate_matches_optax_with_a_schedule():
    params = nested_tree()
    grads = list(grad_stream(params, STEPS))
    sched = eqxopt.Linear(0.1, 0.01, 20)
    expected = run_optax(
        optax.scale_by_learning_rate(optax.linear_schedule(0.1, 0.01, 20)),
        params,
        grads,
    )
    actual = run_eqxopt(eqxopt.ScaleByLearningRate(sched), params, grads)
    assert_histories_close(actual, expected)
    unflipped = run_eqxopt(
        eqxopt.ScaleByLearningRate(0.1, flip_sign=False), params, grads[:1]
    )
    ref = run_optax(
        optax.scale_by_learning_rate(0.1, flip_sign=False), params, grads[:1]
    )
    assert_histories_close(unflipped, ref)


@pytest.mark.parametrize(
    "use_step", [pytest.param(False, marks=pytest.mark.slow), True]
)
def test_adamw_is_a_chain_of_blocks(use_step):
    params = nested_tree()
    grads = list(grad_stream(params, STEPS))
    lr, b1, b2, eps, wd = 0.05, 0.8, 0.95, 1e-6, 0.1
    fused = eqxopt.AdamW(lr, b1, b2, eps, weight_decay=wd)
    chain = eqxopt.Chain(
        eqxopt.ScaleByAdam(b1, b2, eps),
        eqxopt.AddDecayedWeights(wd),
        eqxopt.ScaleByLearningRate(lr),
    )
    if use_step:
        runs = []
        for opt in (fused, chain):
            p, s, history = params, opt.init(params), []
            for g in grads:
                p, s = opt.step(g, s, p)
                history.append(p)
            runs.append(history)
        actual, expected = runs
    else:
        actual = run_eqxopt(chain, params, grads)
        expected = run_eqxopt(fused, params, grads)
    assert_histories_close(actual, expected, rtol=1e-5, atol=1e-6)
    assert_moved(params, expected[-1], 1e-5, 1e-6)


def test_blocks_state_is_named():
    params = {"w": jnp.ones(3)}
    chain = eqxopt.Chain(eqxopt.ScaleByAdam(), eqxopt.Trace(0.9), eqxopt.ScaleByRms())
    state = chain.init(params)
    assert isinstance(state[0], eqxopt.ScaleByAdamState)
    assert set(state[0].mu) == {"w"} and set(state[0].nu) == {"w"}
    assert isinstance(state[1], eqxopt.TraceState)
    assert isinstance(state[2], eqxopt.ScaleByRmsState)


def test_new_values_reuse_the_compiled_step():
    params = {"w": jnp.ones(3), "b": jnp.zeros(2)}
    grads = {"w": jnp.full(3, 0.5), "b": jnp.ones(2)}

    def make(b1, wd, lr, decay):
        return eqxopt.Chain(
            eqxopt.ScaleByAdam(b1),
            eqxopt.Trace(decay),
            eqxopt.ScaleByTrustRatio(trust_coefficient=b1),
            eqxopt.AddDecayedWeights(wd),
            eqxopt.Stateless(_double_big),
            eqxopt.ScaleByLearningRate(lr),
        )

    first = make(0.9, 0.1, 0.01, 0.5)
    first.step(grads, first.init(params), params)
    with compiles() as log:
        for args in [(0.8, 0.2, 0.02, 0.7), (0.5, 0.0, 0.3, 0.1)]:
            opt = make(*args)
            opt.step(grads, opt.init(params), params)
    assert log == []


def test_stateless_with_a_partial_and_none_grads():
    params = {"w": jnp.ones(3), "b": jnp.ones(2), "n": 3}
    opt = eqxopt.Stateless(functools.partial(jax.tree.map, lambda u, p: u - p))
    grads = {"w": jnp.full(3, 2.0), "b": None, "n": None}
    updates, _ = opt.update(grads, opt.init(params), params)
    assert updates["b"] is None and updates["n"] is None
    np.testing.assert_allclose(updates["w"], np.ones(3))


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: eqxopt.ScaleByAdam(b1=1.0), "b1"),
        (lambda: eqxopt.ScaleByAdam(b2=0.0), "b2"),
        (lambda: eqxopt.ScaleByAdam(eps=0.0), "eps"),
        (lambda: eqxopt.ScaleByRms(decay=-0.1), "decay"),
        (lambda: eqxopt.ScaleByTrustRatio(min_norm=-1.0), "min_norm"),
        (lambda: eqxopt.ScaleByLearningRate(-0.1), "learning_rate"),
        (lambda: eqxopt.Trace(1.5), "decay"),
    ],
)
def test_invalid_values_name_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: eqxopt.Stateless(3), "fn must be a function"),
        (lambda: eqxopt.ScaleByRms(initial_scale="big"), "initial_scale must be a"),
        (lambda: eqxopt.ScaleByAdam(nesterov=1), "nesterov"),
        (lambda: eqxopt.Trace(0.5, trace_dtype=jnp.int32), "trace_dtype"),
    ],
)
def test_invalid_types_name_the_argument(make, match):
    with pytest.raises((TypeError, ValueError), match=match):
        make()


def test_scale_by_rms_rejects_negative_initial_scale():
    with pytest.raises(ValueError, match="initial_scale must be >= 0"):
        eqxopt.ScaleByRms(initial_scale=-1.0)


def test_donated_steps_of_blocks_agree():
    # donated steps may run the native kernels; the results are the same
    params = nested_tree()
    grads = list(grad_stream(params, 3))
    chain = eqxopt.Chain(
        eqxopt.ScaleByAdam(), eqxopt.Trace(0.5), eqxopt.ScaleByLearningRate(0.1)
    )
    runs = []
    for donate in (False, True):
        p = jax.tree.map(jnp.copy, params)
        s = chain.init(p)
        for g in grads:
            p, s = chain.step(g, s, p, donate=donate)
        runs.append(p)
    assert_histories_close([runs[1]], [runs[0]], rtol=1e-6, atol=1e-7)
