"""Foundation behaviour: whole Equinox models, no recompiles, low precision."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from helpers import compiles


def regression_problem():
    model = eqx.nn.MLP(4, 1, 32, 2, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (64, 4))
    y = jnp.sin(x.sum(axis=1, keepdims=True))

    def loss_fn(m):
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    return model, loss_fn


@pytest.mark.parametrize(
    "opt",
    [
        eqxopt.SGD(0.1, momentum=0.9),
        eqxopt.Adam(1e-2),
        eqxopt.AdamW(eqxopt.WarmupCosine(1e-2, 1e-3, 10, 100), weight_decay=1e-3),
    ],
    ids=["SGD", "Adam", "AdamW"],
)
def test_whole_mlp_trains_without_filtering(opt):
    model, loss_fn = regression_problem()
    state = opt.init(model)  # activation functions in the model: no eqx.filter needed
    assert state.step.dtype == jnp.int32

    @eqx.filter_jit
    def train_step(model, state):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        model, state = opt.step(grads, state, model)
        return model, state, loss

    losses = []
    for _ in range(100):
        model, state, loss = train_step(model, state)
        losses.append(float(loss))
    assert model.activation is jax.nn.relu
    assert losses[-1] < 0.5 * losses[0]
    assert int(state.step) == 100


def test_changing_the_learning_rate_inside_a_user_jit_does_not_retrace():
    model, loss_fn = regression_problem()
    traces = 0

    @eqx.filter_jit
    def train_step(opt, model, state):
        nonlocal traces
        traces += 1
        grads = eqx.filter_grad(loss_fn)(model)
        return opt.step(grads, state, model)

    state = eqxopt.AdamW(1e-3).init(model)
    for lr in [1e-3, 2e-3, 5e-4, jnp.float32(1e-4)]:
        model, state = train_step(eqxopt.AdamW(lr), model, state)
    for peak in [1e-3, 3e-3]:
        schedule = eqxopt.WarmupCosine(peak, peak / 10, 5, 50)
        model, state = train_step(eqxopt.AdamW(schedule), model, state)
    # One trace for the float learning rates, one for the schedule-valued field.
    assert traces == 2


def test_changing_hyperparameters_reuses_the_direct_step():
    params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
    grads = jax.tree.map(jnp.ones_like, params)
    results, logs = [], []
    for lr, b2 in [(1e-3, 0.999), (1e-2, 0.99), (0.5, 0.9)]:
        opt = eqxopt.AdamW(lr, b2=b2, weight_decay=0.1)
        with compiles() as log:
            new_params, _ = opt.step(grads, opt.init(params), params)
        logs.append(log)
        results.append(new_params["w"])
    # The first step compiles; the others, with other numbers, reuse its program.
    assert logs[0] and logs[1:] == [[], []], logs
    assert not np.allclose(results[0], results[1])


def test_hyperparameters_stay_float32_with_bfloat16_params():
    params = {"w": jnp.ones(4, jnp.bfloat16)}
    grads = {"w": jnp.full(4, 1e-3, jnp.bfloat16)}
    opt = eqxopt.Adam(1e-2, b2=0.999)
    assert opt.b2.dtype == jnp.float32 and float(opt.b2) != 1.0
    new_params, state = opt.step(grads, opt.init(params), params)
    assert new_params["w"].dtype == jnp.bfloat16
    assert state.mu["w"].dtype == jnp.bfloat16 and state.nu["w"].dtype == jnp.bfloat16
    # The first Adam step moves each coordinate by about lr: finite, not NaN.
    np.testing.assert_allclose(new_params["w"].astype(jnp.float32), 1 - 1e-2, rtol=1e-2)


def test_nu_dtype_keeps_a_float32_second_moment_for_bfloat16_params():
    params = {"w": jnp.ones(4, jnp.bfloat16)}
    grads = {"w": jnp.full(4, 1e-3, jnp.bfloat16)}
    opt = eqxopt.AdamW(1e-2, nu_dtype=jnp.float32)
    new_params, state = opt.step(grads, opt.init(params), params)
    assert state.nu["w"].dtype == jnp.float32 and state.mu["w"].dtype == jnp.bfloat16
    assert new_params["w"].dtype == jnp.bfloat16
    np.testing.assert_allclose(state.nu["w"], 0.001 * np.float32(1e-3) ** 2, rtol=1e-2)


def test_float16_params_with_zero_gradients_stay_finite():
    # optax issue 1754: eps = 1e-8 underflows to 0 in float16, and 0 / 0 gives NaN.
    params = {"w": jnp.ones(5, jnp.float16)}
    grads = {"w": jnp.zeros(5, jnp.float16)}
    opt = eqxopt.Adam(1e-3)
    updates, state = opt.update(grads, opt.init(params), params)
    assert updates["w"].dtype == jnp.float16
    np.testing.assert_array_equal(updates["w"], 0)
    new_params, _ = opt.step(grads, state, params)
    np.testing.assert_array_equal(new_params["w"], 1)


def test_apply_updates_keeps_the_parameter_dtype():
    params = {"w": jnp.ones(2, jnp.bfloat16), "n": jnp.array(3), "f": jax.nn.relu}
    updates = {"w": jnp.full(2, 0.5, jnp.float32), "n": None, "f": None}
    out = eqxopt.apply_updates(params, updates)
    assert (
        out["w"].dtype == jnp.bfloat16
        and out["n"] is params["n"]
        and out["f"] is jax.nn.relu
    )
    np.testing.assert_array_equal(out["w"], 1.5)


def test_non_float_leaves_get_none_state_and_pass_through():
    params = {
        "w": jnp.ones(2),
        "count": jnp.array(3),
        "name": "layer",
        "act": jax.nn.gelu,
    }
    grads = {"w": jnp.ones(2), "count": None, "name": None, "act": None}
    opt = eqxopt.AdamW(0.1)
    state = opt.init(params)
    assert (
        state.mu["count"] is None
        and state.mu["name"] is None
        and state.nu["act"] is None
    )
    new_params, _ = opt.step(grads, state, params)
    assert new_params["count"] is not None and int(new_params["count"]) == 3
    assert new_params["name"] == "layer" and new_params["act"] is jax.nn.gelu


def test_step_counter_saturates_instead_of_wrapping():
    params = {"w": jnp.ones(2)}
    opt = eqxopt.SGD(0.1)
    state = eqxopt.SGDState(
        step=jnp.array(np.iinfo(np.int32).max, jnp.int32),
        velocity=opt.init(params).velocity,
    )
    _, state = opt.step(params, state, params)
    assert int(state.step) == np.iinfo(np.int32).max


def test_state_fields_can_be_edited_with_tree_at():
    params = {"w": jnp.ones(2)}
    opt = eqxopt.AdamW(0.1)
    state = opt.init(params)
    state = eqx.tree_at(lambda s: s.mu["w"], state, jnp.full(2, 0.5))
    _, new_state = opt.step({"w": jnp.zeros(2)}, state, params)
    np.testing.assert_allclose(new_state.mu["w"], 0.45, rtol=1e-6)


def test_a_python_float_loss_does_not_recompile():
    params = {"w": jnp.array([3.0, -2.0])}
    opt = eqxopt.PolyakSGD()
    state = opt.init(params)
    logs = []
    for _ in range(4):
        loss = float(jnp.sum(params["w"] ** 2))  # a Python float each step
        with compiles() as log:
            params, state = opt.step({"w": 2 * params["w"]}, state, params, value=loss)
        logs.append(log)
    assert logs[0] and logs[1:] == [[], [], []], logs
    assert float(jnp.sum(params["w"] ** 2)) < 13.0
