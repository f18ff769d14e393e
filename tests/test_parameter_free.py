"""The parameter-free and adaptive-step optimizers (DoG, DoWG, COCOB, ASGD, MADGRAD,
D-Adaptation, Momo) against optax.contrib, torch.optim.ASGD, or NumPy
transcriptions of the authors' code, over many steps on a nested tree."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqxopt
from helpers import (
    Trajectory,
    assert_histories_close,
    assert_moved,
    assert_trees_close,
    enable_x64,
    grad_stream,
    nested_tree,
    run_eqxopt,
    run_optax,
)

STEPS = 40
PARAMS = nested_tree()
GRADS = list(grad_stream(PARAMS, STEPS))
TARGETS = nested_tree(seed=7)


def loss(params):
    return sum(
        jnp.sum((p - t) ** 2)
        for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(TARGETS))
    )


LOSS_AND_GRAD = jax.jit(jax.value_and_grad(loss))


# optax.contrib's dadapt_adamw and momo_adam raise a Python float to an int32 count,
# which JAX's strict promotion (EQXOPT_TEST_STRICT_PROMOTION=1) refuses: their runs
# take the standard rules; eqxopt's take whatever the session sets.
OPTAX_PROMOTION = jax.numpy_dtype_promotion("standard")


def matrices(params):
    return jax.tree.map(lambda x: x.ndim >= 2, params)


# ------------------------------------------------------------------------------------
# DoG and DoWG
# ------------------------------------------------------------------------------------

# Whole-tree norms, a square root and a division per step in float32.
GLOBAL_RTOL, GLOBAL_ATOL = 1e-4, 1e-5


@pytest.mark.parametrize(
    "kind, value",
    [
        ("heuristic", 1e-2),
        pytest.param("distance", 0.5, marks=pytest.mark.slow),
        pytest.param("learning_rate", 0.1, marks=pytest.mark.slow),
    ],
)
def test_dog_matches_optax(kind, value):
    opt = eqxopt.DoG(init_step=kind, init_value=value)
    tx = optax.contrib.dog(init_step=(kind, value))
    assert_histories_close(
        run_eqxopt(opt, PARAMS, GRADS),
        run_optax(tx, PARAMS, GRADS),
        rtol=GLOBAL_RTOL,
        atol=GLOBAL_ATOL,
    )


def test_dog_with_schedule_weight_decay_and_mask_matches_optax():
    schedule = eqxopt.WarmupCosine(1.0, 0.1, 5, STEPS)
    opt = eqxopt.DoG(
        schedule, init_value=1e-2, eps=1e-6, weight_decay=0.1, mask=matrices
    )
    tx = optax.contrib.dog(
        lambda n: schedule(jnp.asarray(n, jnp.int32)),
        init_step=("heuristic", 1e-2),
        eps=1e-6,
        weight_decay=0.1,
        mask=matrices,
    )
    assert_histories_close(
        run_eqxopt(opt, PARAMS, GRADS),
        run_optax(tx, PARAMS, GRADS),
        rtol=GLOBAL_RTOL,
        atol=GLOBAL_ATOL,
    )


@pytest.mark.parametrize("init", [pytest.param(None, marks=pytest.mark.slow), 0.3])
def test_dowg_matches_optax(init):
    opt = eqxopt.DoWG(init_estim_sq_dist=init, weight_decay=0.05, mask=matrices)
    tx = optax.contrib.dowg(init_estim_sq_dist=init, weight_decay=0.05, mask=matrices)
    assert_histories_close(
        run_eqxopt(opt, PARAMS, GRADS),
        run_optax(tx, PARAMS, GRADS),
        rtol=GLOBAL_RTOL,
        atol=GLOBAL_ATOL,
    )


def test_dog_and_dowg_errors_name_the_argument():
    with pytest.raises(ValueError, match="init_step must be one of"):
        eqxopt.DoG(init_step="guess")
    with pytest.raises(ValueError, match="init_value"):
        eqxopt.DoG(init_value=0.0)
    with pytest.raises(ValueError, match="eps"):
        eqxopt.DoG(eps=-1.0)
    with pytest.raises(ValueError, match="init_estim_sq_dist"):
        eqxopt.DoWG(init_estim_sq_dist=0.0)
    with pytest.raises(ValueError, match="eps"):
        eqxopt.DoWG(eps=0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        eqxopt.DoWG(weight_decay=-0.1)


# ------------------------------------------------------------------------------------
# COCOB
# ------------------------------------------------------------------------------------


def test_cocob_matches_optax():
    opt = eqxopt.COCOB(alpha=50.0, weight_decay=0.01, mask=matrices)
    tx = optax.contrib.cocob(alpha=50.0, weight_decay=0.01, mask=matrices)
    assert_histories_close(run_eqxopt(opt, PARAMS, GRADS), run_optax(tx, PARAMS, GRADS))


@pytest.mark.slow
def test_cocob_with_schedule_matches_optax():
    schedule = eqxopt.WarmupCosine(1.0, 0.5, 5, STEPS)
    opt = eqxopt.COCOB(schedule, eps=1e-6)
    tx = optax.contrib.cocob(lambda n: schedule(jnp.asarray(n, jnp.int32)), eps=1e-6)
    assert_histories_close(run_eqxopt(opt, PARAMS, GRADS), run_optax(tx, PARAMS, GRADS))


def test_cocob_on_float16_leaves_zero_gradient_elements_where_they_are():
    """COCOB's `L` starts at `eps = 1e-8`, which is 0 in float16: kept in the
    parameters' float16 it starts at float16's smallest positive value instead,
    so an element with a zero gradient stays put (no 0 / 0) while the others
    follow optax's float32 run to half a float16 step."""
    params = {"w": jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(3, 4)}
    moving = (jnp.arange(12) % 4 == 0).reshape(3, 4)
    grads = [
        {"w": jnp.where(moving, g["w"], 0.0)} for g in grad_stream(params, 30, seed=3)
    ]
    start = {"w": params["w"].astype(jnp.float16)}
    reference = run_optax(
        optax.contrib.cocob(), {"w": start["w"].astype(jnp.float32)}, grads
    )
    opt = eqxopt.COCOB()
    half, state = start, opt.init(start)
    for step, g in enumerate(grads):
        half, state = opt.step({"w": g["w"].astype(jnp.float16)}, state, half)
        assert half["w"].dtype == jnp.float16
        got = np.asarray(half["w"], np.float32)
        np.testing.assert_array_equal(got[~moving], start["w"][~moving])
        np.testing.assert_allclose(
            got, reference[step]["w"], rtol=0, atol=5e-4, err_msg=f"step {step}"
        )
    moved = np.abs(reference[-1]["w"] - start["w"].astype(jnp.float32))
    assert float(np.max(moved)) > 0.01  # well beyond the tolerance


def test_cocob_errors_name_the_argument():
    with pytest.raises(ValueError, match="alpha"):
        eqxopt.COCOB(alpha=0.0)
    with pytest.raises(ValueError, match="eps"):
        eqxopt.COCOB(eps=0.0)
    with pytest.raises(TypeError, match=r"eps.*not a schedule"):
        eqxopt.COCOB(eps=eqxopt.Constant(1e-8))


# ------------------------------------------------------------------------------------
# ASGD
# ------------------------------------------------------------------------------------


def _torch_asgd_run(params, grads, **kw):
    """torch.optim.ASGD's parameters and averages after each step."""
    import torch

    leaves, treedef = jax.tree.flatten(params)
    tensors = [
        torch.nn.Parameter(torch.tensor(np.asarray(x, np.float32))) for x in leaves
    ]
    opt = torch.optim.ASGD(tensors, **kw)
    history, averages = Trajectory(params), []
    for g in grads:
        for t, gl in zip(tensors, jax.tree.leaves(g)):
            t.grad = torch.tensor(np.asarray(gl, np.float32))
        opt.step()
        history.append(
            jax.tree.unflatten(treedef, [t.detach().numpy().copy() for t in tensors])
        )
        averages.append(
            jax.tree.unflatten(
                treedef, [opt.state[t]["ax"].numpy().copy() for t in tensors]
            )
        )
    return history, averages


@pytest.mark.parametrize(
    "kw",
    [
        dict(lr=0.05, lambd=1e-2, alpha=0.75, t0=5.0, weight_decay=0.01),
        dict(lr=0.1, lambd=0.5, alpha=0.5, t0=0.0),
    ],
)
def test_asgd_matches_torch_parameters_and_averages(kw):
    kw = dict(kw)
    lr = kw.pop("lr")
    opt = eqxopt.ASGD(lr, **kw)
    expected, expected_ax = _torch_asgd_run(PARAMS, GRADS, lr=lr, **kw)
    state = opt.init(PARAMS)
    params, actual, actual_ax = PARAMS, [], []
    for g in GRADS:
        updates, state = opt.update(g, state, params)
        params = eqxopt.apply_updates(params, updates)
        actual.append(params)
        actual_ax.append(opt.eval_params(state, params))
    assert_histories_close(actual, expected)
    assert_histories_close(actual_ax, expected_ax)
    assert_moved(expected_ax[0], expected_ax[-1], rtol=2e-5, atol=2e-6)


def test_asgd_eval_params_are_the_params_before_the_first_step():
    opt = eqxopt.ASGD()
    assert_trees_close(opt.eval_params(opt.init(PARAMS), PARAMS), PARAMS)


def test_asgd_errors_name_the_argument():
    with pytest.raises(ValueError, match="lambd"):
        eqxopt.ASGD(lambd=-1.0)
    with pytest.raises(ValueError, match="alpha"):
        eqxopt.ASGD(alpha=-1.0)
    with pytest.raises(ValueError, match="t0"):
        eqxopt.ASGD(t0=-1.0)


# ------------------------------------------------------------------------------------
# MADGRAD
# ------------------------------------------------------------------------------------


def madgrad_numpy(params, grads, lr, momentum, weight_decay, eps, decouple_decay):
    """A float64 NumPy transcription of `madgrad.MADGRAD.step` (facebookresearch/
    madgrad, dense gradients), the parameters after each step."""
    leaves, treedef = jax.tree.flatten(params)
    p = [np.asarray(x, np.float64) for x in leaves]
    x0 = [x.copy() for x in p]
    gss = [np.zeros_like(x) for x in p]
    s = [np.zeros_like(x) for x in p]
    history = Trajectory(params)
    for k, g_tree in enumerate(grads):
        lr_k = lr + eps
        ck = 1 - momentum
        lamb = lr_k * np.sqrt(k + 1)
        for i, g in enumerate(jax.tree.leaves(g_tree)):
            g = np.asarray(g, np.float64)
            if weight_decay != 0 and not decouple_decay:
                g = g + weight_decay * p[i]
            gss[i] = gss[i] + lamb * g * g
            rms = np.atleast_1d(np.power(gss[i], 1 / 3) + eps).reshape(gss[i].shape)
            if eps == 0:
                rms[rms == 0] = np.inf
            s[i] = s[i] + lamb * g
            p_old = p[i].copy()
            z = x0[i] - s[i] / rms
            p[i] = p[i] * (1 - ck) + ck * z
            if weight_decay != 0 and decouple_decay:
                p[i] = p[i] - lr_k * weight_decay * p_old
        history.append(jax.tree.unflatten(treedef, [x.copy() for x in p]))
    return history


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param(
            dict(momentum=0.9, weight_decay=0.0, eps=1e-6, decouple_decay=False),
            marks=pytest.mark.slow,
        ),
        dict(momentum=0.5, weight_decay=0.1, eps=1e-6, decouple_decay=False),
        dict(momentum=0.0, weight_decay=0.1, eps=0.0, decouple_decay=True),
    ],
)
def test_madgrad_matches_the_authors_algorithm(kw):
    actual = run_eqxopt(eqxopt.MADGRAD(0.05, **kw), PARAMS, GRADS)
    expected = madgrad_numpy(PARAMS, GRADS, 0.05, **kw)
    # float32 against a float64 transcription.
    assert_histories_close(actual, expected, rtol=1e-4, atol=1e-5)


def test_madgrad_matches_optax():
    opt = eqxopt.MADGRAD(0.05, momentum=0.8, weight_decay=0.05, eps=1e-5)
    tx = optax.contrib.madgrad(0.05, momentum=0.8, weight_decay=0.05, eps=1e-5)
    assert_histories_close(run_eqxopt(opt, PARAMS, GRADS), run_optax(tx, PARAMS, GRADS))


def test_madgrad_errors_name_the_argument():
    with pytest.raises(ValueError, match="momentum"):
        eqxopt.MADGRAD(momentum=1.0)
    with pytest.raises(ValueError, match="eps"):
        eqxopt.MADGRAD(eps=-1.0)
    with pytest.raises(ValueError, match="weight_decay"):
        eqxopt.MADGRAD(weight_decay=-1.0)


# ------------------------------------------------------------------------------------
# D-Adaptation
# ------------------------------------------------------------------------------------


def closed_loop(step, params, steps=STEPS):
    """Parameters after each step, gradients of `loss` at the current parameters:
    where `d` grows, as on a real problem (random gradients keep it near `d0`)."""
    history = Trajectory(params)
    for _ in range(steps):
        value, grads = LOSS_AND_GRAD(params)
        params = step(params, grads, value)
        history.append(params)
    return history


def eqxopt_stepper(opt, with_value=False):
    state = [None]

    def step(params, grads, value):
        if state[0] is None:
            state[0] = opt.init(params)
        extra = {"value": value} if with_value else {}
        updates, state[0] = opt.update(grads, state[0], params, **extra)
        return eqxopt.apply_updates(params, updates)

    return step, state


def optax_stepper(tx, with_value=False):
    state = [None]
    update = jax.jit(tx.update)

    def step(params, grads, value):
        if state[0] is None:
            state[0] = tx.init(params)
        extra = {"value": value} if with_value else {}
        with OPTAX_PROMOTION:
            updates, state[0] = update(grads, state[0], params, **extra)
        return optax.apply_updates(params, updates)

    return step, state


def test_dadapt_adamw_matches_optax_on_random_gradients():
    opt = eqxopt.DAdaptAdamW(b1=0.8, b2=0.99, d0=1e-2, weight_decay=0.1)
    tx = optax.contrib.dadapt_adamw(betas=(0.8, 0.99), estim_lr0=1e-2, weight_decay=0.1)
    with OPTAX_PROMOTION:
        expected = run_optax(tx, PARAMS, GRADS)
    assert_histories_close(
        run_eqxopt(opt, PARAMS, GRADS),
        expected,
        rtol=GLOBAL_RTOL,
        atol=GLOBAL_ATOL,
    )


def test_dadapt_adamw_matches_optax_on_a_quadratic_where_d_grows():
    # A schedule from 0 (warmup) would give optax 0 / 0 = NaN at the first step.
    opt = eqxopt.DAdaptAdamW(0.5, d0=1e-4)
    tx = optax.contrib.dadapt_adamw(0.5, estim_lr0=1e-4)
    step, state = eqxopt_stepper(opt)
    actual = closed_loop(step, PARAMS)
    tx_step, tx_state = optax_stepper(tx)
    expected = closed_loop(tx_step, PARAMS)
    assert float(state[0].d) > 1000 * 1e-4  # d adapted
    np.testing.assert_allclose(state[0].d, tx_state[0].estim_lr, rtol=GLOBAL_RTOL)
    # The closed loop doubles a one-ulp difference (sums in another order) every
    # few steps, to 5e-5 by step 40; in float64 (below) the runs agree to 1e-8.
    assert_histories_close(actual, expected, rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_dadapt_adamw_matches_optax_on_a_quadratic_in_float64():
    # The state's d follows the float64 leaves (as every whole-tree statistic),
    # so the closed loop stays on optax's float64 run. optax promotes implicitly.
    with enable_x64(True), jax.numpy_dtype_promotion("standard"):
        params = nested_tree(dtype=jnp.float64)
        targets = nested_tree(seed=7, dtype=jnp.float64)

        def loss64(params):
            return sum(
                jnp.sum((p - t) ** 2)
                for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(targets))
            )

        grad = jax.jit(jax.grad(loss64))
        opt = eqxopt.DAdaptAdamW(0.5, d0=1e-4)
        tx = optax.contrib.dadapt_adamw(0.5, estim_lr0=1e-4)
        ours, theirs = params, params
        state, tx_state = opt.init(params), tx.init(params)
        tx_update = jax.jit(tx.update)
        for _ in range(STEPS):
            updates, state = opt.update(grad(ours), state, ours)
            ours = eqxopt.apply_updates(ours, updates)
            tx_updates, tx_state = tx_update(grad(theirs), tx_state, theirs)
            theirs = optax.apply_updates(theirs, tx_updates)
        assert state.d.dtype == jnp.float64
        assert_trees_close(ours, theirs, rtol=1e-12, atol=1e-12)
        assert_moved(params, theirs, rtol=1e-12, atol=1e-12)


def test_dadapt_adamw_keeps_d_when_every_gradient_is_zero():
    opt = eqxopt.DAdaptAdamW(d0=1e-3)
    state = opt.init(PARAMS)
    zeros = jax.tree.map(jnp.zeros_like, PARAMS)
    updates, state = opt.update(zeros, state, PARAMS)
    assert float(state.d) == pytest.approx(1e-3)
    for u in jax.tree.leaves(updates):
        assert bool(jnp.all(u == 0))


def test_dadapt_errors_name_the_argument():
    with pytest.raises(ValueError, match="b2"):
        eqxopt.DAdaptAdamW(b2=0.0)
    with pytest.raises(ValueError, match="eps"):
        eqxopt.DAdaptAdamW(eps=0.0)
    with pytest.raises(ValueError, match="d0"):
        eqxopt.DAdaptAdamW(d0=0.0)


# ------------------------------------------------------------------------------------
# Momo and MomoAdam
# ------------------------------------------------------------------------------------


def _momo_pair(opt, tx, rtol=GLOBAL_RTOL, atol=GLOBAL_ATOL):
    step, _ = eqxopt_stepper(opt, with_value=True)
    tx_step, _ = optax_stepper(tx, with_value=True)
    assert_histories_close(
        closed_loop(step, PARAMS),
        closed_loop(tx_step, PARAMS),
        rtol=rtol,
        atol=atol,
    )


@pytest.mark.parametrize("adapt", [pytest.param(False, marks=pytest.mark.slow), True])
def test_momo_matches_optax(adapt):
    kw = dict(beta=0.8, weight_decay=0.01, adapt_lower_bound=adapt)
    _momo_pair(
        eqxopt.Momo(0.3, lower_bound=0.5, **kw),
        optax.contrib.momo(0.3, lower_bound=0.5, **kw),
    )


@pytest.mark.parametrize("adapt", [pytest.param(False, marks=pytest.mark.slow), True])
def test_momo_adam_matches_optax(adapt):
    kw = dict(b1=0.8, b2=0.99, weight_decay=0.01, adapt_lower_bound=adapt)
    _momo_pair(
        eqxopt.MomoAdam(0.1, lower_bound=0.5, **kw),
        optax.contrib.momo_adam(0.1, lower_bound=0.5, **kw),
    )


def test_momo_with_schedule_matches_optax():
    schedule = eqxopt.WarmupCosine(0.5, 0.05, 3, STEPS)
    _momo_pair(
        eqxopt.Momo(schedule),
        optax.contrib.momo(lambda n: schedule(jnp.asarray(n, jnp.int32))),
    )


def test_momo_errors():
    opt = eqxopt.Momo()
    state = opt.init(PARAMS)
    with pytest.raises(TypeError, match="Momo needs the loss"):
        opt.update(GRADS[0], state, PARAMS)
    with pytest.raises(ValueError, match="value must be the scalar loss"):
        opt.update(GRADS[0], state, PARAMS, value=jnp.ones(2))
    with pytest.raises(TypeError, match="value must be a float scalar"):
        opt.update(GRADS[0], state, PARAMS, value=jnp.int32(1))
    adam = eqxopt.MomoAdam()
    with pytest.raises(TypeError, match="MomoAdam needs the loss"):
        adam.update(GRADS[0], adam.init(PARAMS), PARAMS)
    with pytest.raises(ValueError, match="beta"):
        eqxopt.Momo(beta=1.0)
    with pytest.raises(ValueError, match="eps"):
        eqxopt.MomoAdam(eps=0.0)
    with pytest.raises(TypeError, match=r"lower_bound.*not a schedule"):
        eqxopt.MomoAdam(lower_bound=eqxopt.Constant(0.0))


def dadapt_sgd_numpy(params, grad_fn, steps, lr, momentum, weight_decay, d0, growth):
    """A float64 NumPy transcription of `dadaptation.DAdaptSGD.step`
    (facebookresearch/dadaptation), gradients from `grad_fn(params)`: the
    parameters after each step, and the final `d`."""
    leaves, treedef = jax.tree.flatten(params)
    p = [np.asarray(x, np.float64) for x in leaves]
    x0 = [x.copy() for x in p]
    s = [np.zeros_like(x) for x in p]
    d, gsq_weighted, g0_norm = d0, 0.0, None
    ck = 1 - momentum
    history = Trajectory(params)
    for k in range(steps):
        tree = jax.tree.unflatten(treedef, [x.astype(np.float32) for x in p])
        grads = [np.asarray(g, np.float64) for g in jax.tree.leaves(grad_fn(tree))]
        if weight_decay != 0:
            grads = [g + weight_decay * x for g, x in zip(grads, p)]
        g_sq = sum(float(np.sum(g * g)) for g in grads)
        if k == 0:
            g0_norm = np.sqrt(g_sq)
        dlr = d * lr / g0_norm
        sk_sq = 0.0
        for i, g in enumerate(grads):
            s[i] = s[i] + dlr * g
            sk_sq += float(np.sum(s[i] * s[i]))
        gsq_weighted = gsq_weighted + dlr * dlr * g_sq
        d_hat = (sk_sq - gsq_weighted) / np.sqrt(sk_sq)
        d = max(d, min(d_hat, d * (np.inf if growth is None else growth)))
        for i in range(len(p)):
            z = x0[i] - s[i]
            p[i] = p[i] * (1 - ck) + ck * z
        history.append(jax.tree.unflatten(treedef, [x.copy() for x in p]))
    return history, d


@pytest.mark.parametrize(
    "kw",
    [
        dict(momentum=0.0, weight_decay=0.0, d0=1e-3, growth_rate=None),
        dict(momentum=0.9, weight_decay=0.01, d0=1e-4, growth_rate=1.5),
    ],
)
def test_dadapt_sgd_matches_the_authors_algorithm_on_a_quadratic(kw):
    grad = jax.jit(jax.grad(loss))
    opt = eqxopt.DAdaptSGD(0.5, **kw)
    step, state = eqxopt_stepper(opt)
    actual = closed_loop(step, PARAMS)
    expected, d = dadapt_sgd_numpy(PARAMS, grad, STEPS, 0.5, *kw.values())
    assert float(state[0].d) > 100 * kw["d0"]  # d adapted
    np.testing.assert_allclose(state[0].d, d, rtol=1e-4)
    # float32 (the gradients at float32 parameters in both) against float64.
    assert_histories_close(actual, expected, rtol=1e-4, atol=1e-5)


def test_dadapt_sgd_waits_for_a_non_zero_gradient():
    opt = eqxopt.DAdaptSGD()
    state = opt.init(PARAMS)
    zeros = jax.tree.map(jnp.zeros_like, PARAMS)
    updates, state = opt.update(zeros, state, PARAMS)
    assert float(state.g0_norm) == 0 and float(state.d) == pytest.approx(1e-6)
    for u in jax.tree.leaves(updates):
        assert bool(jnp.all(u == 0))
    updates, state = opt.update(GRADS[0], state, PARAMS)
    assert float(state.g0_norm) > 0
    assert all(bool(jnp.all(jnp.isfinite(u))) for u in jax.tree.leaves(updates))


def test_dadapt_sgd_errors_name_the_argument():
    with pytest.raises(ValueError, match="growth_rate"):
        eqxopt.DAdaptSGD(growth_rate=0.5)
    with pytest.raises(ValueError, match="momentum"):
        eqxopt.DAdaptSGD(momentum=1.0)
    with pytest.raises(ValueError, match="d0"):
        eqxopt.DAdaptSGD(d0=0.0)


# ------------------------------------------------------------------------------------
# A NaN gradient in the whole-tree statistics
# ------------------------------------------------------------------------------------

NAN_STEP = 2
NAN_PAIRS = {
    "Prodigy": (eqxopt.Prodigy, optax.contrib.prodigy),
    "DAdaptAdamW": (eqxopt.DAdaptAdamW, optax.contrib.dadapt_adamw),
    "DAdaptSGD": (eqxopt.DAdaptSGD, None),
    "Momo": (eqxopt.Momo, optax.contrib.momo),
    "MomoAdam": (eqxopt.MomoAdam, optax.contrib.momo_adam),
}


@pytest.mark.parametrize("name", sorted(NAN_PAIRS))
def test_a_nan_gradient_element_turns_every_parameter_nan_as_optax(name):
    """These optimizers' step size comes from sums over the whole tree (`d`, Momo's
    step). One NaN gradient element makes those sums NaN, and with them every
    parameter, on the step optax's does (DAdaptSGD: the step after, when its `d`
    is used), instead of the sums' guards reading the NaN as "no gradient yet",
    freezing the step size and moving on with one NaN parameter."""
    ours_cls, theirs_fn = NAN_PAIRS[name]
    grads = [jax.tree.map(jnp.array, g) for g in GRADS[:5]]
    grads[NAN_STEP]["dense"]["w"] = grads[NAN_STEP]["dense"]["w"].at[0, 0].set(np.nan)
    takes_loss = name.startswith("Momo")

    def run(step_fn, params):
        nans = []
        for g in grads:
            extra = {"value": loss(params)} if takes_loss else {}
            params = step_fn(g, params, extra)
            nans.append([bool(jnp.any(jnp.isnan(x))) for x in jax.tree.leaves(params)])
        return params, nans

    opt = ours_cls()
    state = [opt.init(PARAMS)]

    def ours(g, p, extra):
        p, state[0] = opt.step(g, state[0], p, **extra)
        return p

    final, nans = run(ours, PARAMS)
    for step, row in enumerate(nans):
        if step < NAN_STEP:
            assert not any(row), f"step {step}"
    assert all(nans[NAN_STEP + 1]), nans[NAN_STEP + 1]
    assert all(bool(jnp.all(jnp.isnan(x))) for x in jax.tree.leaves(final))
    if theirs_fn is not None:
        with OPTAX_PROMOTION:
            tx = theirs_fn()
            tx_state = [tx.init(PARAMS)]

            def theirs(g, p, extra):
                u, tx_state[0] = tx.update(g, tx_state[0], p, **extra)
                return optax.apply_updates(p, u)

            _, their_nans = run(theirs, PARAMS)
        assert nans == their_nans
