"""The Adam family against optax, torch.optim and (where neither has it) the paper's
rule written out in NumPy; the weight-decay mask; moment dtypes; error messages.

Every reference run is 30 steps on `nested_tree()` with the same gradient stream and
is compared after every step at rtol 2e-5 / atol 2e-6 (float32 rounding) unless a
comment says why a tolerance is looser.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

import eqxopt
from helpers import (
    assert_histories_close,
    assert_trees_close,
    grad_stream,
    nested_tree,
    run_eqxopt,
    run_optax,
    run_torch,
)

STEPS = 30
PARAMS = nested_tree()
GRADS = list(grad_stream(PARAMS, STEPS))
LR = 0.01


def _same_schedule(ours):
    """The eqxopt schedule, and an optax-style function calling it: the two runs
    then see bit-identical values, so the comparison checks where and when the
    optimizer evaluates the schedule (one ulp of b3 = 0.999 alone moves 1 - b3 by
    6e-5 relative, more than the tolerance)."""
    return ours, lambda step: ours(jnp.asarray(step, jnp.int32))


WD = _same_schedule(eqxopt.WarmupCosine(0.2, 0.02, 5, STEPS))
B3 = _same_schedule(eqxopt.WarmupCosine(0.999, 0.9, 5, STEPS))
ALPHA = _same_schedule(eqxopt.WarmupCosine(5.0, 1.0, 10, STEPS))


def _matrices(params):
    return jax.tree.map(lambda x: x.ndim >= 2, params)


TREE_MASK = {
    "scale": False,
    "dense": {"w": True, "b": False},
    "layers": [{"w": True, "b": False}, (True, False)],
}
PREFIX_MASK = {"scale": True, "dense": False, "layers": [True, False]}


# (id, eqxopt optimizer, optax optimizer)
OPTAX_CASES = [
    ("Adam", lambda: eqxopt.Adam(LR), lambda: optax.adam(LR)),
    (
        "Adam-positional",
        lambda: eqxopt.Adam(LR, 0.8, 0.99, 1e-6),
        lambda: optax.adam(LR, 0.8, 0.99, 1e-6),
    ),
    (
        "Adam-nesterov-eps_root",
        lambda: eqxopt.Adam(LR, nesterov=True, eps_root=1e-6),
        lambda: optax.adam(LR, eps_root=1e-6, nesterov=True),
    ),
    (
        "AdamW-positional",
        lambda: eqxopt.AdamW(LR, 0.8, 0.99, 1e-6, weight_decay=0.1),
        lambda: optax.adamw(LR, 0.8, 0.99, 1e-6, weight_decay=0.1),
    ),
    (
        "AdamW-nesterov",
        lambda: eqxopt.AdamW(LR, weight_decay=0.1, nesterov=True),
        lambda: optax.adamw(LR, weight_decay=0.1, nesterov=True),
    ),
    (
        "AdamW-wd-schedule",
        lambda: eqxopt.AdamW(LR, weight_decay=WD[0]),
        lambda: optax.adamw(LR, weight_decay=WD[1]),
    ),
    (
        "AdamW-tree-mask",
        lambda: eqxopt.AdamW(LR, weight_decay=0.5, mask=TREE_MASK),
        lambda: optax.adamw(LR, weight_decay=0.5, mask=TREE_MASK),
    ),
    (
        "AdamW-prefix-mask",
        lambda: eqxopt.AdamW(LR, weight_decay=0.5, mask=PREFIX_MASK),
        lambda: optax.adamw(LR, weight_decay=0.5, mask=PREFIX_MASK),
    ),
    (
        "AdamW-function-mask",
        lambda: eqxopt.AdamW(LR, weight_decay=0.5, mask=_matrices),
        lambda: optax.adamw(LR, weight_decay=0.5, mask=_matrices),
    ),
    ("NAdam", lambda: eqxopt.NAdam(LR), lambda: optax.nadam(LR)),
    (
        "NAdamW",
        lambda: eqxopt.NAdamW(LR, weight_decay=0.1, mask=_matrices),
        lambda: optax.nadamw(LR, weight_decay=0.1, mask=_matrices),
    ),
    ("AMSGrad", lambda: eqxopt.AMSGrad(LR), lambda: optax.amsgrad(LR)),
    (
        "AMSGrad-paper",
        lambda: eqxopt.AMSGrad(LR, nu_correction="none", bias_correction_mu=False),
        lambda: optax.amsgrad(LR, bias_correction_mu=False, bias_correction_nu=False),
        # Without bias corrections the steps are ~3x Adam's: the last-bit
        # differences of p + u (1 ulp of p ~ 2.4e-7 for |p| ~ 2) random-walk to a
        # few 1e-6 in 30 steps, which exceeds atol where a parameter crosses 0.
        {"atol": 1e-5},
    ),
    ("Adamax", lambda: eqxopt.Adamax(LR), lambda: optax.adamax(LR)),
    (
        "AdamaxW",
        lambda: eqxopt.AdamaxW(LR, weight_decay=0.1, mask=TREE_MASK),
        lambda: optax.adamaxw(LR, weight_decay=0.1, mask=TREE_MASK),
    ),
    ("AdaBelief", lambda: eqxopt.AdaBelief(LR), lambda: optax.adabelief(LR)),
    (
        "AdaBelief-nesterov-paper-eps",
        lambda: eqxopt.AdaBelief(LR, eps=1e-8, eps_root=0.0, nesterov=True),
        lambda: optax.adabelief(LR, eps=1e-8, eps_root=0.0, nesterov=True),
    ),
    (
        "RAdam",
        lambda: eqxopt.RAdam(LR),
        lambda: optax.radam(LR),
        # optax computes rho_t = rho_inf - 2 t b2**t / (1 - b2**t) in float32,
        # cancelling ~1999 against ~1993: its rectification factor is off by
        # ~5e-5 relative from the first rectified step (RAdam computes rho_t
        # without cancellation and matches torch's float64 value at 2e-5, below).
        {"rtol": 3e-4, "atol": 1e-5},
    ),
    (
        "RAdam-nesterov-threshold",
        lambda: eqxopt.RAdam(LR, b2=0.99, threshold=8.0, nesterov=True),
        lambda: optax.radam(LR, b2=0.99, threshold=8.0, nesterov=True),
    ),
    ("Yogi", lambda: eqxopt.Yogi(LR), lambda: optax.yogi(LR)),
    ("ADOPT", lambda: eqxopt.ADOPT(LR), lambda: optax.contrib.adopt(LR)),
    (
        "ADOPT-nesterov-noclip",
        lambda: eqxopt.ADOPT(LR, b2=0.99, nesterov=True, clip=False),
        lambda: optax.contrib.adopt(LR, b2=0.99, nesterov=True, use_clipping=False),
    ),
    (
        "AdEMAMix",
        lambda: eqxopt.AdEMAMix(LR, b3=0.99, alpha=3.0, weight_decay=0.1),
        lambda: optax.contrib.ademamix(LR, b3=0.99, alpha=3.0, weight_decay=0.1),
    ),
    (
        "AdEMAMix-schedules",
        lambda: eqxopt.AdEMAMix(LR, b3=B3[0], alpha=ALPHA[0]),
        lambda: optax.contrib.ademamix(LR, b3=B3[1], alpha=ALPHA[1]),
        # Measured: optax drifts from the float64 rule by up to 7e-6 absolute in
        # these 30 steps, eqxopt by 7e-7 (test_ademamix_schedules_match_numpy
        # holds eqxopt to the float64 rule at the default tolerance).
        {"atol": 1e-5},
    ),
    (
        "OptimisticAdam",
        lambda: eqxopt.OptimisticAdam(LR, alpha=1.5, beta=0.7),
        lambda: optax.optimistic_adam_v2(LR, alpha=1.5, beta=0.7),
    ),
    (
        "OptimisticAdam-plain",
        lambda: eqxopt.OptimisticAdam(LR, nesterov=False),
        lambda: optax.optimistic_adam_v2(LR, nesterov=False),
    ),
]


@pytest.mark.parametrize("case", OPTAX_CASES, ids=[c[0] for c in OPTAX_CASES])
def test_matches_optax(case):
    _, make_ours, make_ref, *tolerance = case
    assert_histories_close(
        run_eqxopt(make_ours(), PARAMS, GRADS),
        run_optax(make_ref(), PARAMS, GRADS),
        **(tolerance[0] if tolerance else {}),
    )


def test_ademamix_schedules_match_numpy():
    """AdEMAMix with warmed-up alpha and b3, against its rule in float64 NumPy
    (the schedule values themselves taken from the float32 schedules)."""
    b1, b2 = float(np.float32(0.9)), float(np.float32(0.999))
    p = [np.asarray(x, np.float64) for x in jax.tree.leaves(PARAMS)]
    m1, m2, nu = ([np.zeros_like(x) for x in p] for _ in range(3))
    history = []
    for k, g_tree in enumerate(GRADS):
        t = k + 1
        b3, alpha = float(B3[0](jnp.int32(k))), float(ALPHA[0](jnp.int32(k)))
        for i, g in enumerate(jax.tree.leaves(g_tree)):
            g = np.asarray(g, np.float64)
            m1[i] = b1 * m1[i] + (1 - b1) * g
            m2[i] = b3 * m2[i] + (1 - b3) * g
            nu[i] = b2 * nu[i] + (1 - b2) * g * g
            denom = np.sqrt(nu[i] / (1 - b2**t)) + 1e-8
            p[i] = p[i] - LR * (m1[i] / (1 - b1**t) + alpha * m2[i]) / denom
        history.append(jax.tree.unflatten(jax.tree.structure(PARAMS), list(p)))
    ours = eqxopt.AdEMAMix(LR, b3=B3[0], alpha=ALPHA[0])
    assert_histories_close(run_eqxopt(ours, PARAMS, GRADS), history)


def test_deprecated_optimistic_adam_is_v2_with_unit_learning_rate():
    ref = optax.chain(  # optax.optimistic_adam(0.01, 0.5) without its warning
        optax.scale_by_adam(nesterov=True),
        optax.scale_by_optimistic_gradient(alpha=0.01, beta=0.02),
        optax.scale_by_learning_rate(1.0),
    )
    ours = eqxopt.OptimisticAdam(1.0, alpha=0.01, beta=0.02)
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )


# (id, eqxopt optimizer, torch optimizer factory)
TORCH_CASES = [
    ("Adam", lambda: eqxopt.Adam(LR), lambda p: torch.optim.Adam(p, lr=LR)),
    (
        "AdamW",
        lambda: eqxopt.AdamW(LR, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=LR, weight_decay=0.1),
    ),
    (
        "AMSGrad-torch-Adam",
        lambda: eqxopt.AMSGrad(LR, nu_correction="after_max"),
        lambda p: torch.optim.Adam(p, lr=LR, amsgrad=True),
    ),
    (
        "AMSGrad-torch-AdamW",
        lambda: eqxopt.AMSGrad(LR, weight_decay=0.1, nu_correction="after_max"),
        lambda p: torch.optim.AdamW(p, lr=LR, weight_decay=0.1, amsgrad=True),
    ),
    (
        "NAdam-torch-schedule",
        lambda: eqxopt.NAdam(LR, momentum_decay=0.004),
        lambda p: torch.optim.NAdam(p, lr=LR),
    ),
    (
        "NAdam-torch-constant-momentum",
        lambda: eqxopt.NAdam(LR),
        lambda p: torch.optim.NAdam(p, lr=LR, momentum_decay=math.inf),
    ),
    (
        "NAdamW-torch-decoupled",
        lambda: eqxopt.NAdamW(LR, weight_decay=0.1, momentum_decay=0.004),
        lambda p: torch.optim.NAdam(
            p, lr=LR, weight_decay=0.1, decoupled_weight_decay=True
        ),
    ),
    ("Adamax", lambda: eqxopt.Adamax(LR), lambda p: torch.optim.Adamax(p, lr=LR)),
    ("RAdam", lambda: eqxopt.RAdam(LR), lambda p: torch.optim.RAdam(p, lr=LR)),
    (
        "RAdam-decoupled",
        lambda: eqxopt.RAdam(LR, weight_decay=0.1),
        lambda p: torch.optim.RAdam(
            p, lr=LR, weight_decay=0.1, decoupled_weight_decay=True
        ),
    ),
]


@pytest.mark.parametrize(
    "make_ours,make_ref", [c[1:] for c in TORCH_CASES], ids=[c[0] for c in TORCH_CASES]
)
def test_matches_torch(make_ours, make_ref):
    assert_histories_close(
        run_eqxopt(make_ours(), PARAMS, GRADS), run_torch(make_ref, PARAMS, GRADS)
    )


def test_conventions_really_differ():
    """The convention switches are not no-ops: torch's NAdam schedule, torch's
    AMSGrad correction and optax's each give other parameters after 30 steps."""

    def final(opt):
        return jax.tree.leaves(run_eqxopt(opt, PARAMS, GRADS)[-1])

    def differs(a, b):
        return any(not np.allclose(x, y, rtol=1e-4) for x, y in zip(a, b))

    assert differs(
        final(eqxopt.NAdam(LR)), final(eqxopt.NAdam(LR, momentum_decay=0.004))
    )
    amsgrad = [
        final(eqxopt.AMSGrad(LR, nu_correction=mode))
        for mode in ("before_max", "after_max", "none")
    ]
    assert differs(amsgrad[0], amsgrad[1]) and differs(amsgrad[1], amsgrad[2])


@pytest.mark.parametrize("b2", [0.9, 0.99, 0.999, 0.9999])
def test_radam_rho_t_is_accurate_in_float32(b2):
    from eqxopt._optimizers._adam._radam import rho_t

    steps = np.array([*range(1, 200), 1020, 1024, 1025, 1030, 5000, 10**6])
    got = np.asarray(
        jax.jit(jax.vmap(rho_t, in_axes=(None, 0)))(
            jnp.float32(b2), jnp.asarray(steps, jnp.int32)
        )
    )
    b = float(np.float32(b2))
    t = steps.astype(np.float64)
    truth = 2 / (1 - b) - 1 - 2 * t * b**t / (1 - b**t)
    np.testing.assert_allclose(got, truth, rtol=1e-5, atol=1e-5)


def test_radam_switches_to_the_rectified_step_within_the_run():
    # The torch comparison above covers both branches only if rho_t crosses 5
    # during the 30 steps; torch rectifies when rho_t > 5, optax (and RAdam) when
    # rho_t >= threshold: they agree unless rho_t is exactly the threshold.
    b2 = 0.999
    rho_inf = 2 / (1 - b2) - 1
    t = np.arange(1, STEPS + 1)
    rho = rho_inf - 2 * t * b2**t / (1 - b2**t)
    assert rho[0] < 5 < rho[-1]
    assert not np.any(rho == 5.0)


# ----------------------------------------------------------------------------------
# C-AdamW and StableAdamW: the papers' rules in NumPy.
# ----------------------------------------------------------------------------------


def numpy_cadamw(params, grads, lr, b1, b2, eps, wd):
    """Liang et al. 2024, Algorithm 1 (C-AdamW), as the authors' c_adamw.py."""
    p = [np.asarray(x, np.float64) for x in jax.tree.leaves(params)]
    m = [np.zeros_like(x) for x in p]
    v = [np.zeros_like(x) for x in p]
    history = []
    for t, g_tree in enumerate(grads, start=1):
        for i, g in enumerate(
            np.asarray(x, np.float64) for x in jax.tree.leaves(g_tree)
        ):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            u = (m[i] / (1 - b1**t)) / (np.sqrt(v[i] / (1 - b2**t)) + eps)
            phi = (u * g > 0).astype(np.float64)
            scaled_lr = lr * phi.size / (phi.sum() + 1)
            p[i] = p[i] - scaled_lr * u * phi - lr * wd * p[i]
        history.append(jax.tree.unflatten(jax.tree.structure(params), list(p)))
    return history


def numpy_stable_adamw(params, grads, lr, b1, b2, eps, wd):
    """Wortsman et al. 2023, Algorithm 2, with its bias-corrected decays
    b_hat = b (1 - b**(t-1)) / (1 - b**t)."""
    p = [np.asarray(x, np.float64) for x in jax.tree.leaves(params)]
    u = [np.zeros_like(x) for x in p]
    v = [np.zeros_like(x) for x in p]
    history = []
    for t, g_tree in enumerate(grads, start=1):
        b1_hat = b1 * (1 - b1 ** (t - 1)) / (1 - b1**t)
        b2_hat = b2 * (1 - b2 ** (t - 1)) / (1 - b2**t)
        for i, g in enumerate(
            np.asarray(x, np.float64) for x in jax.tree.leaves(g_tree)
        ):
            v[i] = b2_hat * v[i] + (1 - b2_hat) * g * g
            u[i] = b1_hat * u[i] + (1 - b1_hat) * g
            rms = np.sqrt(np.mean(g * g / np.maximum(v[i], eps * eps)))
            eta = lr / max(1.0, rms)
            p[i] = p[i] - eta * wd * p[i] - eta * u[i] / (np.sqrt(v[i]) + eps)
        history.append(jax.tree.unflatten(jax.tree.structure(params), list(p)))
    return history


def test_cadamw_matches_the_paper_rule():
    ours = run_eqxopt(
        eqxopt.CAdamW(0.05, 0.9, 0.99, 1e-8, weight_decay=0.1), PARAMS, GRADS
    )
    ref = numpy_cadamw(PARAMS, GRADS, 0.05, 0.9, 0.99, 1e-8, 0.1)
    assert_histories_close(ours, ref)


def test_cadamw_masks_disagreeing_coordinates():
    # One step from zero moments: u has the sign of g everywhere, so nothing is
    # masked and each leaf moves by lr * d / (d + 1) * u (plain Adam: lr * u).
    params = {"w": jnp.zeros(4)}
    opt = eqxopt.CAdamW(0.1, weight_decay=0.0)
    state = opt.init(params)
    g = {"w": jnp.array([1.0, -2.0, 3.0, -4.0])}
    params, state = opt.step(g, state, params)
    np.testing.assert_allclose(params["w"], -0.1 * 4 / 5 * jnp.sign(g["w"]), rtol=1e-5)
    # Now mu = [0.1, -0.2, 0.3, -0.4]. A gradient whose sign disagrees with the
    # new momentum in coordinates 0 and 2: those two stay put, the other two move
    # by lr * 4 / 3 * u.
    flipped = {"w": jnp.array([-0.01, 2.0, -0.01, -4.0])}
    new, new_state = opt.step(flipped, state, params)
    moved = np.asarray(new["w"] != params["w"])
    np.testing.assert_array_equal(moved, [False, True, False, True])
    mu = np.asarray(new_state.mu["w"])
    nu = np.asarray(new_state.nu["w"])
    u = (mu / (1 - 0.9**2)) / (np.sqrt(nu / (1 - 0.999**2)) + 1e-8)
    np.testing.assert_allclose(
        np.asarray(new["w"] - params["w"])[[1, 3]], -0.1 * 4 / 3 * u[[1, 3]], rtol=1e-4
    )


def test_stable_adamw_matches_the_paper_rule():
    # b2 = 0.9 and a gradient stream whose scale jumps make the RMS clip bite.
    grads = [
        jax.tree.map(lambda g, k=k: g * (10.0 if k % 7 == 6 else 1.0), g)
        for k, g in enumerate(GRADS)
    ]
    ours = run_eqxopt(
        eqxopt.StableAdamW(0.05, 0.9, 0.9, 1e-8, weight_decay=0.1), PARAMS, grads
    )
    ref = numpy_stable_adamw(PARAMS, grads, 0.05, 0.9, 0.9, 1e-8, 0.1)
    assert_histories_close(ours, ref)
    # ... and the clip did act: AdamW takes other steps on this stream.
    adamw = run_eqxopt(
        eqxopt.AdamW(0.05, 0.9, 0.9, 1e-8, weight_decay=0.1), PARAMS, grads
    )
    assert not np.allclose(adamw[-1]["dense"]["w"], ours[-1]["dense"]["w"], rtol=1e-3)


def test_stable_adamw_is_adamw_while_gradients_are_steady():
    # Without spikes rms <= 1 on the first step (g**2 / v_hat = 1 there) and the
    # updates equal AdamW's.
    params = nested_tree()
    g = jax.tree.map(jnp.ones_like, params)
    ours = run_eqxopt(eqxopt.StableAdamW(0.05, weight_decay=0.1), params, [g] * 5)
    ref = run_eqxopt(eqxopt.AdamW(0.05, weight_decay=0.1), params, [g] * 5)
    assert_histories_close(ours, ref)


def rosenbrock(p):
    return (1 - p[0]) ** 2 + 100 * (p[1] - p[0] ** 2) ** 2


@pytest.mark.parametrize(
    "opt",
    [
        eqxopt.CAdamW(0.05, weight_decay=0.0),
        eqxopt.StableAdamW(0.05, weight_decay=0.0),
    ],
    ids=["CAdamW", "StableAdamW"],
)
def test_converges_on_rosenbrock(opt):
    # From (-1.2, 1) (the classic start; loss 24.2), 2000 steps at lr 0.05 reach
    # loss < 1e-5 (measured: about 2e-7 for CAdamW, 1e-8 for StableAdamW).
    params = jnp.array([-1.2, 1.0])
    state = opt.init(params)

    @jax.jit
    def run(params, state):
        def body(carry, _):
            params, state = carry
            grads = jax.grad(rosenbrock)(params)
            return opt.step(grads, state, params), None

        (params, state), _ = jax.lax.scan(body, (params, state), length=2000)
        return params

    final = run(params, state)
    assert float(rosenbrock(final)) < 1e-5


# ----------------------------------------------------------------------------------
# Weight-decay masks.
# ----------------------------------------------------------------------------------


def _decay_only_step(opt, params):
    """One step with zero gradients: Adam's direction is 0, only decay acts."""
    grads = jax.tree.map(
        lambda x: jnp.zeros_like(x) if eqx.is_inexact_array(x) else None, params
    )
    new, _ = opt.step(grads, opt.init(params), params)
    return new


MASKED = [
    lambda mask: eqxopt.AdamW(0.1, weight_decay=0.5, mask=mask),
    lambda mask: eqxopt.NAdamW(0.1, weight_decay=0.5, mask=mask),
    lambda mask: eqxopt.AdamaxW(0.1, weight_decay=0.5, mask=mask),
    lambda mask: eqxopt.AMSGrad(0.1, weight_decay=0.5, mask=mask),
    lambda mask: eqxopt.RAdam(0.1, weight_decay=0.5, mask=mask),
    lambda mask: eqxopt.AdEMAMix(0.1, weight_decay=0.5, mask=mask),
    lambda mask: eqxopt.CAdamW(0.1, weight_decay=0.5, mask=mask),
    lambda mask: eqxopt.StableAdamW(0.1, weight_decay=0.5, mask=mask),
]
MASKED_IDS = [
    "AdamW",
    "NAdamW",
    "AdamaxW",
    "AMSGrad",
    "RAdam",
    "AdEMAMix",
    "CAdamW",
    "StableAdamW",
]


def _decayed(p, which):
    return jax.tree.map(lambda x, d: x * 0.95 if d else x, p, which)


# Alternately a tree mask and a function mask (both reach the same resolve step;
# the optax comparisons above run both kinds too).
MASK_KINDS = [TREE_MASK, _matrices] * 4


@pytest.mark.parametrize("make,mask", list(zip(MASKED, MASK_KINDS)), ids=MASKED_IDS)
def test_masks_choose_the_decayed_leaves(make, mask):
    which = mask(PARAMS) if callable(mask) else mask
    expected = _decayed(PARAMS, which)
    assert_trees_close(_decay_only_step(make(mask), PARAMS), expected, rtol=1e-6)
    # Decay really acted somewhere, and somewhere not.
    assert any(jax.tree.leaves(which)) and not all(jax.tree.leaves(which))


class _CallableMask(eqx.Module):
    """A module of bools with a `__call__` that must never be used as the mask
    function (optax's `masked` would call it)."""

    w: bool
    b: bool

    def __call__(self, params):
        raise AssertionError("the mask module was called")


def test_equinox_module_mask_is_a_tree_never_called():
    model = eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))
    # An MLP-shaped mask: decay the weight matrices only. eqx.nn.MLP is callable;
    # it is read as a tree of bools.
    mask = jax.tree.map(lambda x: x.ndim == 2, eqx.filter(model, eqx.is_array))
    assert callable(mask)
    new = _decay_only_step(eqxopt.AdamW(0.1, weight_decay=0.5, mask=mask), model)
    for old_layer, new_layer in zip(model.layers, new.layers):
        np.testing.assert_allclose(new_layer.weight, old_layer.weight * 0.95, rtol=1e-6)
        np.testing.assert_array_equal(new_layer.bias, old_layer.bias)

    params = _CallableMask(w=jnp.ones(3), b=jnp.ones(3))  # type: ignore[arg-type]
    new = _decay_only_step(
        eqxopt.AdamW(0.1, weight_decay=0.5, mask=_CallableMask(w=True, b=False)),
        params,
    )
    np.testing.assert_allclose(new.w, 0.95 * jnp.ones(3), rtol=1e-6)
    np.testing.assert_array_equal(new.b, jnp.ones(3))


def test_an_equal_mask_rebuilt_reuses_the_compiled_step():
    params = nested_tree()
    grads = GRADS[0]

    def build(lr):
        mask = {  # a fresh dict each time, as in a training script
            "scale": False,
            "dense": {"w": True, "b": False},
            "layers": [{"w": True, "b": False}, (True, False)],
        }
        return eqxopt.AdamW(lr, weight_decay=0.1, mask=mask)

    from helpers import compiles

    opt = build(0.01)
    opt.step(grads, opt.init(params), params)
    opt = build(0.02)
    state = opt.init(params)
    with compiles() as log:
        opt.step(grads, state, params)
    assert log == [], log


def test_float_weight_decay_stays_an_array_and_equals_a_constant_schedule():
    opt = eqxopt.AdamW(LR, weight_decay=0.1)
    assert isinstance(opt.weight_decay, jax.Array) and opt.weight_decay.shape == ()
    assert_histories_close(
        run_eqxopt(opt, PARAMS, GRADS[:5]),
        run_eqxopt(
            eqxopt.AdamW(LR, weight_decay=eqxopt.Constant(0.1)), PARAMS, GRADS[:5]
        ),
        rtol=0,
        atol=0,
    )


# ----------------------------------------------------------------------------------
# Scheduled hyperparameters (b1, b2, weight_decay, ...) are read at the step.
# ----------------------------------------------------------------------------------

SCHEDULED_STEPS = 8
# Each changes a lot from one step to the next, so a value read one step early or
# late moves the parameters far beyond the tolerance (checked below).
B1 = eqxopt.Linear(0.3, 0.95, SCHEDULED_STEPS)
B2 = eqxopt.Linear(0.8, 0.999, SCHEDULED_STEPS)
DECAY = eqxopt.Linear(0.0, 2.0, SCHEDULED_STEPS)
BETAS = {"b1": B1, "b2": B2}
BETAS_AND_DECAY = {**BETAS, "weight_decay": DECAY}

# (id, optimizer from keyword arguments, the scheduled arguments)
SCHEDULED = [
    ("Adam", lambda **kw: eqxopt.Adam(LR, nesterov=True, **kw), BETAS),
    ("AdamW", lambda **kw: eqxopt.AdamW(LR, mask=_matrices, **kw), BETAS_AND_DECAY),
    ("NAdam", lambda **kw: eqxopt.NAdam(LR, momentum_decay=0.004, **kw), BETAS),
    ("NAdamW", lambda **kw: eqxopt.NAdamW(LR, **kw), BETAS_AND_DECAY),
    ("AMSGrad", lambda **kw: eqxopt.AMSGrad(LR, **kw), BETAS_AND_DECAY),
    ("AdamaxW", lambda **kw: eqxopt.AdamaxW(LR, **kw), BETAS_AND_DECAY),
    ("AdaBelief", lambda **kw: eqxopt.AdaBelief(LR, **kw), BETAS),
    ("RAdam", lambda **kw: eqxopt.RAdam(LR, threshold=3.0, **kw), BETAS_AND_DECAY),
    ("Yogi", lambda **kw: eqxopt.Yogi(LR, **kw), BETAS),
    ("ADOPT", lambda **kw: eqxopt.ADOPT(LR, **kw), BETAS),
    (
        "AdEMAMix",
        lambda **kw: eqxopt.AdEMAMix(LR, **kw),
        {**BETAS_AND_DECAY, "b3": eqxopt.Linear(0.5, 0.99, SCHEDULED_STEPS)},
    ),
    (
        "OptimisticAdam",
        lambda **kw: eqxopt.OptimisticAdam(LR, **kw),
        {**BETAS, "beta": eqxopt.Linear(0.0, 2.0, SCHEDULED_STEPS)},
    ),
    ("CAdamW", lambda **kw: eqxopt.CAdamW(LR, **kw), BETAS_AND_DECAY),
    ("StableAdamW", lambda **kw: eqxopt.StableAdamW(LR, **kw), BETAS_AND_DECAY),
]


def _rebuilt_each_step(make, schedules, offset=0):
    """The run of `make(**schedules)`, with the optimizer rebuilt before each step
    with every scheduled argument as the number its schedule gives at that step
    (plus `offset`). The state carries the step count from one to the next."""
    params = PARAMS
    state = make(**{name: 0.5 for name in schedules}).init(params)
    history = []
    for k, g in enumerate(GRADS[:SCHEDULED_STEPS]):
        at = jnp.asarray(k + offset, jnp.int32)
        opt = make(**{name: float(s(at)) for name, s in schedules.items()})
        params, state = opt.step(g, state, params)
        history.append(params)
    return history


@pytest.mark.parametrize("case", SCHEDULED, ids=[c[0] for c in SCHEDULED])
def test_scheduled_hyperparameters_are_read_at_the_step(case):
    _, make, schedules = case
    scheduled = []
    opt = make(**schedules)
    params, state = PARAMS, opt.init(PARAMS)
    for g in GRADS[:SCHEDULED_STEPS]:
        params, state = opt.step(g, state, params)
        scheduled.append(params)
    # The schedules' values in the compiled step may differ from the eager ones in
    # the last bit; the tolerance covers that, not a value from another step.
    assert_histories_close(
        scheduled, _rebuilt_each_step(make, schedules), rtol=1e-5, atol=1e-6
    )
    with pytest.raises(AssertionError):
        assert_histories_close(
            scheduled, _rebuilt_each_step(make, schedules, offset=1), rtol=1e-3
        )


# ----------------------------------------------------------------------------------
# Moment dtypes.
# ----------------------------------------------------------------------------------

DTYPED = [
    eqxopt.Adam,
    eqxopt.AdamW,
    eqxopt.NAdam,
    eqxopt.NAdamW,
    eqxopt.AMSGrad,
    eqxopt.Adamax,
    eqxopt.AdamaxW,
    eqxopt.AdaBelief,
    eqxopt.RAdam,
    eqxopt.Yogi,
    eqxopt.ADOPT,
    eqxopt.AdEMAMix,
    eqxopt.OptimisticAdam,
    eqxopt.CAdamW,
    eqxopt.StableAdamW,
]


@pytest.mark.parametrize("cls", DTYPED, ids=[c.__name__ for c in DTYPED])
def test_bf16_params_with_float32_nu_keep_a_float32_nu(cls):
    params = nested_tree(dtype=jnp.bfloat16)
    opt = cls(0.01, nu_dtype=jnp.float32)
    state = opt.init(params)
    g = jax.tree.map(lambda x: (x * 1e-3).astype(jnp.bfloat16), params)
    params2, state = opt.step(g, state, params)
    params2, state = opt.step(g, state, params2)
    nu_field = "nu"
    for leaf in jax.tree.leaves(getattr(state, nu_field)):
        assert leaf.dtype == jnp.float32
    mu_field = "m1" if cls is eqxopt.AdEMAMix else "mu"
    for leaf in jax.tree.leaves(getattr(state, mu_field)):
        assert leaf.dtype == jnp.bfloat16
    for leaf in jax.tree.leaves(params2):
        assert leaf.dtype == jnp.bfloat16


def test_float32_nu_is_not_rounded_like_a_bf16_one():
    # One step gives nu = (1 - b2) g**2, to float32 rounding when stored in
    # float32; a bf16 nu keeps 8 bits of mantissa.
    params = {"w": jnp.asarray([0.3, -1.7, 2.9], jnp.bfloat16)}
    g = {"w": jnp.asarray([1.1, 0.7, -3.3], jnp.bfloat16)}
    exact = (1 - np.float32(0.999)) * np.asarray(g["w"], np.float32) ** 2
    for nu_dtype, rtol in ((jnp.float32, 1e-6), (None, 1e-2)):
        opt = eqxopt.Adam(0.01, nu_dtype=nu_dtype, mu_dtype=jnp.float32)
        _, state = opt.step(g, opt.init(params), params)
        np.testing.assert_allclose(
            np.asarray(state.nu["w"], np.float32), exact, rtol=rtol
        )
        assert state.mu["w"].dtype == jnp.float32
    assert eqxopt.Adam(0.01).init(params).nu["w"].dtype == jnp.bfloat16


def test_mu_dtype_bf16_on_float32_params():
    opt = eqxopt.AdamW(0.01, mu_dtype=jnp.bfloat16)
    state = opt.init(PARAMS)
    _, state = opt.step(GRADS[0], state, PARAMS)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(state.mu))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.nu))


# ----------------------------------------------------------------------------------
# Error paths.
# ----------------------------------------------------------------------------------


def test_mask_with_the_wrong_structure_names_the_path():
    opt = eqxopt.AdamW(0.01, mask={"scale": True, "other": False})
    with pytest.raises(ValueError, match=r"mask does not have the tree structure"):
        opt.init(PARAMS)


def test_mask_function_returning_the_wrong_structure():
    opt = eqxopt.NAdamW(0.01, mask=lambda p: {"dense": True})
    with pytest.raises(ValueError, match=r"mask does not have the tree structure"):
        opt.init(PARAMS)


def test_mask_leaf_that_is_not_a_bool_names_the_leaf():
    with pytest.raises(TypeError, match=r"mask\['dense'\] must be a bool, got 1.5"):
        eqxopt.AdamW(0.01, mask={"scale": True, "dense": 1.5, "layers": True})


def test_non_bool_flags_are_rejected():
    with pytest.raises(TypeError, match="nesterov must be a bool, got int"):
        eqxopt.Adam(0.01, nesterov=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="clip must be a bool"):
        eqxopt.ADOPT(0.01, clip="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bias_correction_mu must be a bool"):
        eqxopt.AMSGrad(0.01, bias_correction_mu=None)  # type: ignore[arg-type]


def test_unknown_nu_correction():
    with pytest.raises(ValueError, match="nu_correction must be one of"):
        eqxopt.AMSGrad(0.01, nu_correction="torch")  # type: ignore[arg-type]


def test_weight_decay_must_be_a_number_or_a_schedule_module():
    with pytest.raises(TypeError, match="weight_decay must be a float, a scalar"):
        eqxopt.AdamW(0.01, weight_decay=lambda step: 0.1)
    with pytest.raises(TypeError, match="alpha must be a float, a scalar"):
        eqxopt.AdEMAMix(0.01, alpha=lambda step: 1.0)


def test_bad_moment_dtypes():
    with pytest.raises(TypeError, match="nu_dtype must be a float dtype or None"):
        eqxopt.RAdam(0.01, nu_dtype=jnp.int32)
    with pytest.raises(TypeError, match="mu_dtype must be a float dtype or None"):
        eqxopt.CAdamW(0.01, mu_dtype="not a dtype")


class _UnhashableMaskFn:
    __hash__ = None  # type: ignore[assignment]

    def __call__(self, params):
        return jax.tree.map(lambda _: True, params)


def test_mask_function_must_be_hashable():
    # It sits in a static field, which is part of the compiled step's cache key.
    with pytest.raises(TypeError, match="mask must be hashable when it is a function"):
        eqxopt.AdamW(0.01, mask=_UnhashableMaskFn())
