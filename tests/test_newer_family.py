"""Muon, Schedule-Free SGD/AdamW and Prodigy against optax.contrib; SOAP against a
NumPy transcription of the authors' implementation."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqxopt
from eqxopt._optimizers._preconditioned._muon import newton_schulz
from helpers import (
    Trajectory,
    assert_histories_close,
    assert_moved,
    assert_trees_close,
    grad_stream,
    nested_tree,
    run_eqxopt,
    run_optax,
)

STEPS = 30
PARAMS = nested_tree()
GRADS = list(grad_stream(PARAMS, STEPS))
TARGETS = nested_tree(seed=7)


def quadratic(params):
    return sum(
        jnp.sum((p - t) ** 2)
        for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(TARGETS))
    )


QUADRATIC_GRAD = jax.jit(jax.grad(quadratic))


def closed_loop_eqxopt(opt, params, steps=STEPS):
    """Parameters after each step, gradients taken at the current parameters."""
    state = opt.init(params)
    history = []
    for _ in range(steps):
        params, state = opt.step(QUADRATIC_GRAD(params), state, params)
        history.append(params)
    return history, state


def closed_loop_optax(tx, params, steps=STEPS):
    # optax promotes implicitly: JAX's standard promotion for the reference.
    with jax.numpy_dtype_promotion("standard"):
        state = tx.init(params)
        update = jax.jit(tx.update)
        history = []
        for _ in range(steps):
            updates, state = update(QUADRATIC_GRAD(params), state, params)
            params = optax.apply_updates(params, updates)
            history.append(params)
    return history, state


# ------------------------------------------------------------------------------------
# Muon
# ------------------------------------------------------------------------------------


@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_matches_optax(nesterov):
    kw = dict(weight_decay=0.1, adam_weight_decay=0.05, nesterov=nesterov)
    actual = run_eqxopt(eqxopt.Muon(0.02, **kw), PARAMS, GRADS)
    expected = run_optax(optax.contrib.muon(0.02, **kw), PARAMS, GRADS)
    assert_histories_close(actual, expected)


def test_muon_with_schedule_and_other_hyperparameters_matches_optax():
    opt = eqxopt.Muon(
        eqxopt.WarmupCosine(0.05, 0.005, 3, 50),
        beta=0.9,
        ns_steps=4,
        eps=1e-7,
        adam_b1=0.8,
        adam_b2=0.99,
        adam_eps_root=1e-8,
        adam_learning_rate=0.01,
        consistent_rms=0.2,
    )
    tx = optax.contrib.muon(
        optax.warmup_cosine_decay_schedule(0.0, 0.05, 3, 50, 0.005),
        beta=0.9,
        ns_steps=4,
        eps=1e-7,
        adam_b1=0.8,
        adam_b2=0.99,
        adam_eps_root=1e-8,
        adam_learning_rate=0.01,
        consistent_rms=0.2,
    )
    assert_histories_close(run_eqxopt(opt, PARAMS, GRADS), run_optax(tx, PARAMS, GRADS))


def test_muon_mask_function_stacks_of_matrices_match_optax_dimension_numbers():
    # The (2, 3, 2) leaf as a stack of two 3x2 matrices; the (3, 4) one via AdamW.
    def muon_mask(params):
        mask = jax.tree.map(lambda p: False, params)
        mask["layers"][0]["w"] = True
        return mask

    dims = optax.contrib.MuonDimensionNumbers(reduction_axis=1, output_axis=2)

    def optax_dims(params):
        spec = jax.tree.map(lambda p: None, params)
        spec["layers"][0]["w"] = dims
        return spec

    actual = run_eqxopt(eqxopt.Muon(0.02, muon_mask=muon_mask), PARAMS, GRADS)
    expected = run_optax(
        optax.contrib.muon(0.02, muon_weight_dimension_numbers=optax_dims),
        PARAMS,
        GRADS,
    )
    assert_histories_close(actual, expected)


def test_muon_mask_equinox_module_is_read_as_a_tree_not_called():
    class Net(eqx.Module):
        w: jax.Array
        b: jax.Array

        def __call__(self, x):  # a mask function would be called; this must not be
            raise AssertionError("the mask module was called")

    params = Net(w=jnp.ones((3, 4)), b=jnp.ones(4))
    opt = eqxopt.Muon(0.1, nesterov=False, muon_mask=Net(w=False, b=False))
    state = opt.init(params)
    assert state.nu.w is not None and state.nu.b is not None  # both via AdamW
    grads = Net(w=jnp.full((3, 4), 0.5), b=jnp.full(4, 0.5))
    updates, _ = opt.update(grads, state, params)
    # AdamW's first step is -lr * sign(g) elementwise; Muon's would not be.
    np.testing.assert_allclose(updates.w, -0.1 * np.ones((3, 4)), rtol=1e-5)


def test_muon_default_uses_adamw_for_non_matrices_and_muon_state_has_no_nu():
    state = eqxopt.Muon(0.1).init(PARAMS)
    assert state.nu["dense"]["w"] is None
    assert state.nu["layers"][0]["w"] is not None  # 3-D: AdamW unless masked in
    assert state.nu["dense"]["b"] is not None
    assert state.mu["dense"]["w"].shape == (3, 4)


def test_newton_schulz_roughly_orthogonalises():
    x = jax.random.normal(jax.random.key(0), (2, 8, 5))
    o = newton_schulz(
        x, jnp.broadcast_to(jnp.asarray((3.4445, -4.775, 2.0315)), (5, 3))
    )
    singular = np.linalg.svd(np.asarray(o), compute_uv=False)
    assert o.shape == x.shape
    assert np.all((singular > 0.5) & (singular < 1.5))


def test_muon_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"muon_mask selects params\['dense'\]\['b'\]"):
        eqxopt.Muon(0.1, muon_mask=lambda p: jax.tree.map(lambda _: True, p)).init(
            PARAMS
        )
    with pytest.raises(ValueError, match=r"ns_coeffs must have shape \(3,\)"):
        eqxopt.Muon(0.1, ns_coeffs=(1.0, 2.0))
    with pytest.raises(ValueError, match="ns_coeffs must be finite"):
        eqxopt.Muon(0.1, ns_coeffs=(1.0, float("nan"), 2.0))
    with pytest.raises(ValueError, match="ns_steps must be an int >= 1"):
        eqxopt.Muon(0.1, ns_steps=0)
    with pytest.raises(ValueError, match=r"beta must be in \[0.0, 1.0\)"):
        eqxopt.Muon(0.1, beta=1.0)
    with pytest.raises(ValueError, match="consistent_rms"):
        eqxopt.Muon(0.1, consistent_rms=0.0)
    with pytest.raises(ValueError, match="adam_b2"):
        eqxopt.Muon(0.1, adam_b2=1.0)


# ------------------------------------------------------------------------------------
# Schedule-Free
# ------------------------------------------------------------------------------------


def _lockstep(opt, tx, params=PARAMS):
    """Steps both side by side; compares the parameters and the evaluation
    parameters after every step."""
    state, tx_state = opt.init(params), tx.init(params)
    mine, theirs = params, params
    update = jax.jit(tx.update)
    # optax promotes implicitly: JAX's standard promotion for the reference.
    standard = functools.partial(jax.numpy_dtype_promotion, "standard")
    for g in GRADS:
        updates, state = opt.update(g, state, mine)
        mine = eqxopt.apply_updates(mine, updates)
        with standard():
            tx_updates, tx_state = update(g, tx_state, theirs)
            theirs = optax.apply_updates(theirs, tx_updates)
            their_eval = optax.contrib.schedule_free_eval_params(tx_state, theirs)
        assert_trees_close(mine, theirs)
        assert_trees_close(opt.eval_params(state, mine), their_eval)
    return state


def test_schedule_free_adamw_and_eval_params_match_optax():
    _lockstep(
        eqxopt.ScheduleFreeAdamW(0.05, b1=0.85, b2=0.99, weight_decay=0.1),
        optax.contrib.schedule_free_adamw(0.05, b1=0.85, b2=0.99, weight_decay=0.1),
    )


def test_schedule_free_sgd_and_eval_params_match_optax():
    state = _lockstep(
        eqxopt.ScheduleFreeSGD(0.05, weight_decay=0.1, weight_lr_power=1.0),
        optax.contrib.schedule_free_sgd(0.05, weight_decay=0.1, weight_lr_power=1.0),
    )
    assert int(state.step) == STEPS and state.nu is None


def test_schedule_free_adamw_with_a_warmup_schedule():
    # eqxopt evaluates the schedule once, at `step`, for the step and the averaging
    # weight; optax's wrapper evaluates its own at `step + 1`. Shifting optax's
    # wrapper schedule by one makes the two the same algorithm.
    sched = optax.warmup_cosine_decay_schedule(0.0, 0.05, 5, 40, 0.01)
    base = optax.chain(
        optax.scale_by_rms(0.999, 1e-8, eps_in_sqrt=False, bias_correction=True),
        optax.add_decayed_weights(0.01),
        optax.scale_by_learning_rate(sched),
    )
    tx = optax.contrib.schedule_free(base, lambda count: sched(count - 1), b1=0.9)
    opt = eqxopt.ScheduleFreeAdamW(
        eqxopt.WarmupCosine(0.05, 0.01, 5, 40), weight_decay=0.01
    )
    _lockstep(opt, tx)


def test_schedule_free_eval_params_keep_dtype_and_pass_non_float_leaves():
    params = {"w": jnp.ones(3, jnp.bfloat16), "n": jnp.arange(2), "f": jnp.tanh}
    opt = eqxopt.ScheduleFreeSGD(0.1)
    grads = {"w": jnp.ones(3, jnp.bfloat16), "n": None, "f": None}
    state = opt.init(params)
    params, state = opt.step(grads, state, params)
    x = opt.eval_params(state, params)
    assert x["w"].dtype == jnp.bfloat16 and x["f"] is jnp.tanh
    np.testing.assert_array_equal(x["n"], params["n"])


def test_schedule_free_converges_on_a_quadratic():
    # From a loss of 44: SGD's averaged iterate reaches ~1e-11 in 200 steps, AdamW's
    # (a fixed step size of about lr per coordinate) ~4e-3.
    for opt, bound in (
        (eqxopt.ScheduleFreeSGD(0.2), 1e-6),
        (eqxopt.ScheduleFreeAdamW(0.1), 1e-2),
    ):
        history, state = closed_loop_eqxopt(opt, PARAMS, steps=200)
        assert float(quadratic(opt.eval_params(state, history[-1]))) < bound


def test_schedule_free_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"b1 must be in \(0.0, 1.0\]"):
        eqxopt.ScheduleFreeAdamW(0.1, b1=0.0)
    with pytest.raises(ValueError, match="weight_lr_power"):
        eqxopt.ScheduleFreeSGD(0.1, weight_lr_power=-1.0)
    with pytest.raises(ValueError, match="learning_rate"):
        eqxopt.ScheduleFreeSGD(-0.1)
    with pytest.raises(TypeError, match="z_dtype"):
        eqxopt.ScheduleFreeSGD(0.1, z_dtype=jnp.int32)


# ------------------------------------------------------------------------------------
# Prodigy
# ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mine,theirs",
    [
        (dict(weight_decay=0.1), dict(weight_decay=0.1)),
        (
            dict(b3=0.9, d0=1e-3, d_coef=0.5, safeguard_warmup=True, b1=0.8),
            dict(
                beta3=0.9,
                estim_lr0=1e-3,
                estim_lr_coef=0.5,
                safeguard_warmup=True,
                betas=(0.8, 0.999),
            ),
        ),
    ],
    ids=["default", "options"],
)
def test_prodigy_matches_optax(mine, theirs):
    # Random gradients (d stays near d0) and gradients of a quadratic (d grows by
    # orders of magnitude) both exercise the estimate of d. With the default
    # d0 = 1e-6, random gradients move the parameters by a few tolerances only (the
    # comparison would prove nothing), so that case is compared in the closed loop.
    if "d0" in mine:
        assert_histories_close(
            run_eqxopt(eqxopt.Prodigy(**mine), PARAMS, GRADS),
            run_optax(optax.contrib.prodigy(**theirs), PARAMS, GRADS),
        )
    actual, state = closed_loop_eqxopt(eqxopt.Prodigy(**mine), PARAMS)
    expected, tx_state = closed_loop_optax(optax.contrib.prodigy(**theirs), PARAMS)
    # In the closed loop d grows more than 1e4-fold, and the whole-tree sums behind
    # it are added in another order than optax's: a few elements near zero differ
    # by ~3e-6 after 30 steps, hence atol 1e-5.
    assert_histories_close(actual, expected, atol=1e-5)
    assert_moved(PARAMS, expected[-1], rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(state.d, tx_state.estim_lr, rtol=1e-4)
    assert float(state.d) > 1e-3  # the estimate did grow from 1e-6 / 1e-3


def test_prodigy_zero_gradients_keep_d_finite():
    opt = eqxopt.Prodigy()
    state = opt.init(PARAMS)
    zeros = jax.tree.map(jnp.zeros_like, PARAMS)
    params, state = opt.step(zeros, state, PARAMS)
    assert float(state.d) == pytest.approx(1e-6)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(PARAMS)):
        np.testing.assert_array_equal(a, b)


def test_prodigy_converges_on_a_quadratic():
    history, _ = closed_loop_eqxopt(eqxopt.Prodigy(), PARAMS, steps=150)
    assert float(quadratic(history[-1])) < 1e-2 * float(quadratic(PARAMS))


def test_prodigy_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"d0 must be in \(0.0, inf\]"):
        eqxopt.Prodigy(d0=0.0)
    with pytest.raises(ValueError, match="b3"):
        eqxopt.Prodigy(b3=1.0)
    with pytest.raises(ValueError, match="d_coef"):
        eqxopt.Prodigy(d_coef=-1.0)


# ------------------------------------------------------------------------------------
# SOAP (no reference library: the authors' PyTorch code transcribed to NumPy)
# ------------------------------------------------------------------------------------


def soap_numpy(
    params,
    grads,
    learning_rate=3e-3,
    b1=0.95,
    b2=0.95,
    shampoo_beta=None,
    eps=1e-8,
    weight_decay=0.01,
    precondition_frequency=10,
    max_precond_dim=10000,
    precondition_1d=False,
):
    """The authors' SOAP (github.com/nikhilvyas/SOAP, soap.py), transcribed for a
    list of float64 NumPy arrays; returns the parameters after each step."""
    lr = learning_rate
    sb = b2 if shampoo_beta is None else shampoo_beta
    params = [np.asarray(p, np.float64).copy() for p in params]
    states = [{} for _ in params]
    history = []

    def project(x, Q):
        for mat in Q:
            x = (
                np.moveaxis(x, 0, -1)
                if mat is None
                else np.tensordot(x, mat, axes=([0], [0]))
            )
        return x

    def project_back(x, Q):
        for mat in Q:
            x = (
                np.moveaxis(x, 0, -1)
                if mat is None
                else np.tensordot(x, mat, axes=([0], [1]))
            )
        return x

    def update_preconditioner(grad, st):
        if st["Q"] is not None:
            st["exp_avg"] = project_back(st["exp_avg"], st["Q"])
        for idx, m in enumerate(st["GG"]):
            if m is not None:
                others = [i for i in range(grad.ndim) if i != idx]
                outer = np.tensordot(grad, grad, axes=(others, others))
                st["GG"][idx] = m + (1 - sb) * (outer - m)  # torch lerp_
        if st["Q"] is None:
            st["Q"] = [
                None
                if m is None
                else np.flip(np.linalg.eigh(m + 1e-30 * np.eye(m.shape[0]))[1], 1)
                for m in st["GG"]
            ]
        if st["step"] > 0 and st["step"] % precondition_frequency == 0:
            exp_avg_sq = st["exp_avg_sq"]
            final = []
            for ind, (m, o) in enumerate(zip(st["GG"], st["Q"])):
                if m is None:
                    final.append(None)
                    continue
                est_eig = np.diag(o.T @ m @ o)
                sort_idx = np.argsort(-est_eig, kind="stable")
                exp_avg_sq = np.take(exp_avg_sq, sort_idx, axis=ind)
                o = o[:, sort_idx]
                final.append(np.linalg.qr(m @ o)[0])
            st["exp_avg_sq"] = exp_avg_sq
            st["Q"] = final
        if st["step"] > 0:
            st["exp_avg"] = project(st["exp_avg"], st["Q"])

    for step_grads in grads:
        new = []
        for p, g, st in zip(params, step_grads, states):
            g = np.asarray(g, np.float64)
            if "step" not in st:
                st["step"] = 0
                st["exp_avg"] = np.zeros_like(g)
                st["exp_avg_sq"] = np.zeros_like(g)
                if g.ndim == 1 and (
                    not precondition_1d or g.shape[0] > max_precond_dim
                ):
                    st["GG"] = [None]
                else:
                    st["GG"] = [
                        np.zeros((d, d)) if d <= max_precond_dim else None
                        for d in g.shape
                    ]
                st["Q"] = None
                update_preconditioner(g, st)
                new.append(p)
                continue
            g_proj = project(g, st["Q"])
            st["step"] += 1
            st["exp_avg"] = b1 * st["exp_avg"] + (1 - b1) * g_proj
            st["exp_avg_sq"] = b2 * st["exp_avg_sq"] + (1 - b2) * g_proj**2
            denom = np.sqrt(st["exp_avg_sq"]) + eps
            step_size = lr * np.sqrt(1 - b2 ** st["step"]) / (1 - b1 ** st["step"])
            norm_grad = project_back(st["exp_avg"] / denom, st["Q"])
            p = p - step_size * norm_grad
            p = p - lr * weight_decay * p
            update_preconditioner(g, st)
            new.append(p)
        params = new
        history.append([q.copy() for q in params])
    return history


@pytest.mark.parametrize(
    "kw",
    [
        dict(learning_rate=0.01, precondition_frequency=3),
        dict(
            learning_rate=0.01,
            b1=0.9,
            b2=0.99,
            shampoo_beta=0.9,
            weight_decay=0.1,
            precondition_frequency=2,
            max_precond_dim=3,  # the 4-long axes are not rotated
            precondition_1d=True,
        ),
    ],
    ids=["default", "options"],
)
def test_soap_matches_numpy_transcription_of_the_authors_code(kw):
    # float32 (eqxopt) against float64 (NumPy): the eigenbases agree to ~1e-6.
    actual = run_eqxopt(eqxopt.SOAP(**kw), PARAMS, GRADS)
    treedef = jax.tree.structure(PARAMS)
    expected = [
        jax.tree.unflatten(treedef, leaves)
        for leaves in soap_numpy(
            jax.tree.leaves(PARAMS), [jax.tree.leaves(g) for g in GRADS], **kw
        )
    ]
    assert_histories_close(actual, expected)


def test_soap_state_layout_and_first_step():
    opt = eqxopt.SOAP(0.01, max_precond_dim=3)
    state = opt.init(PARAMS)
    gg = state.gg
    assert gg["dense"]["w"][0].shape == (3, 3) and gg["dense"]["w"][1] is None
    assert gg["dense"]["b"] == (None,)  # 1-D: plain Adam
    assert [m.shape for m in gg["layers"][0]["w"]] == [(2, 2), (3, 3), (2, 2)]
    params, state = opt.step(GRADS[0], state, PARAMS)
    # The first step only builds the preconditioner, as in the authors' code.
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(PARAMS)):
        np.testing.assert_array_equal(a, b)
    q = np.asarray(state.q["dense"]["w"][0])
    np.testing.assert_allclose(q.T @ q, np.eye(3), atol=1e-5)


def test_soap_converges_on_an_ill_conditioned_regression():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(64, 8)) * np.logspace(0, 1, 8), jnp.float32)
    y = x @ jnp.asarray(rng.normal(size=(8, 4)), jnp.float32)

    def loss(p):
        return jnp.mean((x @ p["w"] + p["b"] - y) ** 2)

    grad = jax.jit(jax.grad(loss))
    opt = eqxopt.SOAP(0.05, weight_decay=0.0, precondition_frequency=5)
    params = {"w": jnp.zeros((8, 4)), "b": jnp.zeros(4)}
    state = opt.init(params)
    start = float(loss(params))
    for _ in range(300):
        params, state = opt.step(grad(params), state, params)
    assert start > 100.0
    assert float(loss(params)) < 1e-2


def test_soap_errors_name_the_argument():
    with pytest.raises(ValueError, match="precondition_frequency must be an int >= 1"):
        eqxopt.SOAP(precondition_frequency=0)
    with pytest.raises(ValueError, match="precondition_frequency must be an int >= 1"):
        eqxopt.SOAP(precondition_frequency=2.5)
    with pytest.raises(ValueError, match="max_precond_dim must be an int >= 1"):
        eqxopt.SOAP(max_precond_dim=0)
    with pytest.raises(ValueError, match="shampoo_beta"):
        eqxopt.SOAP(shampoo_beta=1.0)
    with pytest.raises(TypeError, match="precondition_1d must be a bool"):
        eqxopt.SOAP(precondition_1d=1)


# ------------------------------------------------------------------------------------
# L-BFGS
# ------------------------------------------------------------------------------------

_rng = np.random.default_rng(3)
CURVATURES = jax.tree.map(
    lambda p: jnp.asarray(_rng.uniform(0.5, 5.0, size=p.shape), jnp.float32), PARAMS
)


def quartic(params):
    """A badly scaled convex loss with its minimum at TARGETS."""
    return sum(
        jnp.sum(c * (p - t) ** 2) + 0.1 * jnp.sum((p - t) ** 4)
        for p, t, c in zip(
            jax.tree.leaves(params),
            jax.tree.leaves(TARGETS),
            jax.tree.leaves(CURVATURES),
        )
    )


def rosenbrock(params):
    x = params["x"]
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


def _lbfgs_lockstep(opt, tx, loss, params, steps):
    """Both from the same start, each with its own trajectory; returns both
    histories and the linesearch iteration counts."""
    value_and_grad = jax.jit(jax.value_and_grad(loss))
    tx_update = jax.jit(
        lambda g, s, p, v: tx.update(g, s, p, value=v, grad=g, value_fn=loss)
    )
    state, tx_state = opt.init(params), tx.init(params)
    mine, theirs = params, params
    history = ([], [], [], [])
    for _ in range(steps):
        value, grads = value_and_grad(mine)
        mine, state = opt.step(grads, state, mine, value=value, value_fn=loss)
        value, grads = value_and_grad(theirs)
        updates, tx_state = tx_update(grads, tx_state, theirs, value)
        theirs = optax.apply_updates(theirs, updates)
        history[0].append(mine)
        history[1].append(theirs)
        history[2].append(int(state.linesearch_steps))
        history[3].append(int(tx_state[-1].info.num_linesearch_steps))
    return history


def test_lbfgs_matches_optax_lbfgs_on_a_nested_tree():
    mine, theirs, my_steps, their_steps = _lbfgs_lockstep(
        eqxopt.LBFGS(), optax.lbfgs(), quartic, PARAMS, STEPS
    )
    assert my_steps == their_steps
    # Float32 dot products over the tree are summed in another order than optax's;
    # differences stay below ~3e-7 over the 30 steps.
    assert_histories_close(mine, theirs, rtol=2e-5, atol=1e-6)
    assert float(quartic(mine[-1])) < 1e-10


def test_lbfgs_matches_optax_on_rosenbrock_and_reaches_the_minimum():
    params = {"x": jnp.asarray([-1.2, 1.0, -0.5, 0.8])}
    mine, theirs, my_steps, their_steps = _lbfgs_lockstep(
        eqxopt.LBFGS(),
        optax.lbfgs(),
        rosenbrock,
        params,
        45,
    )
    # The same linesearch decisions at every update (the zoom phase runs on about
    # a third of them) ...
    assert my_steps == their_steps and max(my_steps) >= 2
    # ... and the same iterates up to float32 rounding (dot products summed in
    # another order), which the curved valley amplifies: the largest difference
    # seen is 7e-5 (around update 35), so atol 5e-4; both then reach (1, 1, 1, 1).
    assert_histories_close(mine, theirs, rtol=1e-3, atol=5e-4)
    np.testing.assert_allclose(mine[-1]["x"], np.ones(4), atol=1e-5)
    assert float(rosenbrock(mine[-1])) < 1e-10


def test_lbfgs_without_linesearch_matches_optax():
    # Gradients of a real loss: with random gradients the curvature pairs are
    # meaningless and both blow up, rounding differences included.
    grad = jax.jit(jax.grad(quartic))
    opt = eqxopt.LBFGS(0.5, memory_size=4, linesearch=False)
    tx = optax.lbfgs(0.5, memory_size=4, linesearch=None)
    state, tx_state = opt.init(PARAMS), tx.init(PARAMS)
    tx_update = jax.jit(tx.update)
    mine, theirs = PARAMS, PARAMS
    for step in range(STEPS):
        mine, state = opt.step(grad(mine), state, mine)
        updates, tx_state = tx_update(grad(theirs), tx_state, theirs)
        theirs = optax.apply_updates(theirs, updates)
        try:
            assert_trees_close(mine, theirs, atol=1e-6)
        except AssertionError as err:
            raise AssertionError(f"step {step}: {err}") from None
    assert float(quartic(mine)) < 1e-3 * float(quartic(PARAMS))


def test_lbfgs_sign_is_optaxs_and_scale_by_lbfgs_has_the_block_sign():
    # Issue 39, item 11: LBFGS's update is a descent step (-lr * H g), while
    # optax.scale_by_lbfgs gives +H g; the migration guide maps the latter to
    # ScaleByLBFGS, whose port applied as optax's (w - lr * u) descends too.
    grad = jax.jit(jax.grad(quartic))
    opt = eqxopt.LBFGS(0.5, memory_size=4, linesearch=False)
    block, tx = eqxopt.ScaleByLBFGS(4), optax.scale_by_lbfgs(4)
    s_opt, s_block, s_tx = opt.init(PARAMS), block.init(PARAMS), tx.init(PARAMS)
    ported, theirs = PARAMS, PARAMS
    for _ in range(STEPS):
        u_opt, s_opt = opt.update(grad(ported), s_opt, ported)
        u_block, s_block = block.update(grad(ported), s_block, ported)
        with jax.numpy_dtype_promotion("standard"):
            u_tx, s_tx = jax.jit(tx.update)(grad(theirs), s_tx, theirs)
        assert_trees_close(u_opt, jax.tree.map(lambda u: -0.5 * u, u_block))
        ported = jax.tree.map(lambda p, u: p - 0.5 * u, ported, u_block)
        theirs = jax.tree.map(lambda p, u: p - 0.5 * u, theirs, u_tx)
        assert_trees_close(ported, theirs, atol=1e-6)
    assert float(quartic(ported)) < 1e-3 * float(quartic(PARAMS))


def test_lbfgs_refuses_optax_linesearches_naming_its_own_way():
    # Issue 42: optax.lbfgs(linesearch=...) takes these objects.
    with pytest.raises(TypeError, match=r"^linesearch takes True or False.*"
                       r"max_linesearch_steps="):  # fmt: skip
        eqxopt.LBFGS(linesearch=optax.scale_by_zoom_linesearch(15))
    with pytest.raises(TypeError, match=r"ScaleByBacktrackingLinesearch"):
        eqxopt.LBFGS(linesearch=optax.scale_by_backtracking_linesearch(15))
    with pytest.raises(TypeError, match=r"^linesearch must be a bool"):
        eqxopt.LBFGS(linesearch="zoom")


def test_lbfgs_with_a_backtracking_linesearch_is_the_chain_the_refusal_names():
    value_and_grad = jax.jit(jax.value_and_grad(quartic))
    ours = eqxopt.Chain(
        eqxopt.LBFGS(0.5, memory_size=4, linesearch=False),
        eqxopt.ScaleByBacktrackingLinesearch(15),
    )
    tx = optax.lbfgs(
        0.5, memory_size=4, linesearch=optax.scale_by_backtracking_linesearch(15)
    )
    state, tx_state = ours.init(PARAMS), tx.init(PARAMS)
    mine, theirs = PARAMS, PARAMS
    history, reference = [], Trajectory(PARAMS)
    update = jax.jit(
        lambda g, s, p, v: tx.update(g, s, p, value=v, grad=g, value_fn=quartic)
    )
    for _ in range(10):
        value, grads = value_and_grad(mine)
        mine, state = ours.step(grads, state, mine, value=value, value_fn=quartic)
        history.append(mine)
        value, grads = value_and_grad(theirs)
        with jax.numpy_dtype_promotion("standard"):
            updates, tx_state = update(grads, tx_state, theirs, value)
        theirs = optax.apply_updates(theirs, updates)
        reference.append(theirs)
    assert_histories_close(history, reference, rtol=2e-5, atol=1e-6)


def test_lbfgs_to_optax_takes_optax_lbfgs_loop_keywords():
    """optax's L-BFGS loop passes value=, grad= and value_fn= whatever the
    linesearch; without one, optax ignores them, and so does to_optax()."""
    value_and_grad = jax.jit(jax.value_and_grad(quartic))
    for ours, ref in (
        (
            eqxopt.LBFGS(0.5, memory_size=4, linesearch=False),
            optax.lbfgs(0.5, memory_size=4, linesearch=None),
        ),
        (eqxopt.LBFGS(), optax.lbfgs()),
    ):
        txs = (ours.to_optax(), ref)
        states = [tx.init(PARAMS) for tx in txs]
        params = [PARAMS, PARAMS]
        for step in range(5):
            for i, tx in enumerate(txs):
                value, grad = value_and_grad(params[i])
                updates, states[i] = tx.update(
                    grad, states[i], params[i], value=value, grad=grad, value_fn=quartic
                )
                params[i] = optax.apply_updates(params[i], updates)
            try:
                assert_trees_close(params[0], params[1], atol=1e-6)
            except AssertionError as err:
                raise AssertionError(f"{ours} step {step}: {err}") from None
    # A direct update still says what is wrong with value_fn and no linesearch.
    plain = eqxopt.LBFGS(linesearch=False)
    with pytest.raises(TypeError, match="takes no value_fn"):
        plain.update(GRADS[0], plain.init(PARAMS), PARAMS, value_fn=quartic)


def test_lbfgs_data_keywords_reach_value_fn_without_recompiling():
    from helpers import compiles

    def loss(params, x, y):
        return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)

    rng = np.random.default_rng(0)
    opt = eqxopt.LBFGS(memory_size=3)
    params = {"w": jnp.zeros((3, 1)), "b": jnp.zeros(1)}
    state = opt.init(params)
    logs = []
    for _ in range(10):  # new data every update, as arrays
        x = jnp.asarray(rng.normal(size=(16, 3)), jnp.float32)
        y = x @ jnp.asarray([[1.0], [-2.0], [0.5]]) + 0.3
        grads = jax.grad(loss)(params, x, y)
        # value=None: the loss is evaluated by the optimizer.
        with compiles() as log:
            params, state = opt.step(grads, state, params, value_fn=loss, x=x, y=y)
        logs.append(log)
        np.testing.assert_allclose(state.value, loss(params, x, y), rtol=1e-5)
    assert logs[0] and not any(logs[1:]), logs
    # Every batch has the same exact fit; from a loss of ~5 to below 1e-3.
    assert float(state.value) < 1e-3
    np.testing.assert_allclose(params["w"][:, 0], [1.0, -2.0, 0.5], atol=0.05)


def test_lbfgs_value_and_grad_reuses_the_linesearch_evaluation():
    model = eqx.nn.MLP(2, 1, 8, 1, activation=jnp.tanh, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (32, 2))
    y = x[:, :1] * x[:, 1:]

    def loss(m, x, y):
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    opt = eqxopt.LBFGS()
    state = opt.init(model)
    for _ in range(5):
        value, grads = opt.value_and_grad(state, model, loss, x=x, y=y)
        want_value, want_grads = eqx.filter_value_and_grad(loss)(model, x, y)
        np.testing.assert_allclose(value, want_value, rtol=1e-5)
        assert_trees_close(grads, want_grads, rtol=1e-4, atol=1e-6)
        model, state = opt.step(
            grads, state, model, value=value, value_fn=loss, x=x, y=y
        )
    assert model.activation is jnp.tanh
    # The stored evaluation really is reused (so it must be for the same loss):
    stale, _ = opt.value_and_grad(state, model, loss, x=x, y=2 * y)
    np.testing.assert_array_equal(stale, state.value)
    assert float(loss(model, x, y)) < float(
        loss(eqx.nn.MLP(2, 1, 8, 1, activation=jnp.tanh, key=jax.random.key(0)), x, y)
    )


def test_lbfgs_errors_say_what_to_pass():
    opt = eqxopt.LBFGS()
    state = opt.init(PARAMS)
    with pytest.raises(TypeError, match="need value_fn="):
        opt.update(GRADS[0], state, PARAMS)
    plain = eqxopt.LBFGS(linesearch=False)
    with pytest.raises(TypeError, match="takes no value_fn"):
        plain.update(GRADS[0], plain.init(PARAMS), PARAMS, value_fn=quartic)
    with pytest.raises(ValueError, match="memory_size must be an int >= 1"):
        eqxopt.LBFGS(memory_size=0)
    with pytest.raises(ValueError, match="max_linesearch_steps must be an int >= 1"):
        eqxopt.LBFGS(max_linesearch_steps=0)
    with pytest.raises(ValueError, match="curv_rtol"):
        eqxopt.LBFGS(curv_rtol=1.0)


# ------------------------------------------------------------------------------------
# Scheduled hyperparameters and mask forms of Muon, SOAP and LBFGS (issue 14)
# ------------------------------------------------------------------------------------
#
# Every float hyperparameter may be a schedule, read at the step like the learning
# rate: the run must equal the optimizer rebuilt at every step with the schedule's
# value at that step as a plain number (the state carried over).


def _at(schedule, step):
    return float(schedule(jnp.asarray(step, jnp.int32)))


def _closed_loop(make_at, params, steps, extra):
    """Parameters after each step; `make_at(step)` builds the optimizer used at
    `step`, gradients (and `extra(params)`) taken at the current parameters."""
    state = make_at(0).init(params)
    history = []
    for step in range(steps):
        updates, state = make_at(step).update(
            QUADRATIC_GRAD(params), state, params, **extra(params)
        )
        params = eqxopt.apply_updates(params, updates)
        history.append(params)
    return history


def _no_extra(params):
    return {}


def _lbfgs_extra(params):
    return {"value": quadratic(params), "value_fn": quadratic}


def _steps(first, scales):
    # Values exact in float32 (powers of two apart), so that the schedule gives
    # the same number inside the compiled step as outside (Linear's may differ in
    # the last bit, which SOAP's eigenbases and LBFGS's linesearch amplify).
    return eqxopt.PiecewiseConstant(first, scales)


SCHEDULED = {
    "Muon": (
        lambda **kw: eqxopt.Muon(0.02, **kw),
        {
            "beta": _steps(0.5, {2: 1.5, 4: 1.25}),
            "weight_decay": _steps(0.25, {2: 0.5, 4: 0.5}),
            "adam_b1": _steps(0.5, {3: 1.5}),
            "consistent_rms": _steps(0.125, {2: 2.0}),
        },
        _no_extra,
    ),
    "SOAP": (
        lambda **kw: eqxopt.SOAP(0.01, precondition_frequency=2, **kw),
        {
            "b1": _steps(0.5, {2: 1.5, 4: 1.25}),
            "shampoo_beta": _steps(0.5, {3: 1.5}),
            "weight_decay": _steps(0.125, {2: 0.5}),
        },
        _no_extra,
    ),
    # KL-SOAP: shampoo_beta also enters its bias correction and eps its
    # eigenvalue floor.
    "SOAP-kl": (
        lambda **kw: eqxopt.SOAP(
            0.01, precondition_frequency=2, factor_update="kl", **kw
        ),
        {
            "b1": _steps(0.5, {2: 1.5, 4: 1.25}),
            "shampoo_beta": _steps(0.5, {3: 1.5}),
            "eps": _steps(0.125, {3: 0.5}),
        },
        _no_extra,
    ),
    "KLShampoo": (
        lambda **kw: eqxopt.KLShampoo(0.01, precondition_frequency=2, **kw),
        {
            "b1": _steps(0.5, {2: 1.5, 4: 1.25}),
            "shampoo_beta": _steps(0.5, {3: 1.5}),
            "weight_decay": _steps(0.125, {2: 0.5}),
            "eps": _steps(0.125, {3: 0.5}),
        },
        _no_extra,
    ),
    "LBFGS": (
        lambda **kw: eqxopt.LBFGS(memory_size=3, **kw),
        {
            "curv_rtol": _steps(0.125, {2: 4.0, 4: 1.75}),
            "max_learning_rate": _steps(0.0625, {2: 4.0, 4: 4.0}),
        },
        _lbfgs_extra,
    ),
}


@pytest.mark.parametrize("name", list(SCHEDULED))
def test_scheduled_hyperparameters_are_read_at_the_step(name):
    make, schedules, extra = SCHEDULED[name]
    steps = 8

    def numbers(step):
        return {k: _at(s, step) for k, s in schedules.items()}

    scheduled = _closed_loop(lambda step: make(**schedules), PARAMS, steps, extra)
    rebuilt = _closed_loop(lambda step: make(**numbers(step)), PARAMS, steps, extra)
    assert_histories_close(scheduled, rebuilt, rtol=1e-6, atol=1e-7)
    # The schedules matter: fixed at their first values, the run differs.
    fixed = _closed_loop(lambda step: make(**numbers(0)), PARAMS, steps, extra)
    change = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(fixed[-1]), jax.tree.leaves(scheduled[-1]))
    )
    assert change > 1e-3, f"the schedules changed the parameters by only {change}"


def _matrices(params):
    return jax.tree.map(lambda p: p.ndim == 2, params)


_MATRICES = {  # what _matrices gives on PARAMS
    "scale": False,
    "dense": {"w": True, "b": False},
    "layers": [{"w": False, "b": False}, (False, False)],
}


@pytest.mark.parametrize(
    "mask",
    [_matrices, _MATRICES, jax.tree.map(jnp.asarray, _MATRICES)],
    ids=["function", "bools", "bool-arrays"],
)
def test_muon_takes_every_mask_form_as_adamw_does(mask):
    kw = dict(weight_decay=0.5, adam_weight_decay=0.5)
    # Decay of the dense matrix only, on both branches (optax decays the Muon
    # leaves only: the same here, since the mask selects just those).
    actual = run_eqxopt(
        eqxopt.Muon(0.02, weight_decay_mask=mask, muon_mask=mask, **kw), PARAMS, GRADS
    )
    expected = run_optax(
        optax.contrib.muon(0.02, weight_decay=0.5, adam_weight_decay=0.0), PARAMS, GRADS
    )
    assert_histories_close(actual, expected)
    opt = eqxopt.Muon(0.02, weight_decay_mask=mask, muon_mask=mask)
    same = eqxopt.Muon(0.02, weight_decay_mask=mask, muon_mask=mask)
    assert opt.weight_decay_mask == same.weight_decay_mask  # frozen: equal copies


def test_muon_masks_are_checked_at_init():
    with pytest.raises(ValueError, match="weight_decay_mask does not have the tree"):
        eqxopt.Muon(0.1, weight_decay_mask={"scale": True}).init(PARAMS)
    with pytest.raises(ValueError, match="muon_mask does not have the tree"):
        eqxopt.Muon(0.1, muon_mask={"scale": True}).init(PARAMS)
    with pytest.raises(TypeError, match=r"weight_decay_mask\['dense'\] must be a bool"):
        eqxopt.Muon(0.1, weight_decay_mask={**_MATRICES, "dense": 1.0})
