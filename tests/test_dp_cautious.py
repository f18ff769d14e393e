"""ACProp, SimplifiedAdEMAMix and OptimisticAdamV1 against optax; `Cautious` against
`CAdamW` and a float64 NumPy transcription around Lion and SGD; DP-SGD and its
clipping functions against optax (per-example gradients of 6 examples).

Every reference run is 30 steps on `nested_tree()` with the same gradient stream,
compared after every step at rtol 2e-5 / atol 2e-6 (float32 rounding; measured:
at most 4e-6 absolute on parameters of order 1).
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
    assert_trees_close,
    grad_stream,
    nested_tree,
    run_eqxopt,
    run_optax,
)

STEPS = 30
PARAMS = nested_tree()
GRADS = list(grad_stream(PARAMS, STEPS))
LR = 0.01

# (id, eqxopt optimizer, optax optimizer)
OPTAX_CASES = [
    ("ACProp", lambda: eqxopt.ACProp(LR), lambda: optax.contrib.acprop(LR)),
    (
        "ACProp-positional-decay",
        lambda: eqxopt.ACProp(LR, 0.8, 0.99, 1e-6, eps_root=1e-8, weight_decay=0.1),
        lambda: optax.contrib.acprop(LR, 0.8, 0.99, 1e-6, 1e-8, 0.1),
    ),
    (
        "SimplifiedAdEMAMix",
        lambda: eqxopt.SimplifiedAdEMAMix(LR),
        lambda: optax.contrib.simplified_ademamix(LR),
    ),
    (
        "SimplifiedAdEMAMix-positional-decay",
        lambda: eqxopt.SimplifiedAdEMAMix(
            LR, 0.9, 0.99, 2.0, 1e-6, eps_root=1e-8, weight_decay=0.1
        ),
        lambda: optax.contrib.simplified_ademamix(LR, 0.9, 0.99, 2.0, 1e-6, 1e-8, 0.1),
    ),
]


def _optimistic_adam_v1(*args, **kwargs):
    with pytest.warns(DeprecationWarning, match="optimistic_adam"):
        return optax.optimistic_adam(*args, **kwargs)


OPTAX_CASES += [
    (
        "OptimisticAdamV1",
        lambda: eqxopt.OptimisticAdamV1(LR),
        lambda: _optimistic_adam_v1(LR),
    ),
    (
        "OptimisticAdamV1-options",
        lambda: eqxopt.OptimisticAdamV1(
            LR, optimism=0.03, b1=0.8, b2=0.99, eps=1e-6, eps_root=1e-8, nesterov=False
        ),
        lambda: _optimistic_adam_v1(LR, 0.03, 0.8, 0.99, 1e-6, 1e-8, nesterov=False),
    ),
]


@pytest.mark.parametrize("case", OPTAX_CASES, ids=[c[0] for c in OPTAX_CASES])
def test_matches_optax(case):
    _, make_ours, make_ref = case
    assert_histories_close(
        run_eqxopt(make_ours(), PARAMS, GRADS), run_optax(make_ref(), PARAMS, GRADS)
    )


def test_optimistic_adam_v1_is_optimistic_adam_with_unit_learning_rate():
    lr = eqxopt.WarmupCosine(0.02, 0.002, 5, STEPS)  # optax's v1 takes no schedule
    assert_histories_close(
        run_eqxopt(eqxopt.OptimisticAdamV1(lr, optimism=0.01), PARAMS, GRADS),
        run_eqxopt(eqxopt.OptimisticAdam(1.0, alpha=lr, beta=0.01), PARAMS, GRADS),
    )


def test_simplified_ademamix_alpha_schedule_matches_optax():
    alpha = eqxopt.WarmupCosine(3.0, 0.5, 5, STEPS)
    ours = eqxopt.SimplifiedAdEMAMix(LR, alpha=alpha)
    ref = optax.contrib.simplified_ademamix(LR, alpha=lambda step: alpha(step))
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: eqxopt.ACProp(LR, b2=1.0), "b2"),
        (lambda: eqxopt.ACProp(LR, eps_root=-1.0), "eps_root"),
        (lambda: eqxopt.SimplifiedAdEMAMix(LR, alpha=-1.0), "alpha"),
        (lambda: eqxopt.OptimisticAdamV1(LR, optimism=-1.0), "optimism"),
        (lambda: eqxopt.SimplifiedAdEMAMix(LR, weight_decay=-0.1), "weight_decay"),
    ],
)
def test_bad_values_name_the_argument(make, argument):
    with pytest.raises(ValueError, match=f"^{argument} must be"):
        make()


# ----------------------------------------------------------------------- Cautious


def _masked(u, g):
    """The cautious masking in float64 NumPy: `u` where `-u * g > 0`, scaled."""
    agree = (-u * g > 0).astype(np.float64)
    return u * agree * agree.size / (agree.sum() + 1)


def _numpy_run(rule, n_state):
    """`rule(g, p, *state) -> (update, *state)` per leaf in float64 over GRADS."""
    p = [np.asarray(x, np.float64) for x in jax.tree.leaves(PARAMS)]
    state = [[np.zeros_like(x) for _ in range(n_state)] for x in p]
    history = []
    for g_tree in GRADS:
        for i, g in enumerate(jax.tree.leaves(g_tree)):
            u, *state[i] = rule(np.asarray(g, np.float64), p[i], *state[i])
            p[i] = p[i] + _masked(u, np.asarray(g, np.float64))
        history.append(jax.tree.unflatten(jax.tree.structure(PARAMS), list(p)))
    return history


# Decay for the dense layer and the first of `layers`, not the rest.
_DECAY_MASK = {"scale": False, "dense": True, "layers": [True, (False, False)]}


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (
            lambda: eqxopt.Cautious(
                eqxopt.AdamW(0.05, 0.9, 0.99, 1e-8, weight_decay=0)
            ),
            lambda: eqxopt.CAdamW(0.05, 0.9, 0.99, 1e-8, weight_decay=0.0),
        ),
        (
            lambda: eqxopt.Cautious(
                eqxopt.AdamW(0.05, 0.8, 0.99, 1e-6, weight_decay=0.1)
            ),
            lambda: eqxopt.CAdamW(0.05, 0.8, 0.99, 1e-6, weight_decay=0.1),
        ),
        (lambda: eqxopt.Cautious(eqxopt.AdamW(0.05)), lambda: eqxopt.CAdamW(0.05)),
        (
            lambda: eqxopt.Cautious(
                eqxopt.AdamW(
                    eqxopt.Linear(0.05, 0.01, 20),
                    weight_decay=eqxopt.CosineDecay(0.3, 25),
                    mask=_DECAY_MASK,
                )
            ),
            lambda: eqxopt.CAdamW(
                eqxopt.Linear(0.05, 0.01, 20),
                weight_decay=eqxopt.CosineDecay(0.3, 25),
                mask=_DECAY_MASK,
            ),
        ),
        (
            lambda: eqxopt.Chain(
                eqxopt.Cautious(eqxopt.Adam(0.05, 0.8, 0.99, 1e-6)),
                eqxopt.DecoupledWeightDecay(0.05, 0.1),
            ),
            lambda: eqxopt.CAdamW(0.05, 0.8, 0.99, 1e-6, weight_decay=0.1),
        ),
    ],
    ids=["AdamW", "AdamW-decay", "defaults", "schedules-mask", "Adam-then-decay"],
)
def test_cautious_adamw_is_cadamw(ours, theirs):
    # Measured: at most 1.2e-7 apart over the 30 steps (the same masking code;
    # the learning rate is multiplied in before the mask instead of after).
    # `Cautious` leaves AdamW's decoupled decay out of the mask, as CAdamW does.
    assert_histories_close(
        run_eqxopt(ours(), PARAMS, GRADS), run_eqxopt(theirs(), PARAMS, GRADS)
    )


# Every optimizer that declares its weight decay decoupled; each takes the learning
# rate first and `weight_decay` and `mask` by name.
DECOUPLED_CLASSES = [
    eqxopt.AdamW,
    eqxopt.AMSGrad,
    eqxopt.NAdamW,
    eqxopt.AdamaxW,
    eqxopt.AdamMini,
    eqxopt.CAdamW,
    eqxopt.MARS,
    eqxopt.Lion,
    eqxopt.RAdam,
    eqxopt.ACProp,
    eqxopt.AdEMAMix,
    eqxopt.SimplifiedAdEMAMix,
    eqxopt.Adan,
]
DECOUPLED = {
    cls: lambda lr, wd, mask, cls=cls: cls(lr, weight_decay=wd, mask=mask)
    for cls in DECOUPLED_CLASSES
}


def test_every_decoupled_decay_declaration_is_tested():
    declared = {
        cls
        for name in eqxopt.__all__
        if isinstance(cls := getattr(eqxopt, name), type)
        and issubclass(cls, eqxopt.extend.AbstractLeafwiseOptimizer)
        and cls.decoupled_decay is not None
    }
    assert declared == set(DECOUPLED)


@pytest.mark.parametrize(
    "make", DECOUPLED.values(), ids=[c.__name__ for c in DECOUPLED]
)
def test_declared_decoupled_decay_is_the_undecayed_update_minus_lr_wd_p(make):
    # The promise `decoupled_decay` makes, over many steps: with decay, each step's
    # update is the undecayed optimizer's update (same state) minus lr * wd * p at
    # the masked leaves.
    lr, wd = 0.01, 0.3
    decayed, undecayed = make(lr, wd, _DECAY_MASK), make(lr, 0.0, _DECAY_MASK)
    # The mask is a prefix of the params: one flag per leaf below each entry.
    flags = jax.tree.leaves(
        jax.tree.map(lambda m, p: jax.tree.map(lambda _: m, p), _DECAY_MASK, PARAMS)
    )
    state, params = decayed.init(PARAMS), PARAMS
    for g in GRADS[:10]:
        u, new_state = decayed.update(g, state, params)
        v, same_state = undecayed.update(g, state, params)
        assert_trees_close(new_state, same_state, rtol=0, atol=0)
        expected = [
            v_leaf - lr * wd * p if flag else v_leaf
            for v_leaf, p, flag in zip(
                jax.tree.leaves(v), jax.tree.leaves(params), flags
            )
        ]
        assert_trees_close(jax.tree.leaves(u), expected, rtol=2e-6, atol=2e-8)
        params, state = eqxopt.apply_updates(params, u), new_state


@pytest.mark.parametrize(
    "make", DECOUPLED.values(), ids=[c.__name__ for c in DECOUPLED]
)
def test_cautious_leaves_a_decoupled_decay_unmasked(make):
    lr, wd = 0.01, 0.3
    ours = eqxopt.Cautious(make(lr, wd, _DECAY_MASK))
    theirs = eqxopt.Chain(
        eqxopt.Cautious(make(lr, 0.0, _DECAY_MASK)),
        eqxopt.DecoupledWeightDecay(lr, wd, mask=_DECAY_MASK),
    )
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_eqxopt(theirs, PARAMS, GRADS)
    )


def test_cautious_masks_a_decay_that_is_not_declared_decoupled():
    # LAMB's decay is inside its trust ratio, so the wrapper masks the whole
    # update: here the decay turns the second coordinate against its gradient.
    lamb = eqxopt.LAMB(0.01, weight_decay=1.0)
    params = {"w": jnp.array([1.0, 2.0, -1.0, 0.5])}
    grads = {"w": jnp.array([1.0, -1.0, 1.0, -1.0])}
    inner_updates, _ = lamb.update(grads, lamb.init(params), params)
    updates, _ = eqxopt.Cautious(lamb).update(grads, lamb.init(params), params)
    keep = (-inner_updates["w"] * grads["w"] > 0).astype(jnp.float32)
    expected = inner_updates["w"] * keep * 4 / (jnp.sum(keep) + 1)
    assert jnp.allclose(updates["w"], expected)
    assert jnp.any(keep == 0)


def test_cautious_lion_matches_numpy():
    lr, b1, b2 = 0.01, 0.9, 0.99

    def lion(g, p, mu):
        u = -lr * np.sign(b1 * mu + (1 - b1) * g)
        return u, b2 * mu + (1 - b2) * g

    ours = eqxopt.Cautious(eqxopt.Lion(lr, b1, b2, weight_decay=0.0))
    assert_histories_close(run_eqxopt(ours, PARAMS, GRADS), _numpy_run(lion, 1))


@pytest.mark.parametrize("nesterov", [False, True])
def test_cautious_sgd_momentum_matches_numpy(nesterov):
    lr, momentum = 0.05, 0.9

    def sgd(g, p, v):
        v = momentum * v + g
        return -lr * (g + momentum * v if nesterov else v), v

    ours = eqxopt.Cautious(eqxopt.SGD(lr, momentum, nesterov=nesterov))
    # `step` (the fused path) as well as `update`
    state, params, history = ours.init(PARAMS), PARAMS, []
    for g in GRADS:
        params, state = ours.step(g, state, params)
        history.append(params)
    assert_histories_close(history, _numpy_run(sgd, 1))
    assert_histories_close(run_eqxopt(ours, PARAMS, GRADS), _numpy_run(sgd, 1))


def test_cautious_drops_disagreeing_coordinates_and_keeps_state():
    params = {"w": jnp.zeros(4), "b": jnp.zeros(2)}
    grads = {"w": jnp.array([1.0, -1.0, 2.0, -2.0]), "b": None}
    opt = eqxopt.Cautious(eqxopt.SGD(0.1, 0.9))
    state = opt.init(params)
    assert isinstance(state, eqxopt.SGDState)
    state = eqx.tree_at(lambda s: s.velocity["w"], state, jnp.array([-9.0, 0, 0, 0]))
    updates, state = opt.update(grads, state, params)
    # velocity 0.9 * v + g: [-7.1, -1, 2, -2]: the first element climbs the
    # gradient and is dropped; the other three are scaled by 4 / (3 + 1) = 1.
    assert jnp.allclose(updates["w"], jnp.array([0.0, 0.1, -0.2, 0.2]))
    assert updates["b"] is None
    assert jnp.allclose(state.velocity["w"], jnp.array([-7.1, -1.0, 2.0, -2.0]))


def test_cautious_refuses_what_is_not_an_eqxopt_optimizer():
    with pytest.raises(TypeError, match=r"^inner must be an eqxopt transform"):
        eqxopt.Cautious(optax.adam(0.1))  # pyright: ignore[reportArgumentType]


# --------------------------------------------------------- differential privacy

BATCH = 6
CLIP = 1.5


def _per_example_stream(params, steps, seed=2):
    """Per-example gradients (a leading batch axis of BATCH): examples of very
    different sizes, so some are clipped and some are not at CLIP."""
    key = jax.random.key(seed)
    scales = jnp.array([0.05, 0.2, 0.5, 1.0, 2.0, 4.0])
    out = []
    for _ in range(steps):
        key, sub = jax.random.split(key)
        leaves, treedef = jax.tree.flatten(params)
        keys = jax.random.split(sub, len(leaves))
        out.append(
            treedef.unflatten(
                [
                    jax.random.normal(k, (BATCH, *p.shape))
                    * scales.reshape((BATCH,) + (1,) * p.ndim)
                    for k, p in zip(keys, leaves)
                ]
            )
        )
    return out


PER_EXAMPLE = _per_example_stream(PARAMS, STEPS)


@pytest.mark.parametrize(
    "noise_multiplier, momentum, nesterov",
    [(0.0, None, False), (0.0, 0.9, False), (0.0, 0.9, True), (0.8, 0.9, True)],
    ids=["plain", "momentum", "nesterov", "noised"],
)
def test_dpsgd_matches_optax(noise_multiplier, momentum, nesterov):
    # With noise too: the same seed splits into the same keys as optax's
    # (measured: at most 1.2e-7 apart over the 30 steps).
    ours = eqxopt.DPSGD(0.05, CLIP, noise_multiplier, 7, momentum, nesterov)
    with pytest.warns(DeprecationWarning):  # optax's own `seed=` inside dpsgd
        ref = optax.contrib.dpsgd(0.05, CLIP, noise_multiplier, 7, momentum, nesterov)
    assert_histories_close(
        run_eqxopt(ours, PARAMS, PER_EXAMPLE), run_optax(ref, PARAMS, PER_EXAMPLE)
    )


def test_aggregate_in_a_chain_matches_optax_with_a_typed_key():
    key = jax.random.key(11)
    ours = eqxopt.Chain(
        eqxopt.DifferentiallyPrivateAggregate(CLIP, 0.5, key), eqxopt.Adam(0.01)
    )
    ref = optax.chain(
        optax.contrib.differentially_private_aggregate(CLIP, 0.5, key),
        optax.adam(0.01),
    )
    assert_histories_close(
        run_eqxopt(ours, PARAMS, PER_EXAMPLE), run_optax(ref, PARAMS, PER_EXAMPLE)
    )


def test_dpsgd_step_donated_and_without_params_give_update_numbers():
    opt = eqxopt.DPSGD(0.05, CLIP, 0.5, 3, momentum=0.5)
    expected = run_eqxopt(opt, PARAMS, PER_EXAMPLE[:5])
    params, state = jax.tree.map(jnp.copy, PARAMS), opt.init(PARAMS)
    for step, g in enumerate(PER_EXAMPLE[:5]):
        params, state = opt.step(g, state, params, donate=True)
        assert_trees_close(params, expected[step])
    updates, _ = opt.update(PER_EXAMPLE[0], opt.init(PARAMS))
    with_params, _ = opt.update(PER_EXAMPLE[0], opt.init(PARAMS), PARAMS)
    assert_trees_close(updates, with_params)


def test_noise_has_the_right_std_and_comes_from_the_seed():
    params = {"w": jnp.zeros((200, 250)), "b": jnp.zeros(3)}
    zeros = jax.tree.map(lambda p: jnp.zeros((4, *p.shape)), params)
    opt = eqxopt.DifferentiallyPrivateAggregate(2.0, 0.75, 5)
    state = opt.init(params)
    first, state = opt.update(zeros, state, params)
    second, _ = opt.update(zeros, state, params)
    # the noise of the average over 4 examples: std 2.0 * 0.75 / 4 = 0.375; over
    # 50 000 draws the sample std is within 1% of it (about 7 standard errors)
    noise = np.asarray(first["w"])
    assert abs(noise.std() / 0.375 - 1) < 0.01
    assert abs(noise.mean()) < 0.01
    again, _ = opt.update(zeros, opt.init(params), params)
    assert np.array_equal(np.asarray(again["w"]), noise)  # the same seed
    assert not np.allclose(np.asarray(second["w"]), noise)  # the key moves on
    other = eqxopt.DifferentiallyPrivateAggregate(2.0, 0.75, 6)
    moved, _ = other.update(zeros, other.init(params), params)
    assert not np.allclose(np.asarray(moved["w"]), noise)


@pytest.mark.parametrize("uniform", [True, False])
def test_clip_functions_match_optax(uniform):
    grads = PER_EXAMPLE[0]
    ours, n_ours = eqxopt.per_example_global_norm_clip(grads, CLIP)
    leaves = jax.tree.leaves(grads)
    theirs, n_theirs = optax.per_example_global_norm_clip(leaves, CLIP)
    assert_trees_close(jax.tree.leaves(ours), theirs)
    assert int(n_ours) == int(n_theirs) > 0
    ours, n_ours = eqxopt.per_example_layer_norm_clip(grads, CLIP, uniform)
    theirs, n_theirs = optax.per_example_layer_norm_clip(leaves, CLIP, uniform)
    assert_trees_close(jax.tree.leaves(ours), theirs)
    assert [int(n) for n in jax.tree.leaves(n_ours)] == [int(n) for n in n_theirs]


def test_clip_functions_refuse_a_negative_bound():
    # Issue 39, item 4: a negative bound flipped the gradients' sign.
    grads = PER_EXAMPLE[0]
    with pytest.raises(ValueError, match=r"^l2_norm_clip must be in \[0\.0, inf\]"):
        eqxopt.per_example_global_norm_clip(grads, -1.0)
    with pytest.raises(ValueError, match=r"^global_l2_norm_clip must be in \[0\.0"):
        eqxopt.per_example_layer_norm_clip(grads, -1.0)
    with pytest.raises(ValueError, match=r"^global_l2_norm_clip must be in \[0\.0"):
        eqxopt.per_example_layer_norm_clip(grads, jnp.asarray(jnp.nan), False)
    # A bound of 0 clips everything to zero; a traced one is taken as it comes.
    zero, _ = eqxopt.per_example_global_norm_clip(grads, 0.0)
    assert all(bool(jnp.all(x == 0)) for x in jax.tree.leaves(zero))
    traced = jax.jit(eqxopt.per_example_global_norm_clip)(grads, CLIP)
    assert_trees_close(traced, eqxopt.per_example_global_norm_clip(grads, CLIP))


def test_update_refuses_gradients_without_the_batch_axis():
    opt = eqxopt.DPSGD(0.05, CLIP, 0.0, 0)
    state = opt.init(PARAMS)
    grads = jax.tree.map(jnp.ones_like, PARAMS)
    with pytest.raises(ValueError, match=r"^grads\['dense'\]\['b'\] has shape .* but "):
        opt.update(grads, state, PARAMS)
    uneven = dict(PER_EXAMPLE[0], scale=jnp.ones((BATCH + 1, *PARAMS["scale"].shape)))
    with pytest.raises(ValueError, match=r"^grads\['scale'\] has a batch of 7 "):
        opt.update(uneven, state, PARAMS)
    with pytest.raises(ValueError, match=r"^grads\[0\] is a scalar"):
        eqxopt.per_example_global_norm_clip([jnp.ones(())], 1.0)
    with pytest.raises(ValueError, match=r"^grads\[1\] has a batch of 2 "):
        eqxopt.per_example_layer_norm_clip([jnp.ones((3, 2)), jnp.ones((2, 2))], 1.0)


def test_dp_arguments_are_checked():
    with pytest.raises(ValueError, match=r"^l2_norm_clip must be in"):
        eqxopt.DPSGD(0.1, -1.0, 1.0, 0)
    with pytest.raises(ValueError, match=r"^noise_multiplier must be in"):
        eqxopt.DifferentiallyPrivateAggregate(1.0, -1.0, 0)
    with pytest.raises(ValueError, match=r"^momentum must be in"):
        eqxopt.DPSGD(0.1, 1.0, 1.0, 0, momentum=1.5)
    with pytest.raises(TypeError, match=r"^seed must be an integer seed or a JAX"):
        eqxopt.DPSGD(0.1, 1.0, 1.0, "0")
    with pytest.raises(TypeError, match="key="):
        eqxopt.DifferentiallyPrivateAggregate(1.0, 1.0, key=0)
    with pytest.raises(ValueError, match=r"^links\[1\] \(DPSGD\) takes per-example"):
        eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.DPSGD(0.1, 1.0, 1.0, 0))
