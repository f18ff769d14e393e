"""Reading hyperparameters at the state's step (`hyperparameters`) and recording
norms for logging (`Monitor`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt

PARAMS = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3), "n": 4}
GRADS = {"w": jnp.full((2, 3), 0.5), "b": jnp.ones(3), "n": None}


def test_hyperparameters_of_a_chain_follow_the_schedule():
    sched = eqxopt.Linear(1.0, 0.0, 4)
    opt = eqxopt.Chain(
        eqxopt.ClipByGlobalNorm(1.0),
        eqxopt.ScaleByAdam(b1=0.8),
        eqxopt.ScaleByLearningRate(sched),
    )
    state = opt.init(PARAMS)
    for step in range(3):
        h = eqxopt.hyperparameters(opt, state)
        np.testing.assert_allclose(
            h["ScaleByLearningRate"]["learning_rate"], 1.0 - step / 4
        )
        np.testing.assert_allclose(h["ScaleByAdam"]["b1"], 0.8)
        np.testing.assert_allclose(h["ClipByGlobalNorm"]["max_norm"], 1.0)
        _, state = opt.update(GRADS, state, PARAMS)


def test_hyperparameters_through_wrappers_and_partition():
    inner = eqxopt.Partition(
        {"a": eqxopt.AdamW(0.1, weight_decay=0.2), "b": eqxopt.SGD(0.3)},
        labels={"w": "a", "b": "b", "n": "b"},
    )
    opt = eqxopt.Monitor(eqxopt.SkipNonFinite(inner))
    h = eqxopt.hyperparameters(opt, opt.init(PARAMS))
    np.testing.assert_allclose(h["inner"]["inner"]["a"]["weight_decay"], 0.2)
    np.testing.assert_allclose(h["inner"]["inner"]["b"]["learning_rate"], 0.3)
    with pytest.raises(TypeError, match="opt must be an eqxopt transform"):
        eqxopt.hyperparameters(3, None)
    with pytest.raises(TypeError, match="state must be a ChainState"):
        eqxopt.hyperparameters(eqxopt.Chain(eqxopt.SGD(0.1)), None)


def test_monitor_records_the_norms():
    opt = eqxopt.Monitor(eqxopt.SGD(0.5))
    updates, state = opt.update(GRADS, opt.init(PARAMS), PARAMS)
    g = np.sqrt(6 * 0.25 + 3.0)
    np.testing.assert_allclose(state.grad_norm, g, rtol=1e-6)
    np.testing.assert_allclose(state.update_norm, 0.5 * g, rtol=1e-6)
    plain, _ = eqxopt.SGD(0.5).update(GRADS, eqxopt.SGD(0.5).init(PARAMS), PARAMS)
    for a, b in zip(jax.tree.leaves(updates), jax.tree.leaves(plain)):
        np.testing.assert_array_equal(a, b)


def test_hyperparameters_of_dpsgd_report_its_parts():
    # Issue 39, item 3: DPSGD's values live in two transforms it holds, and
    # `hyperparameters` gave {}.
    opt = eqxopt.DPSGD(
        eqxopt.Linear(0.1, 0.0, 4), 1.5, 0.25, seed=0, momentum=0.9, nesterov=True
    )
    state = opt.init(PARAMS)
    h = eqxopt.hyperparameters(opt, state)
    assert sorted(h) == [
        "dampening", "l2_norm_clip", "learning_rate", "momentum", "noise_multiplier"
    ]  # fmt: skip
    np.testing.assert_allclose(h["learning_rate"], 0.1)
    np.testing.assert_allclose(h["l2_norm_clip"], 1.5)
    np.testing.assert_allclose(h["noise_multiplier"], 0.25)
    np.testing.assert_allclose(h["momentum"], 0.9)
    per_example = jax.tree.map(
        lambda g: None if g is None else jnp.stack([g, g]), GRADS
    )
    _, state = opt.update(per_example, state, PARAMS)
    np.testing.assert_allclose(
        eqxopt.hyperparameters(opt, state)["learning_rate"], 0.075
    )
