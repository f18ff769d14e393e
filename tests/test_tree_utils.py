"""The tree utilities (`tree_get`, `tree_set`, `tree_norm`, `tree_cast`) on eqxopt
states, against `optax.tree_utils` where it has the same thing."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqxopt
from helpers import nested_tree


def chained():
    opt = eqxopt.Chain(eqxopt.ClipByGlobalNorm(1.0), eqxopt.AdamW(0.1))
    params = nested_tree()
    state = opt.init(params)
    grads = jax.tree.map(jnp.cos, params)
    _, state = opt.step(grads, state, params)
    return opt, params, grads, state


def test_tree_get_reads_a_field_through_a_chain():
    _, _, _, state = chained()
    mu = eqxopt.tree_get(state, "mu")
    assert mu is state["AdamW"].mu
    assert eqxopt.tree_get(state, "absent", default=None) is None
    with pytest.raises(KeyError, match="no field or key named 'absent'"):
        eqxopt.tree_get(state, "absent")


def test_tree_get_names_every_path_when_a_name_repeats():
    opt = eqxopt.Chain(eqxopt.AdamW(0.1), eqxopt.Adam(0.1))
    state = opt.init(nested_tree())
    with pytest.raises(
        KeyError, match=r"2 fields named 'mu' \(states\[0\]\.mu, states\[1\]\.mu\)"
    ):
        eqxopt.tree_get(state, "mu")
    assert eqxopt.tree_get(state["Adam"], "mu") is state["Adam"].mu


def test_tree_set_replaces_a_field_and_leaves_the_caller_alone():
    opt, params, grads, state = chained()
    zeros = jax.tree.map(jnp.zeros_like, state["AdamW"].mu)
    new = eqxopt.tree_set(state, mu=zeros)
    assert eqxopt.tree_get(new, "mu") is zeros
    assert eqxopt.tree_get(state, "mu") is not zeros  # the old state is unchanged
    assert jax.tree.structure(new) == jax.tree.structure(state)
    # The new state steps like a state whose moment was zeroed by hand.
    by_hand = eqx.tree_at(lambda s: s.states[1].mu, state, zeros)
    got, _ = opt.step(grads, new, params)
    want, _ = opt.step(grads, by_hand, params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(KeyError, match="no field or key named 'nope'"):
        eqxopt.tree_set(state, nope=1)


def test_tree_get_and_set_on_dicts_and_named_tuples_match_optax():
    tree = {"a": {"count": jnp.int32(3), "x": jnp.ones(2)}, "b": optax.EmptyState()}
    assert eqxopt.tree_get(tree, "count") is optax.tree_utils.tree_get(tree, "count")
    state = optax.adam(0.1).init({"w": jnp.ones(3)})
    assert eqxopt.tree_get(state, "count") is optax.tree_utils.tree_get(state, "count")
    new = eqxopt.tree_set(state, count=jnp.int32(7))
    assert int(optax.tree_utils.tree_get(new, "count")) == 7


@pytest.mark.parametrize("ord", [1, 2, "inf"])
def test_tree_norm_matches_optax(ord):
    tree = nested_tree(seed=2)
    theirs = optax.tree_utils.tree_norm(tree, ord=jnp.inf if ord == "inf" else ord)
    np.testing.assert_allclose(eqxopt.tree_norm(tree, ord=ord), theirs, rtol=1e-6)
    squared = eqxopt.tree_norm(tree, squared=True)
    np.testing.assert_allclose(
        squared, optax.tree_utils.tree_norm(tree, squared=True), rtol=1e-6
    )


def test_tree_norm_skips_non_float_leaves_and_takes_complex_magnitudes():
    tree = {
        "f": jnp.array([3.0, 4.0]),
        "i": jnp.arange(3),
        "fn": jax.nn.relu,
        "n": None,
    }
    assert float(eqxopt.tree_norm(tree)) == 5.0
    assert float(eqxopt.tree_norm({"z": jnp.array([3 + 4j])})) == 5.0
    assert float(eqxopt.tree_norm({})) == 0.0
    with pytest.raises(ValueError, match="ord must be 1, 2 or 'inf', got 3"):
        eqxopt.tree_norm(tree, ord=3)
    with pytest.raises(ValueError, match="squared=True needs ord=2"):
        eqxopt.tree_norm(tree, ord=1, squared=True)


def test_tree_cast_casts_float_leaves_only():
    model = eqx.nn.MLP(2, 1, 4, 1, key=jax.random.key(0))
    opt = eqxopt.AdamW(0.1)
    state = opt.init(model)
    cast = eqxopt.tree_cast(state, jnp.bfloat16)
    assert cast.step.dtype == jnp.int32  # optax's tree_cast would make it bf16
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(cast.mu))
    half = eqxopt.tree_cast(model, jnp.bfloat16)
    assert half.activation is model.activation
    assert half.layers[0].weight.dtype == jnp.bfloat16
    with pytest.raises(TypeError, match="dtype must be a floating-point dtype"):
        eqxopt.tree_cast(model, jnp.int32)
