"""Wrappers (accumulation, non-finite handling, averaging, plateau, optax interop)
against optax or a NumPy rule; and the composition of all of them training an MLP."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest

import eqxopt
from helpers import (
    assert_histories_close,
    compiles,
    grad_stream,
    nested_tree,
    run_eqxopt,
    run_optax,
)

STEPS = 30
PARAMS = nested_tree()
GRADS = list(grad_stream(PARAMS, STEPS))


def with_nans(grads, steps, value=jnp.nan):
    """`grads` with one element of one leaf set to `value` at each of `steps`."""
    out = list(grads)
    for i in steps:
        out[i] = dict(
            out[i], dense=dict(out[i]["dense"], b=out[i]["dense"]["b"].at[1].set(value))
        )
    return out


# ---------------------------------------------------------------------------------
# MultiSteps


def test_multisteps_matches_optax():
    ours = eqxopt.MultiSteps(eqxopt.Adam(0.05), every_k=3)
    ref = optax.MultiSteps(optax.adam(0.05), every_k_schedule=3)
    history = run_eqxopt(ours, PARAMS, GRADS)
    assert_histories_close(history, run_optax(ref, PARAMS, GRADS))
    # Parameters move only on every third call.
    np.testing.assert_array_equal(history[0]["scale"], PARAMS["scale"])
    np.testing.assert_array_equal(history[1]["scale"], PARAMS["scale"])
    assert not np.array_equal(history[2]["scale"], PARAMS["scale"])


def test_multisteps_sum_matches_optax_and_the_state_reads_well():
    ours = eqxopt.MultiSteps(eqxopt.SGD(0.05, momentum=0.9), every_k=2, mean=False)
    ref = optax.MultiSteps(optax.sgd(0.05, momentum=0.9), 2, use_grad_mean=False)
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )
    state = ours.init(PARAMS)
    assert set(vars(state)) == {
        "mini_step", "gradient_step", "acc", "counts", "inner", "skip_state",
        "skipped",
    }  # fmt: skip
    assert state.skip_state == () and state.skipped is None  # no predicate: no arrays
    _, state = ours.update(GRADS[0], state, PARAMS)
    assert int(state.mini_step) == 1 and int(state.gradient_step) == 0
    assert not bool(ours.has_updated(state))
    np.testing.assert_allclose(state.acc["dense"]["w"], GRADS[0]["dense"]["w"])
    _, state = ours.update(GRADS[1], state, PARAMS)
    assert int(state.mini_step) == 0 and int(state.gradient_step) == 1
    assert bool(ours.has_updated(state))
    assert int(state.inner.step) == 1
    np.testing.assert_array_equal(state.acc["dense"]["w"], 0.0)


@pytest.mark.parametrize("mean", [True, False])
def test_multisteps_leaves_none_gradients_out_of_the_mean(mean):
    """A leaf's mean is over the calls in which it had a gradient: 3, None, 6
    average to 4.5. A leaf with no gradient on the update step gets no update
    then and keeps what it accumulated for the next one. Against plain arithmetic
    over three updates (SGD with learning rate 1 moves by minus the mean)."""
    stream = [
        (3.0, 1.0), (None, 2.0), (6.0, 3.0),  # a: mean(3, 6)
        (2.0, 4.0), (4.0, 5.0), (None, 6.0),  # a: no update, keeps 2, 4
        (9.0, 7.0), (None, 8.0), (6.0, 9.0),  # a: mean(2, 4, 9, 6)
    ]  # fmt: skip
    opt = eqxopt.MultiSteps(eqxopt.SGD(1.0), every_k=3, mean=mean)
    params = {"a": jnp.zeros(()), "b": jnp.zeros(()), "n": 7}
    state = opt.init(params)
    moved = []
    for a, b in stream:
        a = None if a is None else jnp.asarray(a)
        grads = {"a": a, "b": jnp.asarray(b), "n": None}
        new, state = opt.step(grads, state, params)
        moved.append((float(params["a"] - new["a"]), float(params["b"] - new["b"])))
        params = new
    reduce = np.mean if mean else np.sum
    expected = [
        (reduce([3.0, 6.0]), reduce([1.0, 2.0, 3.0])),
        (0.0, reduce([4.0, 5.0, 6.0])),
        (reduce([2.0, 4.0, 9.0, 6.0]), reduce([7.0, 8.0, 9.0])),
    ]
    zero = (0.0, 0.0)
    calls = [step for e in expected for step in (zero, zero, e)]
    np.testing.assert_allclose(moved, calls, rtol=1e-6)
    assert params["n"] == 7


def test_multisteps_keeps_a_float32_accumulator_for_bfloat16():
    params = nested_tree(dtype=jnp.bfloat16)
    state = eqxopt.MultiSteps(eqxopt.SGD(0.1), every_k=4).init(params)
    assert state.acc["dense"]["w"].dtype == jnp.float32


def test_multisteps_errors():
    with pytest.raises(ValueError, match="every_k must be >= 1, got 0"):
        eqxopt.MultiSteps(eqxopt.SGD(0.1), every_k=0)
    with pytest.raises(TypeError, match="every_k must be an integer"):
        eqxopt.MultiSteps(eqxopt.SGD(0.1), every_k=2.0)
    with pytest.raises(TypeError, match="inner must be an eqxopt transform"):
        eqxopt.MultiSteps(optax.sgd(0.1), every_k=2)  # type: ignore[arg-type]
    opt = eqxopt.MultiSteps(eqxopt.SGD(0.1), every_k=2)
    with pytest.raises(TypeError, match="MultiSteps got the keyword argument"):
        opt.update(GRADS[0], opt.init(PARAMS), PARAMS, value=1.0)


# ---------------------------------------------------------------------------------
# Non-finite gradients


def test_skip_non_finite_matches_optax_apply_if_finite():
    # Bad steps 3, then 10-12 (three in a row: the third is past the bound of 2
    # and is applied, as optax does), then an inf at 20.
    grads = with_nans(GRADS, [3, 10, 11, 12])
    grads = with_nans(grads, [20], jnp.inf)
    # SGD with momentum inside: its state shows whether a step was skipped, and
    # it matches optax to rounding (eqxopt.Adam and optax.adam alone drift apart by
    # ~5e-6 over 30 unit-size steps, which would blur what this test checks).
    ours = eqxopt.SkipNonFinite(
        eqxopt.SGD(0.05, momentum=0.9), max_consecutive_errors=2
    )
    ref = optax.apply_if_finite(optax.sgd(0.05, momentum=0.9), max_consecutive_errors=2)
    history = run_eqxopt(ours, PARAMS, grads)
    assert_histories_close(history, run_optax(ref, PARAMS, grads))
    assert bool(jnp.isnan(history[12]["dense"]["b"][1]))  # the give-up step


def test_nan_gradients_never_reach_the_parameters():
    bad = [2, 5, 6, 7, 15]
    grads = with_nans(GRADS, bad)
    opt = eqxopt.SkipNonFinite(eqxopt.Adam(0.05), max_consecutive_errors=10)
    state = opt.init(PARAMS)
    params = PARAMS
    for i, g in enumerate(grads):
        new_params, state = opt.step(g, state, params)
        for leaf in jax.tree.leaves(new_params):
            assert bool(jnp.all(jnp.isfinite(leaf)))
        if i in bad:
            for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(params)):
                np.testing.assert_array_equal(a, b)
            assert not bool(state.last_finite)
        params = new_params
    assert int(state.total_notfinite) == len(bad)
    assert int(state.notfinite_count) == 0
    # The same as Adam run on the good gradients only.
    good = [g for i, g in enumerate(GRADS) if i not in bad]
    expected = run_eqxopt(eqxopt.Adam(0.05), PARAMS, good)[-1]
    assert_histories_close([params], [expected])
    assert int(state.inner.step) == len(good)


def test_apply_if_finite_is_skip_non_finite_and_errors_are_clear():
    opt = eqxopt.apply_if_finite(eqxopt.SGD(0.1), 3)
    assert isinstance(opt, eqxopt.SkipNonFinite)
    assert int(opt.max_consecutive_errors) == 3
    with pytest.raises(ValueError, match="max_consecutive_errors must be >= 0, got -1"):
        eqxopt.SkipNonFinite(eqxopt.SGD(0.1), -1)
    with pytest.raises(TypeError, match="max_consecutive_errors must be an integer"):
        eqxopt.SkipNonFinite(eqxopt.SGD(0.1), 1.5)


def test_zero_nans_matches_optax_and_records_where():
    grads = with_nans(GRADS, [1, 4])
    ours = eqxopt.Chain(eqxopt.ZeroNans(), eqxopt.SGD(0.1))
    ref = optax.chain(optax.zero_nans(), optax.sgd(0.1))
    assert_histories_close(
        run_eqxopt(ours, PARAMS, grads), run_optax(ref, PARAMS, grads)
    )
    opt = eqxopt.ZeroNans()
    updates, state = opt.update(grads[1], opt.init(PARAMS), PARAMS)
    assert bool(state.found_nan["dense"]["b"])
    assert not bool(state.found_nan["dense"]["w"])
    assert float(updates["dense"]["b"][1]) == 0.0


# ---------------------------------------------------------------------------------
# Averaging


def test_param_ema_follows_the_numpy_rule():
    decay = 0.9
    opt = eqxopt.ParamEMA(eqxopt.SGD(0.1, momentum=0.5), decay=decay)
    state = opt.init(PARAMS)
    params = PARAMS
    ema = [np.asarray(p, np.float64) for p in jax.tree.leaves(PARAMS)]
    for g in GRADS:
        params, state = opt.step(g, state, params)
        ema = [
            decay * e + (1 - decay) * np.asarray(p, np.float64)
            for e, p in zip(ema, jax.tree.leaves(params))
        ]
    for got, want in zip(jax.tree.leaves(state.ema), ema):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    # The updates are the inner optimizer's, untouched.
    assert_histories_close(
        [params], [run_optax(optax.sgd(0.1, momentum=0.5), PARAMS, GRADS)[-1]]
    )


def test_param_ema_averaged_model_keeps_dtypes_and_static_leaves():
    model = eqx.nn.MLP(2, 1, 4, 1, key=jax.random.key(0))
    model = jax.tree.map(
        lambda x: x.astype(jnp.bfloat16) if eqx.is_inexact_array(x) else x, model
    )
    opt = eqxopt.ParamEMA(eqxopt.SGD(0.1), decay=0.5)
    state = opt.init(model)
    assert state.ema.layers[0].weight.dtype == jnp.float32
    grads = jax.tree.map(jnp.ones_like, eqx.filter(model, eqx.is_inexact_array))
    model, state = opt.step(grads, state, model)
    averaged = state.averaged(model)
    assert averaged.activation is model.activation
    assert averaged.layers[0].weight.dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="decay must be in"):
        eqxopt.ParamEMA(eqxopt.SGD(0.1), decay=1.5)


def _torch_swa(params, grads, start, every, lr=0.05, momentum=0.9):
    """torch.optim.SGD on the leaves of `params`, with an `AveragedModel` (default,
    arithmetic-mean `avg_fn`) updated after update `k` when `k > start` and
    `(k - start) % every == 0`; the averaged leaves after each step."""
    import torch
    from torch.optim.swa_utils import AveragedModel

    leaves, treedef = jax.tree.flatten(params)
    model = torch.nn.ParameterList(
        [torch.nn.Parameter(torch.tensor(np.asarray(x))) for x in leaves]
    )
    averaged = AveragedModel(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    history = []
    for k, g in enumerate(grads, start=1):
        for t, gl in zip(model.parameters(), jax.tree.leaves(g)):
            t.grad = torch.tensor(np.asarray(gl))
        opt.step()
        if k > start and (k - start) % every == 0:
            averaged.update_parameters(model)
        means = [p.detach().numpy().copy() for p in averaged.module.parameters()]
        history.append((treedef.unflatten(means), int(averaged.n_averaged)))
    return history


@pytest.mark.parametrize(("start", "every"), [(0, 1), (5, 1), (7, 4)])
def test_swa_matches_torch_averaged_model(start, every):
    """The mean after each of 30 steps is torch's `AveragedModel`'s to float32
    rounding (measured max abs difference 4.8e-7, rel 1e-5;
    default tolerances), and so is the snapshot count."""
    opt = eqxopt.SWA(eqxopt.SGD(0.05, momentum=0.9), start=start, every=every)
    state = opt.init(PARAMS)
    params = PARAMS
    ours = []
    for g in GRADS:
        params, state = opt.step(g, state, params)
        ours.append((state.averaged(params), int(state.n_averaged)))
    theirs = _torch_swa(PARAMS, GRADS, start, every)
    assert_histories_close([m for m, _ in ours], [m for m, _ in theirs])
    assert [n for _, n in ours] == [n for _, n in theirs]
    assert ours[-1][1] == (STEPS - start) // every
    # The updates are the inner optimizer's, untouched.
    assert_histories_close(
        [params], [run_optax(optax.sgd(0.05, momentum=0.9), PARAMS, GRADS)[-1]]
    )


def test_swa_update_equals_step_and_new_counts_reuse_the_compiled_step():
    opt = eqxopt.SWA(eqxopt.Adam(0.01), start=3, every=2)
    by_step = run_eqxopt(opt, PARAMS, GRADS[:10])
    state = opt.init(PARAMS)
    params = PARAMS
    for g in GRADS[:10]:
        updates, state = opt.update(g, state, params)
        params = eqxopt.apply_updates(params, updates)
    assert_histories_close([params], [by_step[-1]], rtol=1e-6, atol=1e-7)
    assert int(state.n_averaged) == 3  # after updates 5, 7 and 9
    opt.step(GRADS[0], state, params)
    other = eqxopt.SWA(eqxopt.Adam(0.01), start=1, every=3)
    with compiles() as log:
        other.step(GRADS[0], state, params)
    assert log == []


def test_swa_averaged_model_keeps_dtypes_and_static_leaves():
    model = eqx.nn.MLP(2, 1, 4, 1, key=jax.random.key(0))
    model = jax.tree.map(
        lambda x: x.astype(jnp.bfloat16) if eqx.is_inexact_array(x) else x, model
    )
    opt = eqxopt.SWA(eqxopt.SGD(0.1), start=1)
    state = opt.init(model)
    assert state.mean.layers[0].weight.dtype == jnp.float32
    grads = jax.tree.map(jnp.ones_like, eqx.filter(model, eqx.is_inexact_array))
    first, state = opt.step(grads, state, model)
    # Before the first snapshot the mean is the initial parameters.
    assert int(state.n_averaged) == 0

    def arrays(tree):
        return jax.tree.map(
            lambda x: x.astype(jnp.float32), eqx.filter(tree, eqx.is_inexact_array)
        )

    assert_histories_close([arrays(state.averaged(first))], [arrays(model)])
    second, state = opt.step(grads, state, first)
    averaged = state.averaged(second)
    assert averaged.activation is model.activation
    assert averaged.layers[0].weight.dtype == jnp.bfloat16
    # The first snapshot is the parameters after update 2.
    assert_histories_close([arrays(averaged)], [arrays(second)])


def test_swa_errors_name_the_argument():
    with pytest.raises(ValueError, match="start must be >= 0"):
        eqxopt.SWA(eqxopt.SGD(0.1), start=-1)
    with pytest.raises(ValueError, match="every must be >= 1"):
        eqxopt.SWA(eqxopt.SGD(0.1), every=0)


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_lookahead_matches_optax(alpha):
    ours = eqxopt.Lookahead(eqxopt.SGD(0.05, momentum=0.9), sync_period=4, alpha=alpha)
    tx = optax.lookahead(
        optax.sgd(0.05, momentum=0.9), sync_period=4, slow_step_size=alpha
    )
    fast = optax.LookaheadParams.init_synced(PARAMS)
    state = tx.init(fast)
    update = jax.jit(tx.update)
    expected = []
    with jax.numpy_dtype_promotion("standard"):  # optax promotes implicitly
        for g in GRADS:
            updates, state = update(g, state, fast)
            fast = optax.apply_updates(fast, updates)
            expected.append(fast.fast)
    assert_histories_close(run_eqxopt(ours, PARAMS, GRADS), expected)


def test_lookahead_state_and_errors():
    opt = eqxopt.Lookahead(eqxopt.SGD(0.1), sync_period=2)
    state = opt.init(PARAMS)
    assert set(vars(state)) == {"steps_since_sync", "slow", "inner"}
    params, state = opt.step(GRADS[0], state, PARAMS)
    np.testing.assert_array_equal(state.slow["scale"], PARAMS["scale"])
    params, state = opt.step(GRADS[1], state, params)
    np.testing.assert_allclose(state.slow["scale"], params["scale"], rtol=1e-6)
    with pytest.raises(ValueError, match="sync_period must be >= 1"):
        eqxopt.Lookahead(eqxopt.SGD(0.1), sync_period=0)
    with pytest.raises(ValueError, match="alpha must be in"):
        eqxopt.Lookahead(eqxopt.SGD(0.1), alpha=2.0)


# ---------------------------------------------------------------------------------
# ReduceOnPlateau


def test_reduce_on_plateau_matches_optax_contrib():
    kwargs = dict(
        factor=0.5, patience=2, rtol=1e-3, atol=0.0, cooldown=1, accumulation_size=2
    )
    ours = eqxopt.Chain(
        eqxopt.SGD(0.1), eqxopt.ReduceOnPlateau(**kwargs, min_scale=0.01)
    )
    ref = optax.chain(
        optax.sgd(0.1), optax.contrib.reduce_on_plateau(**kwargs, min_scale=0.01)
    )
    # A loss that improves, then plateaus (with noise), then improves again.
    rng = np.random.default_rng(0)
    losses = np.concatenate(
        [
            np.linspace(2.0, 1.0, 12),
            1.0 + 0.01 * rng.random(36),
            np.linspace(0.9, 0.5, 12),
        ]
    )
    grads = list(grad_stream(PARAMS, len(losses), seed=4))
    state, ref_state = ours.init(PARAMS), ref.init(PARAMS)
    ref_update = jax.jit(ref.update)
    scales = []
    for g, loss in zip(grads, losses):
        value = jnp.asarray(loss, jnp.float32)
        u, state = ours.update(g, state, PARAMS, value=value)
        with jax.numpy_dtype_promotion("standard"):  # optax promotes implicitly
            ru, ref_state = ref_update(g, ref_state, PARAMS, value=value)
        assert_histories_close([u], [ru])
        ours_s, ref_s = state["ReduceOnPlateau"], ref_state[1]
        assert float(ours_s.scale) == float(ref_s.scale)
        assert int(ours_s.plateau_count) == int(ref_s.plateau_count)
        assert int(ours_s.cooldown_count) == int(ref_s.cooldown_count)
        np.testing.assert_allclose(
            float(ours_s.best_value), float(ref_s.best_value), rtol=1e-6
        )
        scales.append(float(ours_s.scale))
    assert min(scales) < 0.2  # it did reduce, several times


def test_reduce_on_plateau_errors():
    opt = eqxopt.ReduceOnPlateau()
    with pytest.raises(TypeError, match="needs the loss: pass value=loss"):
        opt.update(GRADS[0], opt.init(PARAMS), PARAMS)
    with pytest.raises(ValueError, match="must be a scalar"):
        opt.update(GRADS[0], opt.init(PARAMS), PARAMS, value=jnp.ones(2))
    with pytest.raises(ValueError, match="factor must be in"):
        eqxopt.ReduceOnPlateau(factor=1.0)
    with pytest.raises(ValueError, match="rtol and atol must not both be 0"):
        eqxopt.ReduceOnPlateau(rtol=0.0, atol=0.0)
    with pytest.raises(ValueError, match="accumulation_size must be >= 1"):
        eqxopt.ReduceOnPlateau(accumulation_size=0)


# ---------------------------------------------------------------------------------
# optax interop


def test_from_optax_matches_optax_and_chains_with_eqxopt():
    ours = eqxopt.Chain(
        eqxopt.from_optax(optax.clip_by_global_norm(1.0)),
        eqxopt.SGD(0.05, momentum=0.9),
    )
    ref = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.05, momentum=0.9))
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )


def test_from_optax_takes_a_whole_equinox_model():
    model = eqx.nn.MLP(2, 1, 8, 1, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (16, 2))

    def loss_fn(m):
        return jnp.mean((jax.vmap(m)(x)[:, 0] - x[:, 0] * x[:, 1]) ** 2)

    grad_fn = eqx.filter_jit(eqx.filter_grad(loss_fn))
    ours, theirs = eqxopt.from_optax(optax.adamw(0.01)), eqxopt.AdamW(0.01)
    s1, s2 = ours.init(model), theirs.init(model)
    m1 = m2 = model
    for _ in range(10):
        m1, s1 = ours.step(grad_fn(m1), s1, m1)
        m2, s2 = theirs.step(grad_fn(m2), s2, m2)
    assert_histories_close(
        [eqx.filter(m1, eqx.is_array)], [eqx.filter(m2, eqx.is_array)]
    )
    assert loss_fn(m1) < loss_fn(model)


def test_from_optax_takes_a_state_holding_python_numbers():
    # Issue 39, item 8: an optax state holding a plain int crashed the state check.
    traces = []

    def init(params):
        return {"count": 0, "scale": 1.0}

    def update(updates, state, params=None):
        traces.append(None)
        shrink = 1.0 / (1.0 + state["count"])
        scaled = jax.tree.map(lambda u: u * shrink * state["scale"], updates)
        return scaled, {"count": state["count"] + 1, "scale": state["scale"]}

    tx = optax.GradientTransformation(init, update)
    ours = eqxopt.Chain(eqxopt.from_optax(tx), eqxopt.SGD(0.05, momentum=0.9))
    ref = optax.chain(tx, optax.sgd(0.05, momentum=0.9))
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )
    # The numbers are arrays, so a new count does not compile a new step.
    state = ours.init(PARAMS)
    inner = state.states[0].inner
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(inner))
    params = PARAMS
    for i, g in enumerate(GRADS[:6]):
        params, state = ours.step(g, state, params)
        if i == 1:
            traced = len(traces)
    assert len(traces) == traced
    assert int(state.states[0].inner["count"]) == 6


def test_to_optax_works_inside_optax_chain():
    sgd = eqxopt.SGD(0.05, momentum=0.9)
    ours = optax.chain(optax.clip_by_global_norm(1.0), sgd.to_optax())
    ref = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.05, momentum=0.9))
    assert isinstance(ours, optax.GradientTransformation)
    assert_histories_close(
        run_optax(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )
    # The same numbers as the eqxopt chain run natively.
    adam = optax.chain(optax.clip_by_global_norm(1.0), eqxopt.Adam(0.05).to_optax())
    native = eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.Adam(0.05))
    assert_histories_close(
        run_optax(adam, PARAMS, GRADS), run_eqxopt(native, PARAMS, GRADS)
    )


def test_to_optax_passes_the_loss_to_transforms_that_take_it():
    tx = eqxopt.Chain(eqxopt.SGD(0.1), eqxopt.ReduceOnPlateau(patience=0)).to_optax()
    state = tx.init(PARAMS)
    _, state = tx.update(GRADS[0], state, PARAMS, value=1.0, other=3)
    assert float(state["ReduceOnPlateau"].best_value) == 1.0


def test_interop_errors():
    tx = eqxopt.AdamW(0.1).to_optax()
    with pytest.raises(
        TypeError,
        match=r"^AdamW\.update\(grads, state\) was called without params, which are "
        r"read by AdamW's weight_decay: call update\(grads, state, params\)$",
    ):
        tx.update(GRADS[0], tx.init(PARAMS))
    with pytest.raises(TypeError, match=r"tx must be an optax\.GradientTransformation"):
        eqxopt.from_optax(eqxopt.SGD(0.1))
    sgd = optax.sgd(0.1)
    opt = eqxopt.from_optax(optax.GradientTransformation(sgd.init, sgd.update))
    with pytest.raises(TypeError, match="takes no keyword arguments"):
        opt.update(GRADS[0], opt.init(PARAMS), PARAMS, value=1.0)


# ---------------------------------------------------------------------------------
# Everything together


def test_clip_accumulate_partition_skip_around_adamw_trains_an_mlp():
    model = eqx.nn.MLP(3, 2, 16, 2, activation=jax.nn.tanh, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (64, 3))
    y = jnp.stack([jnp.sin(x[:, 0]), x[:, 1] * x[:, 2]], axis=1)

    def loss_fn(m, xb, yb):
        return jnp.mean((jax.vmap(m)(xb) - yb) ** 2)

    opt = eqxopt.SkipNonFinite(
        eqxopt.MultiSteps(
            eqxopt.Chain(
                eqxopt.ClipByGlobalNorm(1.0),
                eqxopt.Partition(
                    {
                        "decay": eqxopt.AdamW(0.02, weight_decay=1e-3),
                        "no_decay": eqxopt.AdamW(0.02, weight_decay=0.0),
                    },
                    labels=lambda leaf: "decay" if leaf.ndim >= 2 else "no_decay",
                ),
                names=("clip", "groups"),
            ),
            every_k=2,
        ),
        max_consecutive_errors=3,
    )
    state = opt.init(model)
    chain_state = state.inner.inner
    assert chain_state.names == ("clip", "groups")
    assert set(chain_state["groups"].groups) == {"decay", "no_decay"}
    assert chain_state["groups"]["no_decay"].mu.layers[0].weight is None

    grad_fn = eqx.filter_jit(eqx.filter_grad(loss_fn))
    start = loss_fn(model, x, y)
    bad_steps = {7, 30}
    for i in range(120):
        xb, yb = x[(i % 4) * 16 : (i % 4 + 1) * 16], y[(i % 4) * 16 : (i % 4 + 1) * 16]
        grads = grad_fn(model, xb, yb)
        if i in bad_steps:
            grads = jax.tree.map(lambda g: g * jnp.nan, grads)
        model, state = opt.step(grads, state, model)
        assert all(
            bool(jnp.all(jnp.isfinite(p)))
            for p in jax.tree.leaves(eqx.filter(model, eqx.is_array))
        )
    assert int(state.total_notfinite) == len(bad_steps)
    assert int(state.inner.gradient_step) == (120 - len(bad_steps)) // 2
    assert loss_fn(model, x, y) < 0.3 * start


def test_reduce_on_plateau_matches_torch_with_patience_one_more():
    # torch reduces once the bad evaluations exceed `patience`, optax and eqxopt
    # once they reach it: eqxopt patience=p+1 is torch patience=p.
    import torch

    rng = np.random.default_rng(1)
    losses = np.concatenate(
        [
            np.linspace(2.0, 1.0, 10),
            1.0 + 0.01 * rng.random(40),
            np.linspace(0.9, 0.5, 10),
        ]
    )
    param = torch.nn.Parameter(torch.zeros(1))
    sgd = torch.optim.SGD([param], lr=1.0)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(
        sgd, factor=0.5, patience=1, threshold=1e-3, cooldown=2, min_lr=0.05
    )
    opt = eqxopt.ReduceOnPlateau(
        factor=0.5, patience=2, rtol=1e-3, cooldown=2, min_scale=0.05
    )
    params = {"w": jnp.zeros(1)}
    state = opt.init(params)
    scales = []
    for loss in losses:
        _, state = opt.update(params, state, params, value=jnp.float32(loss))
        sched.step(float(loss))
        np.testing.assert_allclose(
            float(state.scale), sgd.param_groups[0]["lr"], rtol=1e-6
        )
        scales.append(float(state.scale))
    assert min(scales) == pytest.approx(0.05)


# ---------------------------------------------------------------------------------
# Counter hyperparameters changed between calls: a new object with another value
# reuses the compiled step, and a counter already at or past a lowered value acts on
# the next call (with `==` it never matched again and the wrapper stopped for good).


def segments(values):
    """`(start, end)` of each run of equal consecutive values."""
    start = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            yield start, i
            start = i


def assert_trees_close(a, b, **kw):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **kw)


def run_changing(make, values, grads, stepped, **extra):
    """Steps a fresh `make(values[i])` at call `i`, carrying the state; returns the
    parameters after each call and whether that call `stepped` (from the state).
    Also checks that no call compiled anew after the first."""
    from helpers import compiles

    params, state, history, events = PARAMS, None, [], []
    for i, (value, g) in enumerate(zip(values, grads)):
        opt = make(value)
        state = opt.init(params) if state is None else state
        with compiles() as log:
            params, state = opt.step(g, state, params, **extra)
        history.append(params)
        events.append(bool(stepped(opt, state)))
        assert i == 0 or not log, (i, log)
    return history, events


def assert_agrees_with_fresh_runs(make, values, grads, history, events):
    """In each run of one value, from the first event (update, sync) on, the
    parameters are those of a fresh optimizer with that value started there."""
    for start, end in segments(values):
        first = next((j for j in range(start, end) if events[j]), None)
        if first is None:
            continue
        fresh = make(values[start])
        params = history[first]
        state = fresh.init(params)
        for j in range(first + 1, end):
            params, state = fresh.step(grads[j], state, params)
            assert_trees_close(params, history[j], rtol=1e-6, atol=1e-6)


# Lowered below the count (3 taken, 2), raised (1 taken, 4), lowered to exactly the
# count (2 taken, 3), to 1, and back up.
PERIODS = [4, 4, 4, 2, 2, 2, 2, 4, 4, 4, 5, 5, 3, 3, 3, 3, 1, 1, 3, 3, 3]


def test_multi_steps_every_k_may_change_between_calls():
    lr = 0.1

    def make(k):
        return eqxopt.MultiSteps(eqxopt.SGD(lr), every_k=k)

    grads = list(grad_stream(PARAMS, len(PERIODS), seed=11))
    history, events = run_changing(
        make, PERIODS, grads, lambda opt, s: opt.has_updated(s)
    )
    # The rule: the micro-steps taken so far are averaged into one update as soon as
    # their number reaches the every_k of the call.
    params, taken, expected_events = PARAMS, [], []
    for i, (k, g) in enumerate(zip(PERIODS, grads)):
        taken.append(g)
        expected_events.append(len(taken) >= k)
        if len(taken) >= k:
            mean = jax.tree.map(lambda *gs: sum(gs) / len(gs), *taken)
            params = jax.tree.map(lambda p, m: p - lr * m, params, mean)
            taken = []
        assert_trees_close(history[i], params, rtol=1e-5, atol=1e-6)
    assert events == expected_events
    assert events[3] and events[9] and events[12] and events[16]
    assert_agrees_with_fresh_runs(make, PERIODS, grads, history, events)


def test_lookahead_sync_period_may_change_between_calls():
    lr, alpha = 0.1, 0.5

    def make(k):
        return eqxopt.Lookahead(eqxopt.SGD(lr), sync_period=k, alpha=alpha)

    grads = list(grad_stream(PARAMS, len(PERIODS), seed=12))
    history, events = run_changing(
        make, PERIODS, grads, lambda opt, s: s.steps_since_sync == 0
    )
    # The rule: the slow weights move once the fast steps since the last sync reach
    # the sync_period of the call.
    params, slow, fast_steps, expected_events = PARAMS, PARAMS, 0, []
    for i, (k, g) in enumerate(zip(PERIODS, grads)):
        params = jax.tree.map(lambda p, d: p - lr * d, params, g)
        fast_steps += 1
        expected_events.append(fast_steps >= k)
        if fast_steps >= k:
            slow = jax.tree.map(lambda s, f: s + alpha * (f - s), slow, params)
            params, fast_steps = slow, 0
        assert_trees_close(history[i], params, rtol=1e-5, atol=1e-6)
    assert events == expected_events
    assert_agrees_with_fresh_runs(make, PERIODS, grads, history, events)


def plateau_rule(calls, factor, rtol):
    """The scale after each call, from `ReduceOnPlateau`'s documented rule, for
    `calls` of `(loss, patience, cooldown, accumulation_size)`."""
    scale, best, plateau, cooldown_left, losses, scales = 1.0, np.inf, 0, 0, [], []
    for loss, patience, cooldown, size in calls:
        losses.append(np.float32(loss))
        if len(losses) >= size:
            mean = np.float32(np.mean(np.asarray(losses, np.float64)))
            losses = []
            improved = mean < (1 - rtol) * best
            best, plateau = (mean, 0) if improved else (best, plateau + 1)
            cooldown_left = min(cooldown_left, cooldown)
            if cooldown_left > 0:
                cooldown_left, plateau = cooldown_left - 1, 0
            elif plateau >= patience:
                scale, plateau, cooldown_left = scale * factor, 0, cooldown
        scales.append(scale)
    return scales


@pytest.mark.parametrize(
    "changing", ["patience", "cooldown", "accumulation_size", "all"]
)
def test_reduce_on_plateau_counts_may_change_between_calls(changing):
    factor, rtol = 0.5, 1e-3
    # The loss improves, then stalls for good: every evaluation from the fourth on is
    # a bad one.
    n = 60
    losses = np.concatenate([np.linspace(2.0, 1.0, 6), np.full(n - 6, 1.0)])
    base = {"patience": 2, "cooldown": 1, "accumulation_size": 1}
    lowered = {"patience": 1, "cooldown": 0, "accumulation_size": 1}
    raised = {"patience": 4, "cooldown": 3, "accumulation_size": 3}
    # Lowered at call 13, where the raised phase has a plateau count of 2 (patience
    # 4), a cooldown of 3 just begun (cooldown 3) or 2 losses accumulated (size 3).
    phases = [raised] * 13 + [lowered] * 8 + [raised] * 20 + [base] * 19
    names = list(base) if changing == "all" else [changing]
    hypers = [{**base, **{k: ph[k] for k in names}} for ph in phases]
    calls = [
        (loss, h["patience"], h["cooldown"], h["accumulation_size"])
        for loss, h in zip(losses, hypers)
    ]
    expected = plateau_rule(calls, factor, rtol)

    opt = eqxopt.ReduceOnPlateau(factor=factor, rtol=rtol, **hypers[0])
    state, scales = opt.init(PARAMS), []
    for g, loss, h in zip(GRADS * 2, losses, hypers):
        opt = eqxopt.ReduceOnPlateau(factor=factor, rtol=rtol, **h)
        _, state = opt.update(g, state, PARAMS, value=jnp.float32(loss))
        scales.append(float(state.scale))
    np.testing.assert_allclose(scales, expected, rtol=1e-6)
    # It kept reducing after every change.
    for start, end in ((13, 21), (21, 41), (41, 60)):
        assert scales[end - 1] < scales[start - 1]


# ---------------------------------------------------------------------------------
# Keyword arguments reach the transforms that declare them; scheduled EMA decay


class ScaleByValue(eqxopt.AbstractTransform):
    """Multiplies the gradients by `value=` (a transform that declares a keyword)."""

    keywords = frozenset({"value"})

    def init(self, params):
        return eqxopt.EmptyState()

    def transform(self, grads, state, params, *, value=None):
        return jax.tree.map(lambda g: g * value, grads), state


def test_wrappers_pass_keywords_to_the_transforms_that_declare_them():
    g = GRADS[0]
    nested = eqxopt.SkipNonFinite(
        eqxopt.MultiSteps(eqxopt.Chain(ScaleByValue(), eqxopt.SGD(1.0)), every_k=1)
    )
    assert nested.takes_keyword("value") and not nested.takes_keyword("other")
    updates, _ = nested.update(g, nested.init(PARAMS), PARAMS, value=3.0)
    assert_histories_close([updates], [jax.tree.map(lambda x: -3.0 * x, g)])
    with pytest.raises(TypeError, match=r"SkipNonFinite got the keyword argument"):
        nested.update(g, nested.init(PARAMS), PARAMS, value=3.0, other=1)
    # Each group of a Partition gets only the keywords it takes.
    groups = eqxopt.Partition(
        {"a": eqxopt.Chain(ScaleByValue(), eqxopt.SGD(1.0)), "b": eqxopt.SGD(1.0)},
        lambda leaf: "a" if leaf.ndim >= 2 else "b",
    )
    updates, _ = groups.update(g, groups.init(PARAMS), PARAMS, value=2.0)
    np.testing.assert_allclose(updates["dense"]["w"], -2.0 * g["dense"]["w"])
    np.testing.assert_allclose(updates["dense"]["b"], -g["dense"]["b"])
    with pytest.raises(TypeError, match=r"Lookahead got the keyword argument"):
        opt = eqxopt.Lookahead(eqxopt.SGD(0.1))
        opt.update(g, opt.init(PARAMS), PARAMS, value=1.0)


def test_a_plain_optax_transformation_in_a_chain_gets_no_keywords():
    # Only a GradientTransformationExtraArgs takes extra arguments, as in optax.
    sgd = optax.sgd(0.1)
    plain = eqxopt.from_optax(optax.GradientTransformation(sgd.init, sgd.update))
    assert not plain.takes_keyword("value")
    assert eqxopt.from_optax(optax.sgd(0.1)).takes_keyword("value")
    opt = eqxopt.Chain(plain, eqxopt.ReduceOnPlateau(patience=0))
    _, state = opt.update(GRADS[0], opt.init(PARAMS), PARAMS, value=1.0)
    assert float(state["ReduceOnPlateau"].best_value) == 1.0


def test_param_ema_scheduled_decay_is_read_at_the_step():
    schedule = eqxopt.Linear(0.0, 0.99, STEPS)  # a warm-up of the average

    def run(make_at):
        params, state = PARAMS, None
        for i, g in enumerate(GRADS):
            opt = make_at(i)
            state = opt.init(params) if state is None else state
            params, state = opt.step(g, state, params)
        return state.ema

    def ema_at(decay):
        return lambda i: eqxopt.ParamEMA(eqxopt.SGD(0.1, momentum=0.5), decay=decay)

    scheduled = run(ema_at(schedule))
    assert_histories_close(
        [scheduled],
        [run(lambda i: ema_at(float(schedule(i)))(i))],
        rtol=1e-6,
        atol=1e-7,
    )
    held = run(ema_at(0.0))
    assert not np.allclose(scheduled["dense"]["w"], held["dense"]["w"], atol=1e-2)
