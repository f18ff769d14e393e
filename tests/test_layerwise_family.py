"""Adafactor, SM3, LAMB, LARS, Fromage, NovoGrad and Adan against optax.

Each runs 32 steps on a nested tree (leaves of 0 to 3 dimensions; Adafactor's tree
adds matrices above its factoring threshold) with the same random gradients as the
optax alias, and the parameter histories must agree to rounding.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqxopt
from helpers import (
    assert_histories_close,
    grad_stream,
    nested_tree,
    run_eqxopt,
    run_optax,
)

STEPS = 32


def adafactor_tree() -> dict:
    """`nested_tree()` plus leaves that `min_dim_size_to_factor=4` factors: a matrix,
    and a rank-3 array whose two largest axes are the first and the last."""
    rng = np.random.default_rng(3)
    tree = nested_tree()
    tree["big"] = jnp.asarray(rng.normal(size=(6, 8)), jnp.float32)
    tree["conv"] = jnp.asarray(rng.normal(size=(5, 2, 7)), jnp.float32)
    return tree


def matrices_only(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def warmup_cosine():
    return (
        eqxopt.WarmupCosine(0.05, 0.005, 5, 25),
        optax.warmup_cosine_decay_schedule(0.0, 0.05, 5, 25, 0.005),
    )


def compare(opt, tx, params, rtol=2e-5, atol=2e-6, moved=1e-2):
    grads = list(grad_stream(params, STEPS))
    ours = run_eqxopt(opt, params, grads)
    theirs = run_optax(tx, params, grads)
    assert_histories_close(ours, theirs, rtol=rtol, atol=atol)
    for leaf in jax.tree.leaves(ours[-1]):
        assert bool(jnp.all(jnp.isfinite(leaf)))
    # The comparison means something only if the parameters moved well beyond atol.
    change = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(ours[-1]), jax.tree.leaves(params))
    )
    assert change > moved, f"parameters moved only {change}"


# --- LAMB and LARS ---------------------------------------------------------------


def test_lamb_matches_optax():
    compare(
        eqxopt.LAMB(0.02, weight_decay=0.05, mask=matrices_only),
        optax.lamb(0.02, weight_decay=0.05, mask=matrices_only),
        nested_tree(),
    )


def test_lamb_with_schedule_and_eps_root_matches_optax():
    ours, theirs = warmup_cosine()
    compare(
        eqxopt.LAMB(ours, b1=0.8, b2=0.99, eps=1e-5, eps_root=1e-6, weight_decay=0.1),
        optax.lamb(theirs, b1=0.8, b2=0.99, eps=1e-5, eps_root=1e-6, weight_decay=0.1),
        nested_tree(),
    )


def test_lars_with_masks_matches_optax():
    trust_mask = {"scale": False, "dense": True, "layers": True}  # a prefix tree
    compare(
        eqxopt.LARS(
            0.5,
            weight_decay=0.01,
            weight_decay_mask=matrices_only,
            trust_coefficient=0.02,
            eps=1e-3,
            trust_ratio_mask=trust_mask,
        ),
        optax.lars(
            0.5,
            weight_decay=0.01,
            weight_decay_mask=matrices_only,
            trust_coefficient=0.02,
            eps=1e-3,
            trust_ratio_mask=trust_mask,
        ),
        nested_tree(),
    )


def test_lars_nesterov_with_schedule_matches_optax():
    ours, theirs = warmup_cosine()
    compare(
        eqxopt.LARS(ours, weight_decay=1e-3, trust_coefficient=0.5, nesterov=True),
        optax.lars(theirs, weight_decay=1e-3, trust_coefficient=0.5, nesterov=True),
        nested_tree(),
    )


def test_trust_ratio_is_one_for_zero_parameters():
    # A zero leaf would never move with ratio |p| / |u| = 0: optax and eqxopt use 1.
    params = {"w": jnp.zeros((3, 2)), "b": jnp.ones(2)}
    grads = {"w": jnp.ones((3, 2)), "b": jnp.ones(2)}
    opt = eqxopt.LAMB(0.1)
    updates, _ = opt.update(grads, opt.init(params), params)
    tx = optax.lamb(0.1)
    with jax.numpy_dtype_promotion("standard"):  # optax promotes implicitly
        expected, _ = jax.jit(tx.update)(grads, tx.init(params), params)
    assert float(jnp.max(jnp.abs(updates["w"]))) > 0
    assert_histories_close([updates], [expected])


# --- Fromage, NovoGrad, Adan ---------------------------------------------------


def test_fromage_matches_optax():
    compare(eqxopt.Fromage(0.05), optax.fromage(0.05), nested_tree())


def test_fromage_with_schedule_matches_optax():
    ours, theirs = warmup_cosine()
    compare(
        eqxopt.Fromage(ours, min_norm=1e-3),
        optax.fromage(theirs, min_norm=1e-3),
        nested_tree(),
    )


def test_novograd_matches_optax():
    compare(
        eqxopt.NovoGrad(0.02, b1=0.8, b2=0.3, weight_decay=0.01, eps_root=1e-6),
        optax.novograd(0.02, b1=0.8, b2=0.3, weight_decay=0.01, eps_root=1e-6),
        nested_tree(),
    )


def test_novograd_with_schedule_matches_optax():
    ours, theirs = warmup_cosine()
    compare(eqxopt.NovoGrad(ours), optax.novograd(theirs), nested_tree())


def test_adan_matches_optax():
    compare(
        eqxopt.Adan(0.02, weight_decay=0.05, mask=matrices_only),
        optax.adan(0.02, weight_decay=0.05, mask=matrices_only),
        nested_tree(),
    )


def test_adan_with_schedule_matches_optax():
    ours, theirs = warmup_cosine()
    compare(
        eqxopt.Adan(ours, b1=0.9, b2=0.8, b3=0.95, eps=1e-6, eps_root=0.0),
        optax.adan(theirs, b1=0.9, b2=0.8, b3=0.95, eps=1e-6, eps_root=0.0),
        nested_tree(),
    )


# --- SM3 -------------------------------------------------------------------------


def as_vector_if_scalar(tree):
    return jax.tree.map(lambda x: x.reshape(1) if x.ndim == 0 else x, tree)


def as_scalar_like(tree, like):
    return jax.tree.map(lambda x, y: x.reshape(y.shape), tree, like)


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_sm3_matches_optax(momentum):
    # optax.sm3 fails on 0-d leaves (it indexes an empty list of accumulators);
    # eqxopt treats them as one-element vectors, so optax runs on that reshaping.
    params = nested_tree()
    grads = list(grad_stream(params, STEPS))
    ours = run_eqxopt(eqxopt.SM3(0.1, momentum), params, grads)
    theirs = run_optax(
        optax.sm3(0.1, momentum),
        as_vector_if_scalar(params),
        [as_vector_if_scalar(g) for g in grads],
    )
    assert_histories_close(ours, [as_scalar_like(t, params) for t in theirs])
    assert float(jnp.max(jnp.abs(ours[-1]["dense"]["w"] - params["dense"]["w"]))) > 0.1


def test_sm3_accumulators_are_per_axis():
    params = {"w": jnp.ones((3, 4, 2)), "v": jnp.ones(5), "s": jnp.ones(()), "n": 3}
    state = eqxopt.SM3(0.1).init(params)
    assert state.accumulators["w"].shape == (9,)
    assert state.accumulators["v"].shape == (5,)
    assert state.accumulators["s"].shape == (1,)
    assert state.accumulators["n"] is None and state.momentum["n"] is None


def test_sm3_with_schedule_matches_optax_scaled_by_the_schedule():
    # optax.sm3 takes no schedule; the same steps are scale_by_sm3 then the schedule.
    ours, theirs = warmup_cosine()
    params = {"w": nested_tree()["dense"]["w"], "b": nested_tree()["layers"][0]["w"]}
    tx = optax.chain(optax.scale_by_sm3(0.9), optax.scale_by_learning_rate(theirs))
    compare(eqxopt.SM3(ours), tx, params)


# --- Adafactor -------------------------------------------------------------------


def test_adafactor_factors_the_two_largest_axes():
    opt = eqxopt.Adafactor(min_dim_size_to_factor=4)
    state = opt.init({**adafactor_tree(), "count": 3})
    assert state.v_row["big"].shape == (6,) and state.v_col["big"].shape == (8,)
    assert state.v["big"] is None
    # (5, 2, 7): the largest axis is 2 and the second-largest 0.
    assert state.v_row["conv"].shape == (5, 2)
    assert state.v_col["conv"].shape == (2, 7)
    # Below the threshold (3 < 4) and vectors keep full statistics.
    assert state.v_row["dense"]["w"] is None and state.v["dense"]["w"].shape == (3, 4)
    assert state.v["layers"][0]["b"].shape == (2,)
    assert state.v["count"] is None and state.v_row["count"] is None
    assert state.momentum is None
    assert opt.factored_axes((5, 2, 7)) == (0, 2)
    assert eqxopt.Adafactor(factored=False).factored_axes((300, 400)) is None


def test_adafactor_relative_step_matches_optax_with_the_papers_schedule():
    # learning_rate=None is the paper's rho_t = min(1e-2, 1 / sqrt(t)).
    def rho(count):
        return jnp.minimum(1e-2, 1.0 / jnp.sqrt(count + 1.0))

    compare(
        eqxopt.Adafactor(min_dim_size_to_factor=4),
        optax.adafactor(rho, min_dim_size_to_factor=4),
        adafactor_tree(),
    )


def test_adafactor_with_momentum_decay_and_mask_matches_optax():
    compare(
        eqxopt.Adafactor(
            0.05,
            min_dim_size_to_factor=4,
            decay_rate=0.6,
            clipping_threshold=0.5,
            momentum=0.9,
            weight_decay_rate=1e-3,
            weight_decay_mask=matrices_only,
            eps=1e-20,
        ),
        optax.adafactor(
            0.05,
            min_dim_size_to_factor=4,
            decay_rate=0.6,
            clipping_threshold=0.5,
            momentum=0.9,
            weight_decay_rate=1e-3,
            weight_decay_mask=matrices_only,
            eps=1e-20,
        ),
        adafactor_tree(),
    )


def test_adafactor_unfactored_without_clipping_or_scale_matches_optax():
    ours, theirs = warmup_cosine()
    compare(
        eqxopt.Adafactor(
            ours,
            multiply_by_parameter_scale=False,
            clipping_threshold=None,
            factored=False,
        ),
        optax.adafactor(
            theirs,
            multiply_by_parameter_scale=False,
            clipping_threshold=None,
            factored=False,
        ),
        adafactor_tree(),
    )


# --- Errors ------------------------------------------------------------------------


def test_adafactor_rejects_bad_structure_arguments():
    with pytest.raises(TypeError, match="min_dim_size_to_factor must be an int"):
        eqxopt.Adafactor(min_dim_size_to_factor=2.5)
    with pytest.raises(ValueError, match="min_dim_size_to_factor must be an int >= 1"):
        eqxopt.Adafactor(min_dim_size_to_factor=0)
    with pytest.raises(ValueError, match="decay_offset must be >= 0"):
        eqxopt.Adafactor(decay_offset=-1)
    with pytest.raises(TypeError, match="decay_offset must be an integer"):
        eqxopt.Adafactor(decay_offset=1.5)
    with pytest.raises(ValueError, match="decay_offset must be an integer scalar"):
        eqxopt.Adafactor(decay_offset=jnp.zeros(2, jnp.int32))
    with pytest.raises(TypeError, match="factored must be a bool"):
        eqxopt.Adafactor(factored=1)
    with pytest.raises(TypeError, match="multiply_by_parameter_scale must be a bool"):
        eqxopt.Adafactor(multiply_by_parameter_scale="yes")
    with pytest.raises(TypeError, match="dtype_momentum must be a float dtype"):
        eqxopt.Adafactor(momentum=0.9, dtype_momentum=jnp.int32)


def test_lars_rejects_a_non_bool_nesterov():
    with pytest.raises(TypeError, match="nesterov must be a bool"):
        eqxopt.LARS(0.1, nesterov=None)


def test_adan_rejects_eps_and_eps_root_both_zero():
    with pytest.raises(ValueError, match="eps and eps_root must not both be 0"):
        eqxopt.Adan(0.1, eps=0.0, eps_root=0.0)


def test_sm3_rejects_complex_parameters_naming_the_leaf():
    params = {"z": jnp.ones(3, jnp.complex64)}
    with pytest.raises(TypeError, match=r"real parameters only; params\['z'\]"):
        eqxopt.SM3(0.1).init(params)


def test_a_mask_of_the_wrong_structure_is_named():
    params = nested_tree()
    grads = jax.tree.map(jnp.ones_like, params)
    opt = eqxopt.LARS(0.1, trust_ratio_mask={"scale": True})
    with pytest.raises(ValueError, match="trust_ratio_mask does not have the tree"):
        opt.update(grads, opt.init(params), params)


def test_adafactor_decay_offset_matches_optax_on_a_resumed_state():
    # optax's decay schedule is NaN before the offset, so compare from step 10 on.
    params = adafactor_tree()
    kwargs = dict(min_dim_size_to_factor=4, decay_rate=0.7, decay_offset=6)
    opt = eqxopt.Adafactor(0.05, **kwargs)
    tx = optax.adafactor(0.05, **kwargs)
    state = eqx.tree_at(lambda s: s.step, opt.init(params), jnp.asarray(10, jnp.int32))
    tx_state = tx.init(params)
    tx_state = (tx_state[0]._replace(count=jnp.asarray(10, jnp.int32)), *tx_state[1:])
    ours, theirs = [], []
    p_ours = p_theirs = params
    update = jax.jit(tx.update)
    for g in grad_stream(params, STEPS):
        p_ours, state = opt.step(g, state, p_ours)
        u, tx_state = update(g, tx_state, p_theirs)
        p_theirs = optax.apply_updates(p_theirs, u)
        ours.append(p_ours)
        theirs.append(p_theirs)
    assert_histories_close(ours, theirs)


def test_adafactor_steps_before_the_offset_are_finite():
    params = adafactor_tree()
    grads = list(grad_stream(params, 4))
    history = run_eqxopt(eqxopt.Adafactor(decay_offset=3), params, grads)
    for leaf in jax.tree.leaves(history):
        assert bool(jnp.all(jnp.isfinite(leaf)))
    # Before the offset beta is 0: each step is normalised by its own gradient only.
    expected = run_eqxopt(eqxopt.Adafactor(decay_rate=0.0), params, grads)
    assert_histories_close(history, expected)


# --- Scheduled hyperparameters and mask forms (issue 14) ----------------------------
#
# Every float hyperparameter may be a schedule, read at the step like the learning
# rate: the run must equal the optimizer rebuilt at every step with the schedule's
# value at that step as a plain number (the state carried over).

SCHEDULE_STEPS = 8


def run_rebuilt_each_step(make, schedules, params, grads):
    """`make(**numbers)` rebuilt before every step with each schedule's value there."""

    def numbers(step):
        return {k: float(s(jnp.asarray(step, jnp.int32))) for k, s in schedules.items()}

    state = make(**numbers(0)).init(params)
    history = []
    for step, g in enumerate(grads):
        updates, state = make(**numbers(step)).update(g, state, params)
        params = eqxopt.apply_updates(params, updates)
        history.append(params)
    return history


SCHEDULED = {
    "LAMB": (
        lambda **kw: eqxopt.LAMB(0.05, mask=matrices_only, **kw),
        {"b1": eqxopt.Linear(0.5, 0.95, 6), "weight_decay": eqxopt.Linear(0.0, 0.3, 6)},
    ),
    "LARS": (
        lambda **kw: eqxopt.LARS(0.5, weight_decay=1e-3, **kw),
        {
            "momentum": eqxopt.Linear(0.0, 0.9, 6),
            "trust_coefficient": eqxopt.Linear(0.1, 0.01, 6),
        },
    ),
    "Fromage": (
        lambda **kw: eqxopt.Fromage(0.05, **kw),
        {"min_norm": eqxopt.Linear(2.0, 0.0, 6)},
    ),
    "NovoGrad": (
        lambda **kw: eqxopt.NovoGrad(0.02, **kw),
        {"b2": eqxopt.Linear(0.9, 0.1, 6), "weight_decay": eqxopt.Linear(0.0, 0.1, 6)},
    ),
    "SM3": (
        lambda **kw: eqxopt.SM3(0.1, **kw),
        {"momentum": eqxopt.Linear(0.0, 0.9, 6)},
    ),
    "Adafactor": (
        lambda **kw: eqxopt.Adafactor(
            0.05, min_dim_size_to_factor=4, momentum=0.5, **kw
        ),
        {
            "decay_rate": eqxopt.Linear(0.5, 0.9, 6),
            "clipping_threshold": eqxopt.Linear(0.5, 2.0, 6),
            "weight_decay_rate": eqxopt.Linear(0.0, 1e-2, 6),
        },
    ),
}


@pytest.mark.parametrize("name", list(SCHEDULED))
def test_scheduled_hyperparameters_are_read_at_the_step(name):
    make, schedules = SCHEDULED[name]
    params = adafactor_tree() if name == "Adafactor" else nested_tree()
    grads = list(grad_stream(params, SCHEDULE_STEPS))
    scheduled = run_eqxopt(make(**schedules), params, grads)
    rebuilt = run_rebuilt_each_step(make, schedules, params, grads)
    assert_histories_close(scheduled, rebuilt, rtol=1e-6, atol=1e-7)
    # The schedules matter: fixed at their first values, the run differs.
    first = {k: float(s(jnp.asarray(0, jnp.int32))) for k, s in schedules.items()}
    fixed = run_eqxopt(make(**first), params, grads)
    change = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(fixed[-1]), jax.tree.leaves(scheduled[-1]))
    )
    assert change > 1e-3, f"the schedules changed the parameters by only {change}"


MASK_TREE = {  # what matrices_only gives on nested_tree()
    "scale": False,
    "dense": {"w": True, "b": False},
    "layers": [{"w": True, "b": False}, (False, False)],
}


@pytest.mark.parametrize(
    "mask",
    [matrices_only, MASK_TREE, jax.tree.map(jnp.asarray, MASK_TREE)],
    ids=["function", "bools", "bool-arrays"],
)
def test_lamb_takes_every_mask_form_as_adamw_does(mask):
    params = nested_tree()
    grads = list(grad_stream(params, 4))
    ours = run_eqxopt(eqxopt.LAMB(0.05, weight_decay=0.5, mask=mask), params, grads)
    theirs = run_optax(
        optax.lamb(0.05, weight_decay=0.5, mask=matrices_only), params, grads
    )
    assert_histories_close(ours, theirs)
    # The mask is frozen (a static field): an equal one built again is equal.
    assert eqxopt.LAMB(0.05, mask=mask).mask == eqxopt.LAMB(0.05, mask=mask).mask


def test_layerwise_masks_are_checked_at_init():
    params = nested_tree()
    with pytest.raises(ValueError, match="mask does not have the tree structure"):
        eqxopt.LAMB(0.1, mask={"scale": True}).init(params)
    with pytest.raises(ValueError, match="weight_decay_mask does not have the tree"):
        eqxopt.LARS(0.1, weight_decay_mask={"scale": True}).init(params)
    with pytest.raises(ValueError, match="weight_decay_mask does not have the tree"):
        eqxopt.Adafactor(weight_decay_mask={"scale": True}).init(params)
    with pytest.raises(TypeError, match=r"mask\['dense'\] must be a bool"):
        eqxopt.LAMB(0.1, mask={**MASK_TREE, "dense": 1.0})
