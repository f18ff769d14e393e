"""The worked examples of the three seed problems (shared/seeds/), exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt


def tree(obj):
    """Seed notation: a list whose items are all objects is a list node; any other
    list or number is one float32 array leaf."""
    if isinstance(obj, dict):
        return {k: tree(v) for k, v in obj.items()}
    if isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        return [tree(x) for x in obj]
    return jnp.asarray(obj, dtype=jnp.float32)


def assert_tree_equal(actual, expected, atol):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for (path, a), e in zip(
        jax.tree.leaves_with_path(actual), jax.tree.leaves(expected)
    ):
        assert a.shape == e.shape and a.dtype == e.dtype, jax.tree_util.keystr(path)
        np.testing.assert_allclose(a, e, rtol=0, atol=atol, err_msg=str(path))


# --- seed 000: SGD with momentum over a pytree --------------------------------------

SGD_EXAMPLES = [
    (
        {"w": [0.5, -1.0], "b": 0.2},
        {"w": [0.1, 0.4], "b": -0.5},
        {"w": [0.0, 0.0], "b": 0.0},
        0.1,
        0.9,
        {"b": 0.25, "w": [0.49, -1.04]},
        {"b": -0.5, "w": [0.1, 0.4]},
    ),
    (
        {"dense": {"w": [[1.0, 2.0], [3.0, 4.0]], "b": [0.0, 0.5]}, "scale": 1.0},
        {"dense": {"w": [[0.5, -0.5], [1.0, 0.0]], "b": [0.2, -0.2]}, "scale": 0.3},
        {"dense": {"w": [[1.0, 1.0], [-1.0, 0.0]], "b": [0.0, 2.0]}, "scale": -0.5},
        0.05,
        0.5,
        {
            "dense": {"b": [-0.01, 0.46], "w": [[0.95, 2.0], [2.975, 4.0]]},
            "scale": 0.9975,
        },
        {"dense": {"b": [0.2, 0.8], "w": [[1.0, 0.0], [0.5, 0.0]]}, "scale": 0.05},
    ),
    (
        {"layers": [{"w": [1.0, -1.0], "b": 0.0}, {"w": [2.0], "b": 1.0}]},
        {"layers": [{"w": [0.2, 0.2], "b": 1.0}, {"w": [-1.0], "b": 0.5}]},
        {"layers": [{"w": [0.1, -0.1], "b": 0.0}, {"w": [0.4], "b": -0.2}]},
        0.2,
        0.8,
        {"layers": [{"b": -0.2, "w": [0.944, -1.024]}, {"b": 0.932, "w": [2.136]}]},
        {"layers": [{"b": 1.0, "w": [0.28, 0.12]}, {"b": 0.34, "w": [-0.68]}]},
    ),
]


@pytest.mark.parametrize("example", SGD_EXAMPLES, ids=["flat", "nested", "layers"])
def test_seed_000_sgd_momentum(example):
    params, grads, velocity, lr, momentum, want_params, want_velocity = map(
        lambda x: tree(x) if isinstance(x, dict) else x, example
    )
    opt = eqxopt.SGD(learning_rate=lr, momentum=momentum)
    state = eqxopt.SGDState(step=jnp.array(0, jnp.int32), velocity=velocity)
    new_params, new_state = opt.step(grads, state, params)
    assert_tree_equal(new_params, want_params, atol=1e-6)
    assert_tree_equal(new_state.velocity, want_velocity, atol=1e-6)


def test_seed_000_bfloat16_leaves_stay_bfloat16():
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), tree(SGD_EXAMPLES[1][0]))
    grads = jax.tree.map(lambda x: x.astype(jnp.bfloat16), tree(SGD_EXAMPLES[1][1]))
    opt = eqxopt.SGD(0.05, momentum=0.5)
    new_params, state = opt.step(grads, opt.init(params), params)
    for leaf in jax.tree.leaves((new_params, state.velocity)):
        assert leaf.dtype == jnp.bfloat16


def test_seed_000_inputs_unchanged():
    params, grads, velocity = (tree(x) for x in SGD_EXAMPLES[2][:3])
    snapshot = jax.tree.map(np.asarray, (params, grads, velocity))
    containers = (params["layers"], grads["layers"], velocity["layers"])
    opt = eqxopt.SGD(0.2, momentum=0.8)
    state = eqxopt.SGDState(step=jnp.array(0, jnp.int32), velocity=velocity)
    new_params, _new_state = opt.step(grads, state, params)
    assert new_params is not params and new_params["layers"] is not params["layers"]
    assert (params["layers"], grads["layers"], velocity["layers"]) == containers
    for a, b in zip(
        jax.tree.leaves((params, grads, velocity)), jax.tree.leaves(snapshot)
    ):
        np.testing.assert_array_equal(a, b)


# --- seed 001: AdamW from scratch, every hyperparameter traced ---------------------

ADAMW_EXAMPLES = [
    dict(
        params={"w": [1.0, -2.0], "b": 0.5},
        grads={"w": [0.5, -0.1], "b": 0.0},
        state={
            "step": 0,
            "mu": {"w": [0.0, 0.0], "b": 0.0},
            "nu": {"w": [0.0, 0.0], "b": 0.0},
        },
        hyper=dict(learning_rate=0.1, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0),
        want_params={"b": 0.5, "w": [0.9, -1.9]},
        want_state={
            "step": 1,
            "mu": {"b": 0.0, "w": [0.05, -0.01]},
            "nu": {"b": 0.0, "w": [0.00025, 1e-05]},
        },
    ),
    dict(
        params={"w": [[1.0, 0.5], [-0.5, 2.0]]},
        grads={"w": [[0.2, -0.4], [0.0, 1.0]]},
        state={
            "step": 4,
            "mu": {"w": [[0.1, -0.1], [0.05, 0.3]]},
            "nu": {"w": [[0.01, 0.02], [0.001, 0.2]]},
        },
        hyper=dict(learning_rate=0.01, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.1),
        want_params={"w": [[0.993141, 0.504304], [-0.507232, 1.993614]]},
        want_state={
            "step": 5,
            "mu": {"w": [[0.11, -0.13], [0.045, 0.37]]},
            "nu": {"w": [[0.0103, 0.0214], [0.00099, 0.208]]},
        },
    ),
    dict(
        params={"layers": [{"w": [0.3, -0.3], "b": 0.1}, {"w": [1.5], "b": -1.0}]},
        grads={"layers": [{"w": [0.01, -0.02], "b": 0.5}, {"w": [-0.3], "b": 0.0}]},
        state={
            "step": 1,
            "mu": {
                "layers": [{"w": [0.001, 0.0], "b": 0.05}, {"w": [-0.03], "b": 0.0}]
            },
            "nu": {
                "layers": [
                    {"w": [0.00001, 0.00004], "b": 0.00025},
                    {"w": [0.00009], "b": 0.0},
                ]
            },
        },
        hyper=dict(learning_rate=0.05, b1=0.8, b2=0.95, eps=0.01, weight_decay=0.05),
        want_params={
            "layers": [
                {"b": 0.047402, "w": [0.281729, -0.283095]},
                {"b": -0.9975, "w": [1.547675]},
            ]
        },
        want_state={
            "step": 2,
            "mu": {
                "layers": [
                    {"b": 0.14, "w": [0.0028, -0.004]},
                    {"b": 0.0, "w": [-0.084]},
                ]
            },
            "nu": {
                "layers": [
                    {"b": 0.012738, "w": [1.4e-05, 5.8e-05]},
                    {"b": 0.0, "w": [0.004586]},
                ]
            },
        },
    ),
]


def _adam_state(d):
    return eqxopt.AdamState(
        step=jnp.asarray(d["step"], jnp.int32), mu=tree(d["mu"]), nu=tree(d["nu"])
    )


@jax.jit
def _adamw_step_traced(params, grads, state, hyper):
    # Every hyperparameter and the step arrive as traced scalars, as in the seed.
    opt = eqxopt.AdamW(**hyper)
    return opt.step(grads, state, params)


@pytest.mark.parametrize(
    "example", ADAMW_EXAMPLES, ids=["first-step", "decay", "layers"]
)
@pytest.mark.parametrize("traced", [True, False], ids=["traced", "eager"])
def test_seed_001_adamw(example, traced):
    params, grads = tree(example["params"]), tree(example["grads"])
    state = _adam_state(example["state"])
    if traced:
        hyper = {k: jnp.float32(v) for k, v in example["hyper"].items()}
        new_params, new_state = _adamw_step_traced(params, grads, state, hyper)
    else:
        new_params, new_state = eqxopt.AdamW(**example["hyper"]).step(
            grads, state, params
        )
    want = example["want_state"]
    assert_tree_equal(new_params, tree(example["want_params"]), atol=1.5e-6)
    assert new_state.step.dtype == jnp.int32 and new_state.step.shape == ()
    assert int(new_state.step) == want["step"]
    assert_tree_equal(new_state.mu, tree(want["mu"]), atol=1.5e-6)
    assert_tree_equal(new_state.nu, tree(want["nu"]), atol=1.5e-6)


# --- seed 004: traced warmup-cosine schedule -----------------------------------------

SCHEDULE_EXAMPLES = [
    ([0, 5, 10, 55, 100, 150], (1.0, 0.0, 10, 100), [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]),
    (3, (0.001, 0.0001, 8, 40), 0.000375),
    ([0, 1, 2, 3], (0.5, 0.05, 1, 3), [0.0, 0.5, 0.275, 0.05]),
]


@pytest.mark.parametrize(
    "example", SCHEDULE_EXAMPLES, ids=["vector", "scalar", "short"]
)
@pytest.mark.parametrize("traced", [True, False], ids=["traced", "eager"])
def test_seed_004_warmup_cosine(example, traced):
    step, args, want = example
    schedule = eqxopt.WarmupCosine(*args)
    step = jnp.asarray(step, jnp.int32)
    got = jax.jit(schedule.__call__)(step) if traced else schedule(step)
    assert got.dtype == jnp.float32 and got.shape == step.shape
    np.testing.assert_allclose(got, np.asarray(want, np.float32), rtol=1e-6, atol=1e-7)
