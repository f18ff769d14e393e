"""Hypothesis: random pytrees through SGD, Adam and AdamW."""

import copy

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import eqxopt

OPTIMIZERS = [
    eqxopt.SGD(0.1, momentum=0.9, nesterov=True),
    eqxopt.Adam(1e-2),
    eqxopt.AdamW(eqxopt.WarmupCosine(1e-2, 1e-3, 2, 10), weight_decay=0.1),
]

shapes = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)
dtypes = st.sampled_from([jnp.float32, jnp.bfloat16])


@st.composite
def leaves(draw):
    shape, dtype = draw(shapes), draw(dtypes)
    seed = draw(st.integers(0, 2**16))
    values = np.random.default_rng(seed).normal(size=shape)
    return jnp.asarray(values, dtype=dtype)


keys = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
trees = st.recursive(
    leaves(),
    lambda children: st.one_of(
        st.dictionaries(keys, children, min_size=1, max_size=3),
        st.lists(children, min_size=1, max_size=3),
        st.tuples(children, children),
    ),
    max_leaves=6,
)


def like(tree, fill_seed):
    rng = np.random.default_rng(fill_seed)
    return jax.tree.map(
        lambda x: jnp.asarray(rng.normal(size=x.shape), dtype=x.dtype), tree
    )


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(params=trees, seed=st.integers(0, 100), opt=st.sampled_from(OPTIMIZERS))
def test_random_trees_keep_structure_shape_dtype_and_inputs(params, seed, opt):
    grads = like(params, seed)
    before = copy.deepcopy((params, grads))
    # One optimizer per example keeps the number of compiles down.
    state = opt.init(params)
    state_before = copy.deepcopy(state)
    updates, new_state = opt.update(grads, state, params)
    new_params, stepped_state = opt.step(grads, state, params)
    for out in (updates, new_params):
        assert jax.tree.structure(out) == jax.tree.structure(params)
        for o, p in zip(jax.tree.leaves(out), jax.tree.leaves(params)):
            assert o.shape == p.shape and o.dtype == p.dtype
            assert bool(jnp.all(jnp.isfinite(o.astype(jnp.float32))))
    assert jax.tree.structure(new_state) == jax.tree.structure(state)
    for s, s0 in zip(jax.tree.leaves(new_state), jax.tree.leaves(state)):
        assert s.shape == s0.shape and s.dtype == s0.dtype
    assert int(new_state.step) == 1 and int(stepped_state.step) == 1
    # Nothing the caller passed in changed: containers or values.
    assert eqx.tree_equal(state, state_before)
    assert jax.tree.structure((params, grads)) == jax.tree.structure(before)
    assert eqx.tree_equal((params, grads), before)
