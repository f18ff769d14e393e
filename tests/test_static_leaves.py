"""Non-array leaves (Python scalars, enums, strings, functions, None, tuples of
them) pass through `update`/`step` as the caller's very objects, for every
optimizer in the catalog: called directly, with `donate=True` and inside
`eqx.filter_jit`; and leaves that compare equal in Python (`True`, `1`, `1.0`,
an `IntEnum` member; `0.0` and `-0.0`) are never mistaken for each other."""

import enum
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import eqxopt
from catalog import all_cases
from helpers import nested_tree

CASES = all_cases()
case_params = pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])


class Level(enum.IntEnum):
    ONE = 1
    TWO = 2


def _tanh_copy(x):
    return jnp.tanh(x)


def statics_a() -> dict:
    return {
        "flag": 1,
        "enum": 1.0,
        "zero": 0.0,
        "nan": float("nan"),
        "int": True,
        "name": "relu",
        "act": jax.nn.relu,
        "none": None,
        "pair": (0, 2.5, "x", (None, 1)),
        "big": 2**70,
    }


def statics_b() -> dict:
    """Equal to `statics_a()` leaf by leaf as Python compares them, yet other values
    (or other objects of the same value)."""
    return {
        "flag": True,
        "enum": Level.ONE,
        "zero": -0.0,
        "nan": float("nan"),
        "int": 1,
        "name": "".join(["re", "lu"]),
        "act": jax.nn.relu,
        "none": None,
        "pair": (False, float("2.5"), "".join("x"), (None, Level.ONE)),
        "big": 2**69 * 2,
    }


def statics_bools() -> dict:
    """Python bools only: no leaf that `jax.jit` refuses, so this reaches the
    direct path, which would make the bools arrays."""
    return {"flag": True, "pair": (False, True)}


def quadratic_loss(params):
    targets = nested_tree(seed=7)
    arrays = {k: v for k, v in params.items() if k != "static"}
    return sum(
        jnp.sum((p.astype(jnp.float32) - t) ** 2)
        for p, t in zip(jax.tree.leaves(arrays), jax.tree.leaves(targets))
    )


def with_statics(statics: dict) -> dict:
    params = nested_tree()
    params["static"] = statics
    return params


def grads_for(params):
    grads = eqx.filter_grad(quadratic_loss)(params)
    assert jax.tree.leaves(grads["static"]) == []
    return grads


def assert_identical(got, expected):
    """`got` holds the very objects of `expected` wherever `expected` is not an
    array."""
    got_leaves, got_def = jax.tree.flatten(got)
    want_leaves, want_def = jax.tree.flatten(expected)
    assert got_def == want_def
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree.leaves_with_path(expected)]
    for path, g, w in zip(paths, got_leaves, want_leaves):
        if not eqx.is_array(w):
            assert g is w, f"{path}: {g!r} is not {w!r}"


def extra_for(case, params):
    return {} if case.extra is None else case.extra(quadratic_loss, params)


@case_params
@pytest.mark.slow
def test_non_array_leaves_come_back_as_themselves(case):
    opt = case.make()
    for statics in (statics_bools(), statics_a(), statics_b()):
        params = with_statics(statics)
        grads = grads_for(params)
        state = opt.init(params)
        extra = extra_for(case, params)
        new_params, _ = opt.step(grads, state, params, **extra)
        assert_identical(new_params, params)
    # `update` goes through the same dispatch as `step`; once is enough here.
    updates, _ = opt.update(grads, state, params, **extra)
    assert jax.tree.leaves(updates["static"]) == []
    # Donated: the arrays are consumed, the other leaves still come back.
    donated = jax.tree.map(
        lambda x: jnp.array(x, copy=True) if eqx.is_array(x) else x, params
    )
    stepped, _ = opt.step(
        grads, opt.init(donated), donated, donate=True, **extra_for(case, donated)
    )
    assert_identical(stepped, params)


@case_params
@pytest.mark.slow
def test_non_array_leaves_pass_through_inside_filter_jit(case):
    opt = case.make()
    seen = []

    @eqx.filter_jit
    def train_step(params, state):
        grads = grads_for(params)
        new_params, state = opt.step(grads, state, params, **extra_for(case, params))
        assert_identical(new_params, params)  # at trace time, on the traced call
        seen.append(new_params["static"])
        return new_params, state

    for statics in (statics_bools(), statics_b()):
        params = with_statics(statics)
        new_params, state = train_step(params, opt.init(params))
        new_params, state = train_step(new_params, state)  # bools still bools
        assert new_params["static"]["flag"] is True
    assert seen[-1]["enum"] is Level.ONE
    assert math.copysign(1.0, new_params["static"]["zero"]) == -1.0


class Gated(eqx.Module):
    hidden: eqx.nn.Linear
    out: eqx.nn.Linear
    use_bias: bool  # a Python bool the loss branches on

    def __call__(self, x):
        y = self.out(jnp.tanh(self.hidden(x)))
        return y + 1.0 if self.use_bias else y


def test_readme_train_step_with_a_bool_field_runs_twice():
    """README's quickstart train step (eqx.filter_jit around `opt.step`) on a model
    with a bool field: the bool stays a bool, so the step can be called again."""
    keys = jax.random.split(jax.random.key(0))
    model = Gated(
        eqx.nn.Linear(4, 32, key=keys[0]), eqx.nn.Linear(32, 1, key=keys[1]), True
    )
    opt = eqxopt.AdamW(
        eqxopt.WarmupCosine(1e-2, 1e-3, warmup_steps=10, total_steps=1000)
    )
    state = opt.init(model)

    def loss_fn(model, x, y):
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    @eqx.filter_jit
    def train_step(model, state, x, y):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        model, state = opt.step(grads, state, model)
        return model, state, loss

    x = jax.random.normal(jax.random.key(1), (64, 4))
    y = jnp.sin(x.sum(axis=1, keepdims=True))
    losses = []
    for _ in range(3):
        model, state, loss = train_step(model, state, x, y)
        losses.append(float(loss))
    assert model.use_bias is True
    assert losses[-1] < losses[0]
    # And called directly, outside any jit, on the same kind of model.
    grads = eqx.filter_grad(loss_fn)(model, x, y)
    stepped, _ = opt.step(grads, state, model)
    assert stepped.use_bias is True


STATIC_LEAVES = st.recursive(
    st.one_of(
        st.booleans(),
        st.integers(-3, 3),
        st.floats(allow_nan=True, allow_infinity=True, width=64),
        st.sampled_from([0.0, -0.0, 1.0, float("nan")]),
        st.sampled_from(list(Level)),
        st.text(alphabet="ab", max_size=2),
        st.none(),
        st.sampled_from([jax.nn.relu, jax.nn.tanh, _tanh_copy, print]),
    ),
    lambda children: st.tuples(children, children),
    max_leaves=4,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=STATIC_LEAVES, second=STATIC_LEAVES)
def test_any_non_array_leaf_comes_back_as_itself(first, second):
    """Two calls in a row, each with its own non-array leaf: each call gets its own
    objects back, whatever the first call compiled for."""
    opt = eqxopt.SGD(0.1)
    for leaf in (first, second):
        params = {"w": jnp.ones(2), "leaf": leaf}
        grads = {"w": jnp.ones(2), "leaf": None}
        new_params, _ = opt.step(grads, opt.init(params), params)
        assert_identical(new_params, params)
        np.testing.assert_allclose(new_params["w"], 0.9)
