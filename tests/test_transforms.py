"""Gradient transforms, Chain and parameter groups, against optax / torch."""

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
    assert_moved,
    assert_trees_close,
    grad_stream,
    nested_tree,
    run_eqxopt,
    run_optax,
    run_torch,
)

STEPS = 30
PARAMS = nested_tree()


def scaled_grads(steps=STEPS, seed=1):
    """Gradients whose global norm ranges from ~0.2 to ~20, so clipping both
    triggers and not."""
    scales = np.geomspace(0.05, 5.0, steps)[
        np.random.default_rng(seed).permutation(steps)
    ]
    return [
        jax.tree.map(lambda g, s=s: g * s, g)
        for g, s in zip(grad_stream(PARAMS, steps, seed), scales)
    ]


GRADS = scaled_grads()

# A mask/labels tree: True/"decay" on the matrices, False on scalars and vectors.
MATRIX_MASK = jax.tree.map(lambda p: p.ndim >= 2, PARAMS)


# ---------------------------------------------------------------------------------
# Clipping


def test_clip_by_value_matches_optax():
    ours = eqxopt.Chain(eqxopt.ClipByValue(0.5), eqxopt.SGD(0.1))
    ref = optax.chain(optax.clip(0.5), optax.sgd(0.1))
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )


def test_clip_by_global_norm_matches_optax_and_torch():
    ours = eqxopt.Chain(eqxopt.ClipByGlobalNorm(2.0), eqxopt.SGD(0.1, momentum=0.9))
    ref = optax.chain(optax.clip_by_global_norm(2.0), optax.sgd(0.1, momentum=0.9))
    history = run_eqxopt(ours, PARAMS, GRADS)
    assert_histories_close(history, run_optax(ref, PARAMS, GRADS))

    def make_torch(tensors):
        sgd = torch.optim.SGD(tensors, lr=0.1, momentum=0.9)

        class Clipped:
            def step(self):
                torch.nn.utils.clip_grad_norm_(tensors, 2.0)
                sgd.step()

        return Clipped()

    # torch divides by (norm + 1e-6): a relative difference of ~1e-6 per step.
    assert_histories_close(
        history, run_torch(make_torch, PARAMS, GRADS), rtol=1e-4, atol=1e-5
    )


def test_clip_by_global_norm_records_the_norm_and_clips_to_it():
    opt = eqxopt.ClipByGlobalNorm(1.0)
    state = opt.init(PARAMS)
    updates, state = opt.update(GRADS[0], state, PARAMS)
    expected = float(optax.tree.norm(GRADS[0]))
    np.testing.assert_allclose(float(state.norm), expected, rtol=1e-6)
    np.testing.assert_allclose(
        float(eqxopt.global_norm(updates)), min(expected, 1.0), rtol=1e-5
    )


def test_global_norm_skips_none_and_non_float_leaves():
    tree = {
        "a": jnp.array([3.0]),
        "b": None,
        "c": jnp.array([4.0]),
        "d": "x",
        "e": jnp.array([7], jnp.int32),
    }
    assert float(eqxopt.global_norm(tree)) == 5.0
    assert float(eqxopt.global_norm({})) == 0.0
    np.testing.assert_allclose(
        float(eqxopt.global_norm(GRADS[3])), float(optax.tree.norm(GRADS[3])), rtol=1e-6
    )


def test_clipping_all_zero_gradients_gives_zeros_and_finite_gradients():
    zeros = jax.tree.map(jnp.zeros_like, PARAMS)
    opt = eqxopt.ClipByGlobalNorm(1.0)
    updates, state = opt.update(zeros, opt.init(PARAMS), PARAMS)
    for u in jax.tree.leaves(updates):
        np.testing.assert_array_equal(u, np.zeros_like(u))
    assert float(state.norm) == 0.0

    # Differentiating through the clip at zero (meta-gradients): no NaN.
    def clipped_sum(g):
        u, _ = opt.transform(g, opt.init(PARAMS), PARAMS)
        return sum(jnp.sum(x) for x in jax.tree.leaves(u))

    for d in jax.tree.leaves(jax.jit(jax.grad(clipped_sum))(zeros)):
        assert bool(jnp.all(jnp.isfinite(d)))
    assert bool(jnp.isfinite(jax.grad(eqxopt.global_norm)(zeros)["scale"]))


def _with_entry(tree, value):
    """`tree` with its first matrix's first entry set to `value` and a huge entry in
    its first vector (that a NaN norm must not let through unclipped)."""
    tree = jax.tree.map(jnp.array, tree)
    tree["dense"]["w"] = tree["dense"]["w"].at[0, 0].set(value)
    tree["dense"]["b"] = tree["dense"]["b"].at[0].set(1e6)
    return tree


@pytest.mark.parametrize("value", [np.nan, np.inf, 3.0])
def test_every_global_norm_agrees_with_optax_on_nan_and_inf(value):
    """One sum of squares and one root for every reduction that takes a global
    norm: NaN stays NaN and infinity stays infinite, as in optax."""
    grads = _with_entry(GRADS[0], value)
    expected = float(optax.tree.norm(grads))
    clip = eqxopt.ClipByGlobalNorm(1.0)
    _, clip_state = clip.update(grads, clip.init(PARAMS), PARAMS)
    monitor = eqxopt.Monitor(eqxopt.SGD(0.1))
    _, monitor_state = monitor.update(grads, monitor.init(PARAMS), PARAMS)
    skip = eqxopt.SkipLargeUpdates(eqxopt.SGD(0.1), 1e20)
    _, skip_state = skip.update(grads, skip.init(PARAMS), PARAMS)
    norms = {
        "global_norm": eqxopt.global_norm(grads),
        "tree_norm": eqxopt.tree_norm(grads),
        "ClipByGlobalNorm": clip_state.norm,
        "Monitor": monitor_state.grad_norm,
        "SkipLargeUpdates": jnp.sqrt(skip_state.norm_squared),
    }
    for name, got in norms.items():
        np.testing.assert_allclose(float(got), expected, rtol=1e-6, err_msg=name)


def test_clip_by_global_norm_of_a_nan_gradient_is_nan_as_optax():
    """A NaN gradient entry makes the norm NaN and every clipped update NaN (optax
    and torch alike), never the other gradients passed through unclipped."""
    grads = list(GRADS[:4])
    grads[1] = _with_entry(grads[1], np.nan)
    ours = eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.SGD(0.1))
    ref = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1))
    history = run_eqxopt(ours, PARAMS, grads)
    reference = run_optax(ref, PARAMS, grads)
    assert_moved(PARAMS, reference[0], rtol=2e-5, atol=2e-6)  # before the NaN
    for step, (a, e) in enumerate(zip(history, reference)):
        try:
            assert_trees_close(a, e)  # NaN where optax has NaN
        except AssertionError as err:
            raise AssertionError(f"step {step}: {err}") from None
    for leaf in jax.tree.leaves(history[-1]):
        assert bool(jnp.all(jnp.isnan(leaf)))
    opt = eqxopt.ClipByGlobalNorm(1.0)
    updates, state = opt.update(grads[1], opt.init(PARAMS), PARAMS)
    assert bool(jnp.isnan(state.norm))
    assert bool(jnp.isnan(updates["dense"]["b"][0]))  # the 1e6 entry


def test_global_norms_of_float64_leaves_are_float64_under_x64():
    """Reductions follow the precision of the leaves: float64 gradients have a
    float64 norm everywhere (a float32 sum is 1e-8 off optax's)."""
    with jax.enable_x64(True):
        params = nested_tree(dtype=jnp.float64)
        grads = jax.tree.map(lambda g: g.astype(jnp.float64) / 3.0, GRADS[5])
        expected = optax.tree.norm(grads)
        clip = eqxopt.ClipByGlobalNorm(1.0)
        _, clip_state = clip.update(grads, clip.init(params), params)
        monitor = eqxopt.Monitor(eqxopt.SGD(0.1))
        _, monitor_state = monitor.update(grads, monitor.init(params), params)
        skip = eqxopt.SkipLargeUpdates(eqxopt.SGD(0.1), 1e6)
        _, skip_state = skip.update(grads, skip.init(params), params)
        norms = {
            "global_norm": eqxopt.global_norm(grads),
            "tree_norm": eqxopt.tree_norm(grads),
            "ClipByGlobalNorm": clip_state.norm,
            "Monitor": monitor_state.grad_norm,
            "SkipLargeUpdates": jnp.sqrt(skip_state.norm_squared),
        }
        assert expected.dtype == jnp.float64
        for name, got in norms.items():
            assert got.dtype == jnp.float64, name
            np.testing.assert_allclose(got, expected, rtol=1e-15, err_msg=name)
        # float32 leaves keep float32 norms under x64 (as optax's).
        assert eqxopt.global_norm(GRADS[5]).dtype == jnp.float32


def test_clip_by_block_rms_matches_optax():
    ours = eqxopt.Chain(eqxopt.ClipByBlockRMS(0.7), eqxopt.SGD(0.1))
    ref = optax.chain(optax.clip_by_block_rms(0.7), optax.sgd(0.1))
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )


def test_adaptive_grad_clip_matches_optax():
    ours = eqxopt.Chain(eqxopt.AdaptiveGradClip(0.1), eqxopt.SGD(0.1))
    ref = optax.chain(optax.adaptive_grad_clip(0.1), optax.sgd(0.1))
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )


def test_adaptive_grad_clip_with_axis_matches_optax():
    params = {"w": PARAMS["dense"]["w"], "v": PARAMS["layers"][0]["w"]}
    grads = [{"w": g["dense"]["w"], "v": g["layers"][0]["w"]} for g in GRADS]
    ours = eqxopt.Chain(eqxopt.AdaptiveGradClip(0.05, axis=1), eqxopt.SGD(0.1))
    ref = optax.chain(optax.adaptive_grad_clip(0.05, axis=1), optax.sgd(0.1))
    assert_histories_close(
        run_eqxopt(ours, params, grads), run_optax(ref, params, grads)
    )


def test_adaptive_grad_clip_names_a_leaf_without_a_default_unit():
    params = {"big": jnp.ones((1, 1, 1, 1, 1, 2))}
    opt = eqxopt.AdaptiveGradClip(0.1)
    with pytest.raises(
        ValueError, match=r"params\['big'\] of shape \(1, 1, 1, 1, 1, 2\)"
    ):
        opt.update(params, opt.init(params), params)
    with pytest.raises(TypeError, match="axis must be"):
        eqxopt.AdaptiveGradClip(0.1, axis="rows")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------
# Weight decay, noise, centralisation


def test_add_decayed_weights_with_mask_matches_optax():
    ours = eqxopt.Chain(
        eqxopt.AddDecayedWeights(0.1, mask=MATRIX_MASK), eqxopt.SGD(0.1)
    )
    ref = optax.chain(optax.add_decayed_weights(0.1, mask=MATRIX_MASK), optax.sgd(0.1))
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )


def test_add_decayed_weights_before_sgd_is_torch_sgd_weight_decay():
    ours = eqxopt.Chain(eqxopt.AddDecayedWeights(0.05), eqxopt.SGD(0.1, momentum=0.9))
    expected = run_torch(
        lambda t: torch.optim.SGD(t, lr=0.1, momentum=0.9, weight_decay=0.05),
        PARAMS,
        GRADS,
    )
    assert_histories_close(run_eqxopt(ours, PARAMS, GRADS), expected)


def test_decoupled_weight_decay_after_adam_is_masked_adamw():
    schedule = eqxopt.WarmupCosine(0.05, 0.005, 5, STEPS)
    ref_schedule = optax.warmup_cosine_decay_schedule(0.0, 0.05, 5, STEPS, 0.005)
    ours = eqxopt.Chain(
        eqxopt.Adam(schedule),
        eqxopt.DecoupledWeightDecay(schedule, 0.1, mask=lambda p: MATRIX_MASK),
    )
    ref = optax.adamw(ref_schedule, weight_decay=0.1, mask=MATRIX_MASK)
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )


def test_decoupled_weight_decay_after_adam_is_torch_adamw():
    ours = eqxopt.Chain(eqxopt.Adam(0.01), eqxopt.DecoupledWeightDecay(0.01, 0.1))
    expected = run_torch(
        lambda t: torch.optim.AdamW(t, lr=0.01, weight_decay=0.1), PARAMS, GRADS
    )
    assert_histories_close(run_eqxopt(ours, PARAMS, GRADS), expected)


def test_add_noise_matches_optax_draw_for_draw():
    ours = eqxopt.Chain(eqxopt.AddNoise(0.3, 0.55, seed=3), eqxopt.SGD(0.1))
    ref = optax.chain(optax.add_noise(0.3, 0.55, key=3), optax.sgd(0.1))
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )


def test_centralize_matches_optax_and_the_paper():
    ours = eqxopt.Chain(eqxopt.Centralize(), eqxopt.SGD(0.1))
    ref = optax.chain(optax.centralize(), optax.sgd(0.1))
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )
    u, _ = eqxopt.Centralize().update(GRADS[0], eqxopt.EmptyState(), PARAMS)
    g = np.asarray(GRADS[0]["layers"][0]["w"])
    np.testing.assert_allclose(
        u["layers"][0]["w"], g - g.mean(axis=(1, 2), keepdims=True), atol=1e-6
    )
    np.testing.assert_array_equal(u["dense"]["b"], GRADS[0]["dense"]["b"])


# ---------------------------------------------------------------------------------
# Chain


def test_chain_state_fields_name_their_links():
    opt = eqxopt.Chain(
        eqxopt.ClipByGlobalNorm(1.0), eqxopt.AdamW(0.01), eqxopt.ClipByGlobalNorm(5.0)
    )
    state = opt.init(PARAMS)
    assert isinstance(state, eqxopt.ChainState)
    assert state.names == ("ClipByGlobalNorm", "AdamW", "ClipByGlobalNorm_1")
    _, state = opt.update(GRADS[0], state, PARAMS)
    assert isinstance(state["AdamW"], eqxopt.AdamState)
    assert int(state["AdamW"].step) == 1
    assert state[1] is state["AdamW"]
    assert float(state["ClipByGlobalNorm"].norm) > 0
    named = eqxopt.Chain(
        eqxopt.ClipByValue(1.0), eqxopt.SGD(0.1), names=("clip", "sgd")
    )
    assert named.init(PARAMS).names == ("clip", "sgd")
    with pytest.raises(KeyError, match="no link named 'Adam'"):
        state["Adam"]


def test_chain_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match="at least one link"):
        eqxopt.Chain()
    with pytest.raises(
        TypeError, match=r"links\[1\] must be an eqxopt transform.*from_optax"
    ):
        eqxopt.Chain(eqxopt.SGD(0.1), optax.sgd(0.1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="names must be 2 strings"):
        eqxopt.Chain(eqxopt.SGD(0.1), eqxopt.SGD(0.2), names=("a",))
    with pytest.raises(ValueError, match="names must be unique"):
        eqxopt.Chain(eqxopt.SGD(0.1), eqxopt.SGD(0.2), names=("a", "a"))
    opt = eqxopt.Chain(eqxopt.ClipByValue(1.0), eqxopt.SGD(0.1))
    with pytest.raises(
        TypeError, match=r"keyword argument\(s\) 'value'.*ClipByValue, SGD"
    ):
        opt.update(GRADS[0], opt.init(PARAMS), PARAMS, value=1.0)


def test_chain_passes_keywords_only_to_links_that_take_them():
    opt = eqxopt.Chain(eqxopt.SGD(0.1), eqxopt.ReduceOnPlateau(patience=1, factor=0.5))
    state = opt.init(PARAMS)
    _, state = opt.update(GRADS[0], state, PARAMS, value=1.0)
    _, state = opt.update(GRADS[0], state, PARAMS, value=1.0)  # no improvement
    assert float(state["ReduceOnPlateau"].scale) == 0.5


# ---------------------------------------------------------------------------------
# Partition, Masked, Freeze


def label_by_rank(leaf):
    return "decay" if leaf.ndim >= 2 else "no_decay"


GROUPS = {"decay": eqxopt.AdamW(0.01, weight_decay=0.1), "no_decay": eqxopt.Adam(0.02)}
OPTAX_GROUPS = {
    "decay": optax.adamw(0.01, weight_decay=0.1),
    "no_decay": optax.adam(0.02),
}
LABEL_TREE = jax.tree.map(label_by_rank, PARAMS)


@pytest.mark.parametrize(
    "labels", [label_by_rank, LABEL_TREE], ids=["function", "tree"]
)
def test_partition_matches_optax_partition(labels):
    ours = eqxopt.Partition(GROUPS, labels)
    ref = optax.partition(OPTAX_GROUPS, LABEL_TREE)
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )


def test_partition_keeps_state_only_for_each_groups_leaves():
    state = eqxopt.Partition(GROUPS, label_by_rank).init(PARAMS)
    assert set(state.groups) == {"decay", "no_decay"}
    decay_mu = state["decay"].mu
    assert decay_mu["dense"]["w"].shape == (3, 4)
    assert decay_mu["dense"]["b"] is None and decay_mu["scale"] is None
    assert state["no_decay"].mu["dense"]["w"] is None


def test_partition_of_an_equinox_model_reads_a_module_of_labels_as_a_tree():
    model = eqx.nn.MLP(2, 1, 4, 1, key=jax.random.key(0))
    arrays = eqx.filter(model, eqx.is_array)  # None at the activation functions
    labels = jax.tree.map(lambda x: "frozen" if x.ndim == 1 else "train", arrays)
    assert callable(labels)  # an MLP of labels is still callable; never called
    opt = eqxopt.Partition(
        {"train": eqxopt.SGD(0.1), "frozen": eqxopt.SGD(0.0)}, labels
    )
    grads = jax.tree.map(jnp.ones_like, eqx.filter(model, eqx.is_inexact_array))
    new, _ = opt.step(grads, opt.init(model), model)
    np.testing.assert_array_equal(new.layers[0].bias, model.layers[0].bias)
    np.testing.assert_allclose(new.layers[0].weight, model.layers[0].weight - 0.1)


def test_partition_label_none_means_not_optimised():
    labels = jax.tree.map(lambda p: None if p.ndim == 0 else "all", PARAMS)
    opt = eqxopt.Partition({"all": eqxopt.SGD(0.1)}, labels)
    new, _ = opt.step(GRADS[0], opt.init(PARAMS), PARAMS)
    np.testing.assert_array_equal(new["scale"], PARAMS["scale"])
    assert not np.array_equal(new["dense"]["w"], PARAMS["dense"]["w"])


def test_partition_errors_name_the_leaf_and_label():
    opt = eqxopt.Partition({"decay": eqxopt.SGD(0.1)}, label_by_rank)
    with pytest.raises(
        ValueError, match=r"params\['dense'\]\['b'\] has the label 'no_decay'"
    ):
        opt.init(PARAMS)
    bad = eqxopt.Partition(GROUPS, {"dense": "decay"})
    with pytest.raises(ValueError, match="labels does not have the tree structure"):
        bad.init(PARAMS)
    with pytest.raises(TypeError, match="non-empty dict"):
        eqxopt.Partition({}, label_by_rank)
    with pytest.raises(
        TypeError, match=r"transforms\['a'\] must be an eqxopt transform"
    ):
        eqxopt.Partition({"a": optax.sgd(0.1)}, label_by_rank)  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"hashable label.*called on each leaf"):
        eqxopt.Partition(GROUPS, lambda x: [1]).init(PARAMS)


def test_masked_matches_optax_masked():
    ours = eqxopt.Chain(
        eqxopt.Masked(eqxopt.ClipByValue(0.1), MATRIX_MASK), eqxopt.SGD(0.1)
    )
    ref = optax.chain(optax.masked(optax.clip(0.1), MATRIX_MASK), optax.sgd(0.1))
    assert_histories_close(
        run_eqxopt(ours, PARAMS, GRADS), run_optax(ref, PARAMS, GRADS)
    )


def test_freeze_gives_frozen_leaves_no_update_and_no_state():
    opt = eqxopt.Freeze(eqxopt.Adam(0.1), frozen=MATRIX_MASK)
    state = opt.init(PARAMS)
    assert state.inner.mu["dense"]["w"] is None
    assert state.inner.mu["dense"]["b"].shape == (4,)
    params = PARAMS
    for g in GRADS[:3]:
        params, state = opt.step(g, state, params)
    np.testing.assert_array_equal(params["dense"]["w"], PARAMS["dense"]["w"])
    np.testing.assert_array_equal(params["layers"][0]["w"], PARAMS["layers"][0]["w"])
    expected = run_optax(
        optax.adam(0.1), PARAMS["dense"]["b"], [g["dense"]["b"] for g in GRADS[:3]]
    )
    np.testing.assert_allclose(params["dense"]["b"], expected[-1], rtol=2e-5)
    with pytest.raises(TypeError, match="frozen must be"):
        eqxopt.Freeze(eqxopt.Adam(0.1), None)
    with pytest.raises(TypeError, match="mask must be"):
        eqxopt.Masked(eqxopt.Adam(0.1), None)


def test_masked_mask_of_wrong_structure_names_it():
    opt = eqxopt.Masked(eqxopt.ClipByValue(1.0), {"dense": True})
    with pytest.raises(ValueError, match="mask does not have the tree structure"):
        opt.init(PARAMS)


def test_masked_reads_an_equinox_module_mask_as_a_tree():
    model = eqx.nn.MLP(2, 1, 4, 1, key=jax.random.key(0))
    mask = jax.tree.map(lambda x: x.ndim == 2, eqx.filter(model, eqx.is_array))
    assert callable(mask)
    opt = eqxopt.Chain(eqxopt.Masked(eqxopt.ClipByValue(0.0), mask), eqxopt.SGD(1.0))
    grads = jax.tree.map(jnp.ones_like, eqx.filter(model, eqx.is_inexact_array))
    new, _ = opt.step(grads, opt.init(model), model)
    np.testing.assert_array_equal(new.layers[0].weight, model.layers[0].weight)
    np.testing.assert_allclose(new.layers[0].bias, model.layers[0].bias - 1.0)


# ---------------------------------------------------------------------------------
# Scheduled hyperparameters: read at the step


def run_rebuilt(make_at, params, grads):
    """The parameters after each `update` + apply, with the transform made anew by
    `make_at(i)` at step `i` and the state carried."""
    state, history = None, []
    for i, g in enumerate(grads):
        opt = make_at(i)
        state = opt.init(params) if state is None else state
        updates, state = opt.update(g, state, params)
        params = eqxopt.apply_updates(params, updates)
        history.append(params)
    return history


def _then_sgd(transform):
    return eqxopt.Chain(transform, eqxopt.SGD(0.1))


# Each transform with one hyperparameter scheduled over a range where it matters.
SCHEDULED = {
    "ClipByValue": (
        lambda v: _then_sgd(eqxopt.ClipByValue(v)),
        eqxopt.Linear(0.05, 2.0, STEPS),
    ),
    "ClipByGlobalNorm": (
        lambda v: _then_sgd(eqxopt.ClipByGlobalNorm(v)),
        eqxopt.Linear(0.5, 20.0, STEPS),
    ),
    "ClipByBlockRMS": (
        lambda v: _then_sgd(eqxopt.ClipByBlockRMS(v)),
        eqxopt.Linear(0.05, 3.0, STEPS),
    ),
    "AdaptiveGradClip-clipping": (
        lambda v: _then_sgd(eqxopt.AdaptiveGradClip(v)),
        eqxopt.Linear(0.01, 2.0, STEPS),
    ),
    "AdaptiveGradClip-eps": (
        lambda v: _then_sgd(eqxopt.AdaptiveGradClip(0.01, eps=v)),
        eqxopt.Linear(20.0, 0.0, STEPS),
    ),
    "AddDecayedWeights": (
        lambda v: _then_sgd(eqxopt.AddDecayedWeights(v, mask=MATRIX_MASK)),
        eqxopt.Linear(0.0, 2.0, STEPS),
    ),
    "DecoupledWeightDecay": (
        lambda v: eqxopt.Chain(eqxopt.Adam(0.01), eqxopt.DecoupledWeightDecay(0.01, v)),
        eqxopt.Linear(0.0, 20.0, STEPS),
    ),
    "AddNoise": (
        lambda v: _then_sgd(eqxopt.AddNoise(v, seed=5)),
        eqxopt.Linear(2.0, 0.0, STEPS),
    ),
}


@pytest.mark.parametrize("name", list(SCHEDULED))
def test_a_scheduled_hyperparameter_is_read_at_the_step(name):
    make, schedule = SCHEDULED[name]
    scheduled = run_rebuilt(lambda i: make(schedule), PARAMS, GRADS)
    rebuilt = run_rebuilt(lambda i: make(float(schedule(i))), PARAMS, GRADS)
    assert_histories_close(scheduled, rebuilt, rtol=1e-6, atol=1e-7)
    # The schedule matters: held at its first value, the run ends elsewhere.
    held = run_rebuilt(lambda i: make(float(schedule(0))), PARAMS, GRADS)
    gap = max(
        float(jnp.max(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(scheduled[-1]), jax.tree.leaves(held[-1]))
    )
    assert gap > 1e-2


def test_decay_masks_are_frozen_and_checked_at_init():
    # A new copy of the same mask is an equal static value (no new compile), a
    # mask of bool arrays works as AdamW's does, and a bad one fails at init.
    first = eqxopt.AddDecayedWeights(0.1, mask=MATRIX_MASK)
    again = eqxopt.AddDecayedWeights(0.2, mask=jax.tree.map(lambda x: x, MATRIX_MASK))
    assert jax.tree.structure(first) == jax.tree.structure(again)
    array_mask = jax.tree.map(jnp.asarray, MATRIX_MASK)
    assert_histories_close(
        run_eqxopt(
            _then_sgd(eqxopt.AddDecayedWeights(0.1, mask=array_mask)), PARAMS, GRADS
        ),
        run_eqxopt(
            _then_sgd(eqxopt.AddDecayedWeights(0.1, mask=MATRIX_MASK)), PARAMS, GRADS
        ),
        rtol=0,
        atol=0,
    )
    with pytest.raises(TypeError, match=r"mask\['scale'\] must be a bool, got 1.5"):
        eqxopt.DecoupledWeightDecay(0.1, 0.1, mask={**MATRIX_MASK, "scale": 1.5})
    bad = eqxopt.AddDecayedWeights(0.1, mask={"dense": True})
    with pytest.raises(ValueError, match="mask does not have the tree structure"):
        bad.init(PARAMS)
