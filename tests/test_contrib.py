"""The optax.contrib wrappers and optimizers (Mechanic, ScheduleFree, SAM, Sophia,
GaLore) against `optax.contrib` over 30+ steps, SAM's preference for flat minima,
and their error paths."""

import functools

import jax
import jax.numpy as jnp
import optax
import optax.contrib
import pytest

import eqxopt
from helpers import (
    Trajectory,
    assert_histories_close,
    enable_x64,
    grad_stream,
    nested_tree,
    run_eqxopt,
    run_optax,
)

# optax promotes dtypes implicitly: its reference runs under standard promotion.
OPTAX_PROMOTION = jax.numpy_dtype_promotion("standard")

STEPS = 30
PARAMS = nested_tree()
TARGETS = nested_tree(5)
GRADS = list(grad_stream(PARAMS, STEPS))


def loss(params, targets=TARGETS):
    """A quartic regression towards `targets`: gradients that follow the
    parameters (random gradients give Mechanic nothing to learn from)."""
    return sum(
        jnp.sum((p - t) ** 2 + 0.1 * p**4)
        for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(targets))
    )


grad = jax.jit(jax.grad(loss))


def run_ours_on_loss(opt, steps=STEPS, **extra):
    """`opt.step` on `loss` (its gradient at the current parameters) from
    `PARAMS`: the parameters after each step."""
    state = opt.init(PARAMS)
    params, history = PARAMS, []
    for _ in range(steps):
        params, state = opt.step(grad(params), state, params, **extra)
        history.append(params)
    return history


def run_optax_on_loss(tx, steps=STEPS, **extra):
    """As `run_ours_on_loss` for an optax transformation (a reference run)."""
    state = tx.init(PARAMS)
    update = jax.jit(functools.partial(tx.update, **extra))
    params, history = PARAMS, Trajectory(PARAMS)
    for _ in range(steps):
        with OPTAX_PROMOTION:
            updates, state = update(grad(params), state, params)
            params = optax.apply_updates(params, updates)
        history.append(params)
    return history


# ---------------------------------------------------------------------------------
# Mechanic


@pytest.mark.parametrize(
    "inner, theirs, steps",
    [
        # optax's mechanize around the very same inner optimizer (`to_optax`): the
        # comparison is of Mechanic's own maths. Sign-like inner steps (Adam at
        # learning rate 1, Lion) make the run chaotic after about 35 steps: a
        # rounding then flips a sign and the runs part.
        (eqxopt.Adam(1.0), None, 32),
        (eqxopt.SGD(1.0, momentum=0.9), optax.sgd(1.0, momentum=0.9), 40),
    ],
    ids=["Adam", "SGD-momentum"],
)
def test_mechanic_matches_optax_mechanize(inner, theirs, steps):
    ours = eqxopt.Mechanic(inner, weight_decay=0.1, num_betas=4)
    ref = optax.contrib.mechanize(
        inner.to_optax() if theirs is None else theirs, weight_decay=0.1, num_betas=4
    )
    history = run_ours_on_loss(ours, steps)
    # The parameters are x0 - sum(s) * delta: tree-wide sums (norms, <g, delta>)
    # added in another order, times a scale that grows 10^5-fold.
    assert_histories_close(history, run_optax_on_loss(ref, steps), rtol=1e-4, atol=1e-5)
    # From s_init = 1e-6 the scale grew to fit the problem.
    assert float(loss(history[-1])) < 0.9 * float(loss(PARAMS))


def test_mechanic_errors_name_the_argument():
    with pytest.raises(ValueError, match="num_betas"):
        eqxopt.Mechanic(eqxopt.SGD(1.0), num_betas=0)
    with pytest.raises(TypeError, match="num_betas"):
        eqxopt.Mechanic(eqxopt.SGD(1.0), num_betas=2.5)
    with pytest.raises(ValueError, match="s_init"):
        eqxopt.Mechanic(eqxopt.SGD(1.0), s_init=0.0)
    with pytest.raises(ValueError, match="weight_decay"):
        eqxopt.Mechanic(eqxopt.SGD(1.0), weight_decay=-1.0)
    with pytest.raises(TypeError, match="inner must be an eqxopt transform"):
        eqxopt.Mechanic(optax.sgd(1.0))


# ---------------------------------------------------------------------------------
# ScheduleFree


def test_schedule_free_matches_optax_and_its_eval_params():
    ours = eqxopt.ScheduleFree(eqxopt.Adam(0.05, b1=0.0), b1=0.8)
    ref = optax.contrib.schedule_free(optax.adam(0.05, b1=0.0), 0.05, b1=0.8)
    state, ref_state = ours.init(PARAMS), ref.init(PARAMS)
    params, ref_params = PARAMS, PARAMS
    ref_update = jax.jit(ref.update)
    history, expected = [], Trajectory(PARAMS)
    for g in GRADS:
        params, state = ours.step(g, state, params)
        with OPTAX_PROMOTION:
            updates, ref_state = ref_update(g, ref_state, ref_params)
            ref_params = optax.apply_updates(ref_params, updates)
            ref_eval = optax.contrib.schedule_free_eval_params(ref_state, ref_params)
        history.append(ours.eval_params(state, params))
        expected.append(ref_eval)
    # The evaluation parameters x at every step (and so y, from which they come).
    assert_histories_close(history, expected)
    for leaf in jax.tree.leaves(history[-1]):
        assert leaf.dtype == jnp.float32


@pytest.mark.parametrize(
    "wrapped, fused",
    [
        (eqxopt.SGD(0.1), eqxopt.ScheduleFreeSGD(0.1)),
        (
            eqxopt.AdamW(0.05, b1=0.0, weight_decay=0.1),
            eqxopt.ScheduleFreeAdamW(0.05, weight_decay=0.1),
        ),
    ],
    ids=["SGD", "AdamW"],
)
def test_schedule_free_around_sgd_and_adamw_is_the_fused_optimizer(wrapped, fused):
    ours = eqxopt.ScheduleFree(wrapped)  # the learning rate is the inner one's
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS),
        run_eqxopt(fused, PARAMS, GRADS),
        rtol=1e-6,
        atol=1e-7,
    )


def test_schedule_free_errors_name_the_argument():
    with pytest.raises(TypeError, match=r"ScheduleFree needs learning_rate=.*Chain"):
        eqxopt.ScheduleFree(eqxopt.Chain(eqxopt.SGD(0.1)))
    with pytest.raises(ValueError, match="b1"):
        eqxopt.ScheduleFree(eqxopt.SGD(0.1), b1=0.0)
    with pytest.raises(ValueError, match="weight_lr_power"):
        eqxopt.ScheduleFree(eqxopt.SGD(0.1), weight_lr_power=-1.0)
    with pytest.raises(TypeError, match="b1"):
        eqxopt.ScheduleFree(eqxopt.SGD(0.1), b1=eqxopt.Constant(0.9))


# ---------------------------------------------------------------------------------
# SAM


def test_sam_matches_optax_contrib_sam():
    ours = eqxopt.SAM(eqxopt.SGD(0.05, momentum=0.9), rho=0.1)
    ref = optax.contrib.sam(
        optax.sgd(0.05, momentum=0.9),
        optax.chain(optax.contrib.normalize(), optax.sgd(0.1)),
        sync_period=2,
        opaque_mode=True,
    )
    history = run_ours_on_loss(ours, grad_fn=grad)
    assert_histories_close(
        history, run_optax_on_loss(ref, grad_fn=lambda p, _: grad(p))
    )
    # rho = 0 is the inner optimizer on the gradient at p.
    plain = run_ours_on_loss(eqxopt.SGD(0.05, momentum=0.9), steps=3)
    zero_rho = eqxopt.SAM(eqxopt.SGD(0.05, momentum=0.9), rho=0.0)
    zero = run_ours_on_loss(zero_rho, steps=3, grad_fn=grad)
    assert_histories_close(zero, plain, rtol=0, atol=0)


def test_sam_matches_optax_in_float64_over_many_steps():
    # Issue 39, item 10: SAM summed the squared gradient norm in float32 under x64,
    # 1e-8 relative off each step, and drifted from optax's float64 run.
    with enable_x64(True):
        start = nested_tree(dtype=jnp.float64)
        targets = nested_tree(5, dtype=jnp.float64)
        grad64 = jax.jit(jax.grad(functools.partial(loss, targets=targets)))
        ours = eqxopt.SAM(eqxopt.SGD(0.02, momentum=0.9), rho=0.1)
        ref = optax.contrib.sam(
            optax.sgd(0.02, momentum=0.9),
            optax.chain(optax.contrib.normalize(), optax.sgd(0.1)),
            sync_period=2,
            opaque_mode=True,
        )
        params, state = start, ours.init(start)
        theirs = start
        with OPTAX_PROMOTION:
            ref_state = ref.init(start)
            update = jax.jit(
                functools.partial(ref.update, grad_fn=lambda p, _: grad64(p))
            )
        history, ref_history = [], Trajectory(start)
        # 200 steps: later the run circles the minimum, where the direction of a
        # tiny gradient makes rounding grow in any two implementations.
        for _ in range(200):
            params, state = ours.step(grad64(params), state, params, grad_fn=grad64)
            with OPTAX_PROMOTION:
                updates, ref_state = update(grad64(theirs), ref_state, theirs)
                theirs = optax.apply_updates(theirs, updates)
            history.append(params)
            ref_history.append(theirs)
        for leaf in jax.tree.leaves(params):
            assert leaf.dtype == jnp.float64
    # A float32 norm is 4e-10 off at the first step and 1e-8 by the 200th.
    assert_histories_close(history, ref_history, rtol=1e-11, atol=1e-13)


def product_loss(p):
    """`(a * b - 1)**2`: a valley of minima `a * b = 1` whose sharpness (the
    Hessian's trace there, `2 * (a**2 + b**2)`) is least at `a = b = 1`."""
    return (p["a"] * p["b"] - 1.0) ** 2


def test_sam_leaves_a_sharp_minimum_for_the_flattest_where_sgd_stays():
    grad_fn = jax.jit(jax.grad(product_loss))  # also called outside the step
    start = {"a": jnp.float32(4.0), "b": jnp.float32(0.2)}  # near a sharp minimum
    ends = {}
    for rho in (0.0, 0.2):
        opt = eqxopt.SAM(eqxopt.SGD(0.05), rho=rho)
        params, state = start, opt.init(start)
        for _ in range(300):
            params, state = opt.step(grad_fn(params), state, params, grad_fn=grad_fn)
        hessian = jax.hessian(product_loss)(params)
        sharpness = float(hessian["a"]["a"] + hessian["b"]["b"])
        ends[rho] = (float(product_loss(params)), sharpness)
    sgd_loss, sgd_sharpness = ends[0.0]
    sam_loss, sam_sharpness = ends[0.2]
    assert sgd_loss < 1e-6 and sgd_sharpness > 30.0  # SGD: the sharp minimum
    assert sam_loss < 1e-2 and sam_sharpness < 5.0  # SAM: near the flattest (4)


def test_sam_errors_name_what_is_missing():
    opt = eqxopt.SAM(eqxopt.SGD(0.1))
    state = opt.init(PARAMS)
    with pytest.raises(TypeError, match=r"SAM\.update/step need grad_fn="):
        opt.update(GRADS[0], state, PARAMS)
    with pytest.raises(ValueError, match="rho"):
        eqxopt.SAM(eqxopt.SGD(0.1), rho=-1.0)
    with pytest.raises(TypeError, match=r"SAM got the keyword argument.*'value'"):
        opt.update(GRADS[0], state, PARAMS, grad_fn=grad, value=1.0)


# ---------------------------------------------------------------------------------
# Sophia


def test_sophia_h_matches_optax_sophia_with_the_same_signs():
    ours = eqxopt.Sophia(0.05, weight_decay=0.01, gamma=0.05, update_interval=3)
    ref = optax.contrib.sophia(0.05, weight_decay=0.01, gamma=0.05, update_interval=3)
    # The batch (here the targets) goes in fn_args; obj_fn stays the same function.
    history = run_ours_on_loss(ours, obj_fn=loss, fn_args=(TARGETS,))
    assert_histories_close(history, run_optax_on_loss(ref, obj_fn=loss))
    assert float(loss(history[-1])) < 0.25 * float(loss(PARAMS))


def test_sophia_h_steps_leaves_the_loss_ignores_or_is_linear_in_as_optax():
    # The Hessian-vector product of such leaves is a symbolic zero: their estimate
    # is 0 (optax's too), so `nu` stays 0 and the clip bounds their steps.
    params = {
        "quartic": jnp.array([[1.0, -2.0], [0.5, 3.0]]),
        "linear": jnp.array([1.5, -1.0, 0.25]),
        "ignored": jnp.array([0.5, 0.25]),
    }

    def partial_loss(p):
        return jnp.sum((p["quartic"] - 1.0) ** 4) + jnp.sum(3.0 * p["linear"])

    partial_grad = jax.jit(jax.grad(partial_loss))
    ours = eqxopt.Sophia(0.05, weight_decay=0.01, update_interval=2)
    ref = optax.contrib.sophia(0.05, weight_decay=0.01, update_interval=2)
    ref_update = jax.jit(functools.partial(ref.update, obj_fn=partial_loss))
    state, ref_state = ours.init(params), ref.init(params)
    ours_params, ref_params = params, params
    history, expected = [], Trajectory(params)
    for _ in range(6):
        g = partial_grad(ours_params)
        ours_params, state = ours.step(g, state, ours_params, obj_fn=partial_loss)
        with OPTAX_PROMOTION:
            updates, ref_state = ref_update(
                partial_grad(ref_params), ref_state, ref_params
            )
            ref_params = optax.apply_updates(ref_params, updates)
        history.append(ours_params)
        expected.append(ref_params)
    assert_histories_close(history, expected)
    assert float(jnp.max(state.nu["linear"])) == 0.0
    assert float(jnp.max(state.nu["ignored"])) == 0.0


def exact_diagonal(params):
    """The Hessian's diagonal of `loss`: 2 + 1.2 * p**2."""
    return jax.tree.map(lambda p: 2.0 + 1.2 * p**2, params)


def test_sophia_with_an_estimate_of_your_own_matches_optax():
    def update(updates, state, params=None, **extra):
        del updates, extra
        return exact_diagonal(params), state

    estimator = optax.GradientTransformationExtraArgs(lambda p: (), update)
    matrices = jax.tree.map(lambda p: p.ndim >= 2, PARAMS)
    ours = eqxopt.Sophia(0.05, clip_threshold=0.5, mask=matrices)
    ref = optax.contrib.sophia(
        0.05,
        clip_threshold=0.5,
        hessian_diagonal_fn=estimator,
        weight_decay_mask=matrices,
    )
    state, ref_state = ours.init(PARAMS), ref.init(PARAMS)
    ref_update = jax.jit(ref.update)
    params, ref_params = PARAMS, PARAMS
    history, expected = [], Trajectory(PARAMS)
    for _ in range(STEPS):
        params, state = ours.step(
            grad(params), state, params, hessian=exact_diagonal(params)
        )
        with OPTAX_PROMOTION:
            updates, ref_state = ref_update(grad(ref_params), ref_state, ref_params)
            ref_params = optax.apply_updates(ref_params, updates)
        history.append(params)
        expected.append(ref_params)
    assert_histories_close(history, expected)


def test_sophia_errors_name_what_is_wrong():
    opt = eqxopt.Sophia(0.05)
    state = opt.init(PARAMS)
    with pytest.raises(TypeError, match=r"Sophia\.update/step need exactly one of"):
        opt.update(GRADS[0], state, PARAMS)
    with pytest.raises(TypeError, match=r"Sophia\.update/step need exactly one of"):
        opt.update(GRADS[0], state, PARAMS, obj_fn=loss, hessian=exact_diagonal(PARAMS))
    with pytest.raises(ValueError, match="update_interval"):
        eqxopt.Sophia(0.05, update_interval=0)
    with pytest.raises(ValueError, match="clip_threshold"):
        eqxopt.Sophia(0.05, clip_threshold=0.0)
    with pytest.raises(TypeError, match="seed must be an integer seed"):
        eqxopt.Sophia(0.05, seed="zero")
    complex_params = {"w": jnp.ones(3, jnp.complex64)}
    with pytest.raises(TypeError, match=r"Sophia supports real .* params\['w'\]"):
        opt.init(complex_params)


# ---------------------------------------------------------------------------------
# GaLore


def test_galore_matches_optax_galore():
    # Tall and wide matrices (projected from the left and from the right, the
    # projectors refreshed at steps 0, 7, 14, ...), and PARAMS' other leaves
    # (plain Adam).
    params = {
        "tall": jax.random.normal(jax.random.key(0), (8, 5)),
        "wide": jax.random.normal(jax.random.key(1), (3, 6)),
        **PARAMS,
    }
    grads = list(grad_stream(params, STEPS))
    ours = eqxopt.GaLore(0.05, rank=2, update_proj_gap=7, scale=0.5, weight_decay=0.01)
    ref = optax.contrib.galore(
        0.05, rank=2, update_proj_gap=7, scale=0.5, weight_decay=0.01
    )
    # Adam's steps of nearly constant size: the one-ulp difference in each step of
    # the non-matrix leaves (XLA fuses the moment updates its own way) adds up.
    assert_histories_close(
        run_eqxopt(ours, params, grads),
        run_optax(ref, params, grads),
        rtol=2e-5,
        atol=1e-5,
    )
    state = ours.init(params)
    assert state.mu["tall"].shape == (2, 5) and state.mu["wide"].shape == (3, 2)
    assert state.projector["tall"].shape == (8, 2)
    assert state.projector["wide"].shape == (6, 2)
    assert state.projector["scale"] is None and state.mu["scale"].shape == ()


def test_galore_errors_name_the_argument_or_leaf():
    with pytest.raises(ValueError, match="rank"):
        eqxopt.GaLore(0.05, rank=0)
    with pytest.raises(TypeError, match="rank"):
        eqxopt.GaLore(0.05, rank=2.0)
    with pytest.raises(ValueError, match="update_proj_gap"):
        eqxopt.GaLore(0.05, update_proj_gap=0)
    with pytest.raises(TypeError, match=r"GaLore supports real .* params\['w'\]"):
        eqxopt.GaLore(0.05).init({"w": jnp.ones((2, 2), jnp.complex64)})
