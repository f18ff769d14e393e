"""The compiled entry points: the same numbers as `eqx.filter_jit` over the same
call, non-array leaves passed through as `eqx.filter_jit` passes them, no
recompiles for new values, donation without copies, and the pytree-ness of
`opt.step` / `opt.update`."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from helpers import compiles, nested_tree


def mixed_tree():
    """f32, bf16 and f16 leaves, an int leaf, a leaf without gradient."""
    rng = np.random.default_rng(3)

    def leaf(shape, dtype):
        return jnp.asarray(rng.normal(size=shape), dtype)

    return {
        "f32": leaf((3, 4), jnp.float32),
        "bf16": leaf((5,), jnp.bfloat16),
        "f16": leaf((2, 2), jnp.float16),
        "count": jnp.arange(3),
        "frozen": leaf((4,), jnp.float32),
        "nested": [leaf((), jnp.float32), (leaf((2, 3), jnp.bfloat16),)],
    }


def mixed_grads(params, seed):
    rng = np.random.default_rng(seed)
    grads = jax.tree.map(
        lambda p: (
            jnp.asarray(rng.normal(size=p.shape), p.dtype)
            if jnp.issubdtype(p.dtype, jnp.floating)
            else None
        ),
        params,
    )
    grads["frozen"] = None
    return grads


OPTIMIZERS = {
    "SGD": lambda: eqxopt.SGD(0.05, momentum=0.9),
    "SGD-nesterov": lambda: eqxopt.SGD(0.05, momentum=0.9, nesterov=True),
    "Adam": lambda: eqxopt.Adam(0.01, nu_dtype=jnp.float32),
    "AdamW-masked": lambda: eqxopt.AdamW(
        0.01,
        weight_decay=0.1,
        mask={
            "f32": True,
            "bf16": False,
            "f16": True,
            "count": False,
            "frozen": True,
            "nested": [False, (True,)],
        },
    ),
}


def run(opt, params, steps, donate):
    state = opt.init(params)
    history = []
    for i in range(steps):
        grads = mixed_grads(params, seed=i)
        if i % 2:
            updates, state = opt.update(grads, state, params, donate=donate)
            params = eqxopt.apply_updates(params, updates)
        else:
            if donate:  # the donated buffers must not be the caller's
                params = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
            params, state = opt.step(grads, state, params, donate=donate)
        # Kept as NumPy copies: a later donated call consumes the arrays.
        history.append(jax.tree.map(np.array, (params, state)))
    return history


def assert_same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(
            np.asarray(x, np.float64), np.asarray(y, np.float64)
        )


def filter_jit_step(opt, grads, state, params):
    # The same call under `eqx.filter_jit`: eqxopt's entry then runs inside its
    # trace (the enclosing jit compiles it).
    return eqx.filter_jit(lambda o, g, s, p: o.step(g, s, p))(opt, grads, state, params)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_entries_agree_with_filter_jit_donated_or_not(name):
    """The same numbers from `update`/`step`, donated and not, and `eqx.filter_jit`
    over the same call: None grads, bf16/f16, an int leaf, per-leaf flags (the
    mask)."""
    opt = OPTIMIZERS[name]()
    params = mixed_tree()
    plain = run(opt, params, 4, donate=False)
    donated = run(opt, params, 4, donate=True)
    # Donated steps run the native kernels (in place) where they are available:
    # XLA's numbers to rounding.
    assert jax.tree.structure(plain) == jax.tree.structure(donated)
    for x, y in zip(jax.tree.leaves(plain), jax.tree.leaves(donated)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_allclose(
            np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=1e-6, atol=1e-7
        )
    # A leaf without gradient keeps its value and its state.
    final_params, final_state = plain[-1]
    np.testing.assert_array_equal(final_params["frozen"], params["frozen"])
    np.testing.assert_array_equal(final_params["count"], params["count"])
    for field in ("mu", "nu", "velocity"):
        moments = getattr(final_state, field, None)
        if moments is not None:
            assert not np.any(np.asarray(moments["frozen"]))
            assert moments["count"] is None
    grads = mixed_grads(params, seed=0)
    state = opt.init(params)
    assert_same(
        filter_jit_step(opt, grads, state, params), opt.step(grads, state, params)
    )


def test_non_array_leaves_pass_through_as_with_filter_jit():
    """A Python float, a function and a string in params come back untouched, as
    `eqx.filter_jit` treats them; the second call with equal static leaves
    compiles nothing (and gives back the leaves its program was traced with, as
    `eqx.filter_jit` does)."""
    params = {"w": jnp.ones(3), "scale": 2.0, "act": jax.nn.relu, "name": "layer"}
    grads = {"w": jnp.full(3, 0.5), "scale": None, "act": None, "name": None}
    opt = eqxopt.SGD(0.1)
    new_params, state = opt.step(grads, opt.init(params), params)
    assert new_params["scale"] == 2.0 and isinstance(new_params["scale"], float)
    assert new_params["act"] is jax.nn.relu and new_params["name"] == "layer"
    np.testing.assert_allclose(new_params["w"], 0.95)
    assert state.velocity is None  # plain SGD keeps no buffer
    name = "".join(["lay", "er"])  # equal to "layer", another object
    again = {**new_params, "name": name}
    with compiles() as log:
        newer, _ = opt.step(grads, state, again)
    assert log == []
    np.testing.assert_allclose(newer["w"], 0.9)
    assert newer["name"] == name
    # Another value of a static leaf is another program.
    with compiles() as log:
        opt.step(grads, state, {**again, "scale": 3.0})
    assert log


def test_non_array_outputs_belong_to_the_call_that_made_them():
    """Outputs that are not arrays (here a Python int in a train step's `aux`) are
    recorded per compiled program, so a call whose program was compiled earlier
    gets its own, not the last trace's."""

    def loss(model, x):
        return jnp.mean((x @ model["w"]) ** 2), x.shape[0]

    opt = eqxopt.SGD(0.01)
    step = eqxopt.make_train_step(loss, opt, has_aux=True)
    model = {"w": jnp.ones((3, 2))}
    state = opt.init(model)
    seen = []
    for batch in (8, 16, 8, 16):
        model, state, _, aux = step(model, state, jnp.ones((batch, 3)))
        seen.append(aux)
    assert seen == [8, 16, 8, 16]


def test_errors_inside_the_rule_are_not_swallowed():
    opt = eqxopt.SGD(0.1)
    params = {"w": jnp.ones(3)}
    with pytest.raises(TypeError, match="value"):
        opt.step(params, opt.init(params), params, value=jnp.ones(()))


def test_new_hyperparameter_values_reuse_the_compiled_step():
    params = nested_tree()
    grads = jax.tree.map(jnp.ones_like, params)
    opt = eqxopt.AdamW(1e-3)
    state = opt.init(params)
    opt.step(grads, state, params)
    others = [eqxopt.AdamW(lr, b1=0.8, weight_decay=0.3) for lr in (1e-2, 0.5)]
    with compiles() as log:
        for new_opt in others:
            new_opt.step(grads, state, params)
    assert log == []


def test_inside_a_user_jit_gives_the_same_numbers():
    params = nested_tree()
    grads = jax.tree.map(lambda p: 0.1 * p + 0.01, params)
    opt = eqxopt.Adam(1e-2)
    state = opt.init(params)
    direct = opt.step(grads, state, params)
    nested = jax.jit(lambda g, s, p: opt.step(g, s, p))(grads, state, params)
    assert_same(direct, nested)
    # donate=True inside a jit runs the native kernels (XLA copies the undonated
    # inputs first): the same numbers to rounding.
    nested = jax.jit(lambda g, s, p: opt.step(g, s, p, donate=True))(
        grads, state, params
    )
    assert jax.tree.structure(direct) == jax.tree.structure(nested)
    for x, y in zip(jax.tree.leaves(direct), jax.tree.leaves(nested)):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_donated_step_runs_in_place_without_copies():
    """XLA pairs donated buffers with outputs in order; the entries return their
    outputs in the order of the donated inputs, so no array is copied (a scalar
    may be: `eqx.filter_jit` returns an int32 marker first, which takes the step
    counter's buffer)."""
    params = {"a": jnp.zeros((256, 64)), "b": jnp.zeros((256, 64)), "c": jnp.zeros(64)}
    opt = eqxopt.AdamW(1e-3)
    state = opt.init(params)
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    for method in (opt.step, opt.update):
        compiled = method.lower(params, state, params, donate=True).compile()
        memory = compiled.memory_analysis()
        assert memory.temp_size_in_bytes < 1024  # scalars only, no full-size copy
        copies = re.findall(r"= (\S+) copy\(", compiled.as_text())
        assert all(shape.endswith("[]") for shape in copies), copies
        state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
        assert memory.alias_size_in_bytes >= state_bytes - 8
    assert param_bytes > 64 * 1024
    # And at run time the donated inputs are consumed.
    p = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
    s = opt.init(p)
    new_p, _ = opt.step(jax.tree.map(jnp.ones_like, p), s, p, donate=True)
    assert p["a"].is_deleted() and s.mu["a"].is_deleted()
    assert not new_p["a"].is_deleted()


def test_lower_refuses_traced_arguments():
    opt = eqxopt.SGD(0.1)
    params = {"w": jnp.ones(2)}
    state = opt.init(params)

    def lowered(p):
        return opt.step.lower(p, state, p)

    with pytest.raises(ValueError, match="lower takes concrete arrays"):
        jax.jit(lowered)(params)


def test_bound_methods_are_cheap_pytrees():
    opt = eqxopt.AdamW(0.5)
    bound = opt.step
    assert not isinstance(bound, eqx.Module)
    # The optimizer's arrays are the leaves of the bound method.
    assert len(jax.tree.leaves(bound)) == len(jax.tree.leaves(opt))
    # eqx.filter_jit over the bound method traces the hyperparameters.
    params = {"w": jnp.ones(2)}
    grads = {"w": jnp.ones(2)}
    traces = []

    @eqx.filter_jit
    def step(f, g, s, p):
        traces.append(None)
        return f(g, s, p)

    a, _ = step(eqxopt.AdamW(0.5).step, grads, opt.init(params), params)
    b, _ = step(eqxopt.AdamW(0.25).step, grads, opt.init(params), params)
    assert len(traces) == 1
    assert not np.allclose(a["w"], b["w"])
    doc = type(opt).step.__doc__
    assert doc is not None and "compiled" in doc


def test_set_split_compilation_is_a_deprecated_no_op():
    """The split path is gone (`pack` beats it on step and compile time); the public
    switch stays, warns, and changes nothing."""
    opt = eqxopt.AdamW(0.01)
    params = nested_tree()
    grads = jax.tree.map(lambda p: 0.5 * p, params)
    reference = opt.step(grads, opt.init(params), params)
    for enabled in (True, False):
        with pytest.warns(DeprecationWarning, match="set_split_compilation"):
            eqxopt.set_split_compilation(enabled)
        assert_same(opt.step(grads, opt.init(params), params), reference)


def _abstract(x):
    """Shape, dtype and weak type of an array or tracer (every JAX version)."""
    return (x.aval.shape, x.aval.dtype, x.aval.weak_type)


class _Probe(eqxopt.AbstractTransform):
    """Scalar hyperparameters of several kinds; records what its trace sees."""

    a: jax.Array
    b: jax.Array
    n: jax.Array
    weak: jax.Array
    half: jax.Array
    vector: jax.Array
    placed: jax.Array

    def init(self, params):
        return eqxopt.EmptyState()

    def transform(self, grads, state, params):
        _probe_seen.append([_abstract(x) for x in jax.tree.leaves(self)])
        scale = (
            self.a * self.b
            + self.n.astype(jnp.float32)
            + self.weak
            + self.half.astype(jnp.float32)
            + self.vector.sum()
            + self.placed
        )
        return jax.tree.map(lambda g: -g * scale, grads), state


_probe_seen: list = []


def _probe(a: float) -> _Probe:
    return _Probe(
        a=jnp.asarray(a, jnp.float32),
        b=jnp.asarray(0.5, jnp.float32),
        n=jnp.asarray(3, jnp.int32),
        weak=jnp.asarray(0.25),  # a weak-typed float
        half=jnp.asarray(0.125, jnp.bfloat16),
        vector=jnp.arange(3.0, dtype=jnp.float32),
        placed=jax.device_put(jnp.asarray(1.0, jnp.float32), jax.devices()[0]),
    )


def test_hyperparameters_keep_their_types_and_new_values_reuse_the_trace():
    """Inside the compiled step every hyperparameter has its own dtype, shape and
    weak type; the numbers are `eqx.filter_jit`'s; an optimizer object with other
    values reuses the trace; inside a user's jit nothing of the trace is kept."""
    params = {"w": jnp.ones(3), "b": jnp.zeros(2)}
    grads = jax.tree.map(lambda p: p + 0.5, params)
    opt = _probe(2.0)
    state = opt.init(params)
    expected = [_abstract(x) for x in jax.tree.leaves(opt)]
    assert expected[3][2] and not expected[0][2]  # weak types
    _probe_seen.clear()
    direct = opt.step(grads, state, params)
    assert _probe_seen == [expected]
    assert_same(direct, filter_jit_step(opt, grads, state, params))
    other = _probe(-1.0)
    _probe_seen.clear()
    with compiles() as log:
        moved, _ = other.step(grads, state, params)
    assert log == [] and _probe_seen == []
    assert not np.allclose(moved["w"], direct[0]["w"])
    third = _probe(3.0)
    nested = jax.jit(lambda g, s, p: third.step(g, s, p))(grads, state, params)
    assert_same(nested, third.step(grads, state, params))


def test_first_use_inside_a_jit_learns_the_concrete_array_class():
    """jaxlib's array class is learnt on first use, not at import (so that
    `jax.distributed.initialize` can run after `import eqxopt`); that first use may
    be inside a user's `jax.jit`, where `jnp.zeros` gives a tracer, and a tracer
    class taken for the concrete one would send traced leaves into a compiled call."""
    from eqxopt._core import _jax_api

    _jax_api.array_type.cache_clear()
    opt = eqxopt.AdamW(1e-2)
    params = {"w": jnp.ones(3), "b": jnp.zeros(())}
    traced = jax.jit(lambda p: opt.step(p, opt.init(p), p))(params)
    assert _jax_api.array_type() is type(jnp.zeros(()))
    direct = opt.step(params, opt.init(params), params)
    filtered = eqx.filter_jit(lambda o, p: o.step(p, o.init(p), p))(opt, params)
    assert_same(traced, direct)
    assert_same(filtered, direct)


def test_an_optimizer_built_inside_jit_reads_no_parameters_it_was_not_told_to():
    """The natural replacement of `optax.inject_hyperparams`: an optimizer built
    inside a traced function from a traced learning rate. Its default weight decay
    (0) is still known to be 0 there, so `update(grads, state)` without params is
    taken, as it is outside the trace."""
    grads = {"w": jnp.ones(3)}

    @jax.jit
    def step(lr, grads):
        opt = eqxopt.RMSProp(lr)
        updates, _ = opt.update(grads, opt.init(grads))
        return updates

    outside = eqxopt.RMSProp(0.1)
    expected, _ = outside.update(grads, outside.init(grads))
    np.testing.assert_allclose(step(0.1, grads)["w"], expected["w"], rtol=1e-6)
