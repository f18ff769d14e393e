"""Transforms and helpers ported from optax (issue 28), each against optax's own
numbers over many steps."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from helpers import (
    assert_histories_close,
    assert_moved,
    assert_trees_close,
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


# ------------------------------------------------- Snapshot and MeasureWithEMA


def _is_large(updates):
    return eqxopt.tree_norm(updates) > 1.0


def _optax_is_large(updates):
    return optax.tree.norm(updates) > 1.0


@pytest.mark.parametrize("debias", [True, False])
def test_snapshot_and_measure_with_ema_record_optax_measurements(debias):
    params = nested_tree()
    grads = list(grad_stream(params, STEPS))
    with jax.numpy_dtype_promotion("standard"):
        tx = optax.chain(
            optax.sgd(0.1, 0.9),
            optax.snapshot("norm", optax.tree.norm),
            optax.monitor(
                {"large": optax.measure_with_ema(_optax_is_large, 0.8, debias)}
            ),
        )
        state = tx.init(params)
    opt = eqxopt.Chain(
        eqxopt.SGD(0.1, 0.9),
        eqxopt.Snapshot("norm", eqxopt.tree_norm),
        eqxopt.MeasureWithEMA(_is_large, 0.8, debias),
    )
    ours = opt.init(params)
    theirs_p = ours_p = params
    seen = []
    for g in grads:
        with jax.numpy_dtype_promotion("standard"):
            updates, state = jax.jit(tx.update)(g, state, theirs_p)
            theirs_p = optax.apply_updates(theirs_p, updates)
        ours_p, ours = opt.step(g, ours, ours_p)
        np.testing.assert_allclose(
            eqxopt.tree_get(ours, "norm"), optax.tree.get(state, "norm"), rtol=2e-6
        )
        np.testing.assert_allclose(
            ours["MeasureWithEMA"].measurement,
            optax.tree.get(state, "large"),
            rtol=2e-6,
            atol=1e-7,
        )
        seen.append(float(ours["MeasureWithEMA"].measurement))
    assert min(seen) == 0.0 and 0.5 < max(seen) < 1.0  # both outcomes averaged
    # The updates pass through: the parameters are optax's (SGD's alone).
    assert_trees_close(ours_p, theirs_p)


def test_measure_with_ema_keeps_its_dtype():
    params = {"w": jnp.ones(3, jnp.bfloat16)}
    opt = eqxopt.MeasureWithEMA(_is_large, 0.9)
    state = opt.init(params)
    assert state.ema.dtype == jnp.float32  # a bool measurement, averaged in float32
    _, state = opt.update({"w": jnp.ones(3, jnp.bfloat16)}, state, params)
    assert state.measurement.dtype == jnp.float32
    np.testing.assert_allclose(state.measurement, 1.0)
    snap = eqxopt.Snapshot("sum", _total)
    state = snap.init(params)
    assert state.measurement["sum"].dtype == jnp.bfloat16
    _, state = snap.update({"w": jnp.full(3, 2.0, jnp.bfloat16)}, state, params)
    assert state.measurement["sum"].dtype == jnp.bfloat16
    np.testing.assert_allclose(state.measurement["sum"].astype(jnp.float32), 6.0)


def _total(tree):
    return sum(jnp.sum(x) for x in jax.tree.leaves(tree))


def test_measurements_refuse_bad_arguments():
    with pytest.raises(TypeError, match="measure must be a function of the updates"):
        eqxopt.Snapshot("norm", 3.0)
    with pytest.raises(TypeError, match="measure_name must be a str"):
        eqxopt.Snapshot(1, eqxopt.tree_norm)
    with pytest.raises(TypeError, match="measure must be a function of the updates"):
        eqxopt.MeasureWithEMA(None, 0.9)
    with pytest.raises(ValueError, match="decay"):
        eqxopt.MeasureWithEMA(eqxopt.tree_norm, 1.0)
    with pytest.raises(TypeError, match="accumulator_dtype=: use ema_dtype="):
        eqxopt.MeasureWithEMA(eqxopt.tree_norm, 0.9, accumulator_dtype=jnp.float32)


# ------------------------------------- ConditionallyTransform, ConditionallyMask


def _every_third(step):
    return step % 3 == 0


def _after_ten(step):
    return step >= 10


def _below(step, value):
    return value < 1.0


@pytest.mark.parametrize(
    "ours,theirs",
    [
        (eqxopt.ConditionallyTransform, optax.conditionally_transform),
        (eqxopt.ConditionallyMask, optax.conditionally_mask),
    ],
    ids=["transform", "mask"],
)
@pytest.mark.parametrize("predicate", [_every_third, _after_ten])
def test_conditionally_matches_optax(ours, theirs, predicate):
    # A stateful inner transform (its state holds on the steps not taken), then a
    # learning rate, so the passed-through gradients move the parameters too.
    params = nested_tree()
    grads = list(grad_stream(params, STEPS))
    expected = run_optax(
        optax.chain(
            theirs(optax.chain(optax.scale_by_adam(), optax.scale(3.0)), predicate),
            optax.scale(-0.01),
        ),
        params,
        grads,
    )
    opt = eqxopt.Chain(
        ours(
            eqxopt.Chain(
                eqxopt.ScaleByAdam(), eqxopt.ScaleByLearningRate(3.0, flip_sign=False)
            ),
            predicate,
        ),
        eqxopt.ScaleByLearningRate(0.01),
    )
    assert_histories_close(run_eqxopt(opt, params, grads), expected)


def test_conditionally_counts_every_call_and_holds_the_inner_state():
    params = {"w": jnp.ones(2)}
    opt = eqxopt.ConditionallyMask(eqxopt.Adam(0.1), _every_third)
    state = opt.init(params)
    assert isinstance(state, eqxopt.ConditionallyMaskState)
    for _ in range(4):
        updates, state = opt.update({"w": jnp.ones(2)}, state, params)
    assert int(state.step) == 4
    assert int(state.inner.step) == 2  # steps 0 and 3
    np.testing.assert_allclose(updates["w"], -0.1, rtol=1e-5)


def test_conditionally_forwards_extra_args():
    params = {"w": jnp.ones(2)}
    g = {"w": jnp.ones(2)}
    opt = eqxopt.ConditionallyTransform(eqxopt.SGD(0.5), _below, True)
    with jax.numpy_dtype_promotion("standard"):
        tx = optax.conditionally_transform(optax.sgd(0.5), _below, True)
        theirs = tx.update(g, tx.init(params), params, value=jnp.array(2.0))[0]
    state = opt.init(params)
    u, state = opt.update(g, state, params, value=jnp.array(2.0))
    np.testing.assert_allclose(u["w"], theirs["w"])
    np.testing.assert_allclose(u["w"], 1.0)  # not taken: the gradient passes
    u, state = opt.update(g, state, params, value=jnp.array(0.5))
    np.testing.assert_allclose(u["w"], -0.5)
    without = eqxopt.ConditionallyTransform(eqxopt.SGD(0.5), _every_third)
    with pytest.raises(TypeError, match="keyword argument"):
        without.update(g, without.init(params), params, value=jnp.array(0.5))


def test_conditionally_refuses_bad_arguments():
    with pytest.raises(TypeError, match="should_transform_fn must be a function"):
        eqxopt.ConditionallyMask(eqxopt.SGD(0.1), 3)
    with pytest.raises(TypeError, match="inner"):
        eqxopt.ConditionallyTransform(lambda g: g, _every_third)
    opt = eqxopt.ConditionallyTransform(eqxopt.SGD(0.1), jnp.atleast_1d)
    params = {"w": jnp.ones(2)}
    with pytest.raises(TypeError, match="must return a bool scalar, got an array"):
        opt.update(params, opt.init(params), params)


# --------------------- KeepParamsNonnegative, NormalizeByUpdateNorm, SplitReal...


def test_keep_params_nonnegative_matches_optax():
    params = jax.tree.map(jnp.abs, nested_tree())
    grads = list(grad_stream(params, STEPS))
    expected = run_optax(
        optax.chain(optax.sgd(0.2, 0.5), optax.keep_params_nonnegative()),
        params,
        grads,
    )
    opt = eqxopt.Chain(eqxopt.SGD(0.2, 0.5), eqxopt.KeepParamsNonnegative())
    actual = run_eqxopt(opt, params, grads)
    assert_histories_close(actual, expected)
    leaves = jax.tree.leaves(actual[-1])
    assert min(float(jnp.min(x)) for x in leaves) == 0.0  # some landed on 0
    assert all(bool(jnp.all(x >= 0)) for x in leaves)


def test_keep_params_nonnegative_refuses_complex_and_needs_params():
    opt = eqxopt.KeepParamsNonnegative()
    with pytest.raises(TypeError, match="KeepParamsNonnegative"):
        opt.init({"z": jnp.ones(2, jnp.complex64)})
    params = {"w": jnp.ones(2)}
    with pytest.raises(TypeError, match="KeepParamsNonnegative"):
        opt.update(params, opt.init(params))


@pytest.mark.parametrize(
    "ours,theirs",
    [
        (
            lambda: eqxopt.NormalizeByUpdateNorm(-0.05, 1e-3),
            lambda: optax.normalize_by_update_norm(-0.05, 1e-3),
        ),
        (
            lambda: eqxopt.NormalizeByUpdateNorm(eps=0.0),
            lambda: optax.chain(optax.contrib.normalize(), optax.scale(-0.05)),
        ),
    ],
    ids=["normalize_by_update_norm", "contrib.normalize"],
)
def test_normalize_by_update_norm_matches_optax(ours, theirs):
    params = nested_tree()
    grads = list(grad_stream(params, STEPS))
    opt = ours()
    if opt.scale_factor > 0:  # contrib.normalize: the step's sign and size after it
        opt = eqxopt.Chain(opt, eqxopt.ScaleByLearningRate(0.05))
    assert_histories_close(
        run_eqxopt(opt, params, grads), run_optax(theirs(), params, grads)
    )


def test_normalize_by_update_norm_with_a_schedule_and_bad_values():
    params = {"w": jnp.array([3.0, 4.0])}
    opt = eqxopt.NormalizeByUpdateNorm(eqxopt.Linear(1.0, 2.0, 1), eps=0.0)
    state = opt.init(params)
    u, state = opt.update(params, state, params)
    np.testing.assert_allclose(u["w"], [0.6, 0.8], rtol=1e-6)
    u, state = opt.update(params, state, params)
    np.testing.assert_allclose(u["w"], [1.2, 1.6], rtol=1e-6)
    with pytest.raises(ValueError, match="eps"):
        eqxopt.NormalizeByUpdateNorm(1.0, -1e-3)


def test_split_real_and_imaginary_matches_optax():
    rng = np.random.default_rng(0)

    def tree(shape_seed):
        del shape_seed
        return {
            "z": jnp.asarray(
                rng.normal(size=(3, 2)) + 1j * rng.normal(size=(3, 2)), jnp.complex64
            ),
            "x": jnp.asarray(rng.normal(size=4), jnp.float32),
        }

    params = tree(0)
    grads = [tree(k) for k in range(STEPS)]
    expected = run_optax(
        optax.contrib.split_real_and_imaginary(optax.adam(0.01)), params, grads
    )
    opt = eqxopt.SplitRealAndImaginary(eqxopt.Adam(0.01))
    actual = run_eqxopt(opt, params, grads)

    def parts(t):
        return jax.tree.map(lambda x: (jnp.real(x), jnp.imag(x)), t)

    assert_moved(parts(params), parts(expected[-1]), 2e-5, 2e-6)
    for a, e in zip(actual, expected):
        assert_trees_close(parts(a), parts(e))
    # Adam on the pair is not Adam on the complex leaf (|z|^2 in one moment).
    plain = run_eqxopt(eqxopt.Adam(0.01), params, grads)
    assert not np.allclose(plain[-1]["z"], actual[-1]["z"], rtol=1e-3)
    state = opt.init(params)
    assert isinstance(state.inner.mu["z"], eqxopt.RealImaginaryPair)
    assert state.inner.mu["z"].real.dtype == jnp.float32
    # A real-only optimizer takes complex parameters through it.
    rprop = eqxopt.SplitRealAndImaginary(eqxopt.Rprop(0.01))
    new, _ = rprop.step(grads[0], rprop.init(params), params)
    assert new["z"].dtype == jnp.complex64


def test_split_real_and_imaginary_refuses_a_non_transform():
    with pytest.raises(TypeError, match="inner"):
        eqxopt.SplitRealAndImaginary(optax.adam(0.1))


# ------------------------- scale_gradient, incremental_update, periodic_update


@pytest.mark.parametrize("scale", [0.5, -1.0, 0.0, 1.0])
def test_scale_gradient_matches_optax(scale):
    params = nested_tree()

    def loss(scaler, p):
        p = scaler(p, scale)
        return sum(jnp.sum(jnp.sin(x) * x) for x in jax.tree.leaves(p))

    with jax.numpy_dtype_promotion("standard"):
        theirs_value, theirs = jax.value_and_grad(
            lambda p: loss(optax.scale_gradient, p)
        )(params)
    ours_value, ours = jax.value_and_grad(lambda p: loss(eqxopt.scale_gradient, p))(
        params
    )
    np.testing.assert_allclose(ours_value, theirs_value, rtol=1e-6)
    assert_trees_close(ours, theirs, rtol=1e-6, atol=0)
    plain = jax.grad(lambda p: loss(lambda x, s: x, p))(params)
    assert_trees_close(ours, jax.tree.map(lambda g: scale * g, plain), 1e-6, 0)


def test_scale_gradient_on_a_model_traced_and_bf16():
    import equinox as eqx

    model = eqx.nn.Linear(3, 2, key=jax.random.key(0))
    x = jnp.ones(3)

    @jax.jit
    def grads(model, scale):
        return eqx.filter_grad(lambda m: jnp.sum(eqxopt.scale_gradient(m, scale)(x)))(
            model
        )

    half = grads(model, jnp.asarray(0.5))
    full = eqx.filter_grad(lambda m: jnp.sum(m(x)))(model)
    np.testing.assert_allclose(half.weight, 0.5 * full.weight)
    w = jnp.ones(2, jnp.bfloat16)
    g = jax.grad(lambda w: jnp.sum(eqxopt.scale_gradient(w, 3.0)).astype(jnp.float32))(
        w
    )
    assert g.dtype == jnp.bfloat16
    np.testing.assert_allclose(g.astype(jnp.float32), 3.0)
    with pytest.raises(TypeError, match="scale must be a float"):
        eqxopt.scale_gradient(w, "big")


def test_target_network_helpers_match_optax():
    # A target network over 30 steps of an online one: averaged and copied.
    online = nested_tree()
    grads = list(grad_stream(online, STEPS))
    theirs_avg = ours_avg = theirs_copy = ours_copy = online
    for step, g in enumerate(grads, start=1):
        online = jax.tree.map(lambda p, g: p - 0.1 * g, online, g)
        with jax.numpy_dtype_promotion("standard"):
            theirs_avg = optax.incremental_update(online, theirs_avg, 0.1)
            theirs_copy = optax.periodic_update(online, theirs_copy, step, 4)
        ours_avg = eqxopt.incremental_update(online, ours_avg, 0.1)
        ours_copy = eqxopt.periodic_update(online, ours_copy, step, 4)
        assert_trees_close(ours_avg, theirs_avg, rtol=1e-6, atol=1e-7)
        assert_trees_close(ours_copy, theirs_copy, rtol=0, atol=0)
    assert_moved(nested_tree(), theirs_avg, 2e-5, 2e-6)


def test_target_network_helpers_take_models_and_refuse_bad_values():
    import equinox as eqx

    a = eqx.nn.MLP(2, 1, 4, 1, key=jax.random.key(0))
    b = eqx.nn.MLP(2, 1, 4, 1, key=jax.random.key(1))
    mixed = eqxopt.incremental_update(a, b, 0.25)
    np.testing.assert_allclose(
        mixed.layers[0].weight,
        0.25 * a.layers[0].weight + 0.75 * b.layers[0].weight,
        rtol=1e-6,
    )
    assert eqxopt.periodic_update(a, b, 8, 4) is not None
    with pytest.raises(ValueError, match="step_size"):
        eqxopt.incremental_update(a, b, 1.5)
    with pytest.raises(ValueError, match="update_period"):
        eqxopt.periodic_update(a, b, 3, 0)
    with pytest.raises(ValueError, match="steps"):
        eqxopt.periodic_update(a, b, -1, 2)


# ----------------------------------------------- ScaleByBacktrackingLinesearch

_WEIGHTS = jax.tree.map(lambda p: jnp.abs(p) + 0.5, nested_tree(3))


def _loss(params, scale=1.0):
    # A convex loss whose curvature grows away from 1: the step size changes.
    return scale * sum(
        jnp.sum(a * (x - 1.0) ** 2 + 0.1 * x**4)
        for a, x in zip(jax.tree.leaves(_WEIGHTS), jax.tree.leaves(params))
    )


def _linesearch_runs(ours, theirs, steps=STEPS, **data):
    params = nested_tree()
    with jax.numpy_dtype_promotion("standard"):
        state = theirs.init(params)
        update = jax.jit(
            lambda g, s, p, v: theirs.update(
                g, s, p, value=v, grad=g, value_fn=_loss, **data
            )
        )
    expected, actual, states = [], [], []
    theirs_p = ours_p = params
    ours_state = ours.init(params)
    for _ in range(steps):
        with jax.numpy_dtype_promotion("standard"):
            value, grads = jax.value_and_grad(_loss)(theirs_p, **data)
            updates, state = update(grads, state, theirs_p, value)
            theirs_p = optax.apply_updates(theirs_p, updates)
        expected.append(theirs_p)
        value, grads = jax.value_and_grad(_loss)(ours_p, **data)
        updates, ours_state = ours.update(
            grads, ours_state, ours_p, value=value, grad=grads, value_fn=_loss, **data
        )
        ours_p = eqxopt.apply_updates(ours_p, updates)
        actual.append(ours_p)
        states.append((state, ours_state))
    return actual, expected, states


@pytest.mark.parametrize(
    "store_grad", [False, pytest.param(True, marks=pytest.mark.slow)]
)
def test_backtracking_linesearch_matches_optax(store_grad):
    theirs = optax.chain(
        optax.sgd(1.0),
        optax.scale_by_backtracking_linesearch(15, store_grad=store_grad),
    )
    ours = eqxopt.Chain(
        eqxopt.SGD(1.0), eqxopt.ScaleByBacktrackingLinesearch(15, store_grad=store_grad)
    )
    actual, expected, states = _linesearch_runs(ours, theirs)
    assert_moved(nested_tree(), expected[-1], 2e-5, 2e-6)
    for a, e in zip(actual, expected):
        assert_trees_close(a, e)
    rates = set()
    for theirs_state, ours_state in states:
        t, o = theirs_state[1], ours_state["ScaleByBacktrackingLinesearch"]
        np.testing.assert_allclose(o.learning_rate, t.learning_rate, rtol=1e-6)
        np.testing.assert_allclose(o.value, t.value, rtol=1e-6)
        assert int(o.linesearch_steps) == int(t.info.num_linesearch_steps)
        np.testing.assert_allclose(o.decrease_error, t.info.decrease_error, atol=1e-6)
        if store_grad:
            assert_trees_close(o.grad, t.grad, rtol=1e-5, atol=1e-5)
        else:
            assert o.grad is None and t.grad is None
        rates.add(round(float(o.learning_rate), 6))
    assert len(rates) > 3  # the search did change the step size


def test_backtracking_linesearch_with_data_and_its_own_value():
    # Optax's other arguments, data for value_fn, and value/grad left to eqxopt.
    theirs = optax.chain(
        optax.sgd(1.0),
        optax.scale_by_backtracking_linesearch(6, 0.3, 0.5, 2.0, 0.8, 1e-3, 1e-3),
    )
    opt = eqxopt.ScaleByBacktrackingLinesearch(6, 0.3, 0.5, 2.0, 0.8, 1e-3, 1e-3)
    ours = eqxopt.Chain(eqxopt.SGD(1.0), opt)
    actual, expected, _ = _linesearch_runs(ours, theirs, scale=jnp.asarray(2.0))
    for a, e in zip(actual, expected):
        assert_trees_close(a, e)
    params = nested_tree()
    value, grads = jax.value_and_grad(_loss)(params)
    full = ours.update(
        grads, ours.init(params), params, value=value, grad=grads, value_fn=_loss
    )[0]
    bare = ours.update(grads, ours.init(params), params, value_fn=_loss)[0]
    assert_trees_close(bare, full, rtol=1e-6, atol=1e-7)


def test_backtracking_linesearch_takes_no_step_where_the_loss_is_not_finite():
    params = {"w": jnp.ones(2)}
    opt = eqxopt.ScaleByBacktrackingLinesearch(3)
    updates, state = opt.update(
        {"w": -jnp.ones(2)}, opt.init(params), params, value_fn=_nan_loss
    )
    np.testing.assert_array_equal(updates["w"], 0.0)
    assert float(state.learning_rate) == 0.0 and jnp.isinf(state.decrease_error)


def _nan_loss(params):
    return jnp.sum(params["w"]) * jnp.nan


def test_backtracking_linesearch_refuses_bad_arguments():
    params = {"w": jnp.ones(2)}
    opt = eqxopt.ScaleByBacktrackingLinesearch(3)
    with pytest.raises(TypeError, match="need value_fn="):
        opt.update(params, opt.init(params), params)
    with pytest.raises(ValueError, match="max_backtracking_steps"):
        eqxopt.ScaleByBacktrackingLinesearch(-1)
    with pytest.raises(ValueError, match="decrease_factor"):
        eqxopt.ScaleByBacktrackingLinesearch(3, decrease_factor=0.0)
    with pytest.raises(ValueError, match="max_learning_rate"):
        eqxopt.ScaleByBacktrackingLinesearch(3, max_learning_rate=0.0)
    with pytest.raises(ValueError, match="slope_rtol"):
        eqxopt.ScaleByBacktrackingLinesearch(3, slope_rtol=-1.0)
