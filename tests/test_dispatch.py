"""The compiled entry points: the direct dispatch path against the general one
(which treats arguments as `eqx.filter_jit` does), donation without copies, and
the pytree-ness of `opt.step` / `opt.update`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from eqxopt._core import _base, _dispatch
from helpers import nested_tree


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


@pytest.fixture
def general_path():
    _dispatch.use_direct_path(False)
    yield
    _dispatch.use_direct_path(True)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_direct_and_general_paths_agree(name):
    """The same numbers from the direct path, the general path, donated and not,
    and `eqx.filter_jit` over the same entry: None grads, bf16/f16, an int leaf,
    per-leaf flags (the mask)."""
    opt = OPTIMIZERS[name]()
    params = mixed_tree()
    direct = run(opt, params, 4, donate=False)
    donated = run(opt, params, 4, donate=True)
    _dispatch.use_direct_path(False)
    try:
        general = run(opt, params, 4, donate=False)
    finally:
        _dispatch.use_direct_path(True)
    assert_same(direct, general)
    # Donated steps run the native kernels (in place): XLA's numbers to rounding.
    assert jax.tree.structure(direct) == jax.tree.structure(donated)
    for x, y in zip(jax.tree.leaves(direct), jax.tree.leaves(donated)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_allclose(
            np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=1e-6, atol=1e-7
        )
    # A leaf without gradient keeps its value and its state.
    final_params, final_state = direct[-1]
    np.testing.assert_array_equal(final_params["frozen"], params["frozen"])
    np.testing.assert_array_equal(final_params["count"], params["count"])
    for field in ("mu", "nu", "velocity"):
        moments = getattr(final_state, field, None)
        if moments is not None:
            assert not np.any(np.asarray(moments["frozen"]))
            assert moments["count"] is None
    # eqx.filter_jit of the unchecked maths agrees too.
    grads = mixed_grads(params, seed=0)
    state = opt.init(params)
    ref = eqx.filter_jit(_base._ENTRIES[True, False, False])(
        opt, grads, params, state, {}
    )
    assert_same(ref, opt.step(grads, state, params))


def test_static_leaves_take_the_general_path_and_stay_static():
    """A Python float, a function and a string in params are passed through
    untouched, as `eqx.filter_jit` would treat them."""
    params = {"w": jnp.ones(3), "scale": 2.0, "act": jax.nn.relu, "name": "layer"}
    grads = {"w": jnp.full(3, 0.5), "scale": None, "act": None, "name": None}
    opt = eqxopt.SGD(0.1)
    new_params, state = opt.step(grads, opt.init(params), params)
    assert new_params["scale"] == 2.0 and isinstance(new_params["scale"], float)
    assert new_params["act"] is jax.nn.relu and new_params["name"] == "layer"
    np.testing.assert_allclose(new_params["w"], 0.95)
    assert state.velocity["scale"] is None
    # Those argument types are remembered: the second call does not retry.
    kinds = [
        k for k in _dispatch._general if k[0] is _base._ENTRIES[True, False, False]
    ]
    assert kinds
    new_params, _ = opt.step(grads, state, new_params)
    np.testing.assert_allclose(new_params["w"], 0.9)


def test_errors_inside_the_rule_are_not_swallowed():
    opt = eqxopt.SGD(0.1)
    params = {"w": jnp.ones(3)}
    with pytest.raises(TypeError, match="value"):
        opt.step(params, opt.init(params), params, value=jnp.ones(()))


def test_new_hyperparameter_values_reuse_the_direct_step():
    params = nested_tree()
    grads = jax.tree.map(jnp.ones_like, params)
    opt = eqxopt.AdamW(1e-3)
    opt.step(grads, opt.init(params), params)
    before = _dispatch.cache_size(_base._ENTRIES[True, False, False])
    for lr in (1e-2, 0.5):
        new_opt = eqxopt.AdamW(lr, b1=0.8, weight_decay=0.3)
        new_opt.step(grads, new_opt.init(params), params)
    assert _dispatch.cache_size(_base._ENTRIES[True, False, False]) == before


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
    outputs in the order of the donated inputs, so nothing is copied."""
    params = {"a": jnp.zeros((256, 64)), "b": jnp.zeros((256, 64)), "c": jnp.zeros(64)}
    opt = eqxopt.AdamW(1e-3)
    state = opt.init(params)
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    for entry, args, donate in [
        (_base._ENTRIES[True, True, False], (opt, params, params, state, {}), (2, 3)),
        (_base._ENTRIES[False, True, False], (opt, params, state, params, {}), (2,)),
    ]:
        compiled = _dispatch.lower(entry, args, donate).compile()
        memory = compiled.memory_analysis()
        assert memory.temp_size_in_bytes < 1024  # scalars only, no full-size copy
        assert " copy(" not in compiled.as_text()
        state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
        assert memory.alias_size_in_bytes >= state_bytes - 8
    assert param_bytes > 64 * 1024
    # And at run time the donated inputs are consumed.
    p = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
    s = opt.init(p)
    new_p, _ = opt.step(jax.tree.map(jnp.ones_like, p), s, p, donate=True)
    assert p["a"].is_deleted() and s.mu["a"].is_deleted()
    assert not new_p["a"].is_deleted()


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


class _Probe(eqxopt.AbstractTransform):
    """Scalar hyperparameters of several kinds; records what its trace sees."""

    a: jax.Array
    b: jax.Array
    n: jax.Array
    m: jax.Array
    weak: jax.Array
    half: jax.Array
    vector: jax.Array
    placed: jax.Array

    def init(self, params):
        return eqxopt.EmptyState()

    def transform(self, grads, state, params):
        _probe_seen.append([jax.typeof(x) for x in jax.tree.leaves(self)])
        scale = (
            self.a * self.b
            + (self.n - self.m).astype(jnp.float32)
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
        m=jnp.asarray(1, jnp.int32),
        weak=jnp.asarray(0.25),  # a weak-typed float
        half=jnp.asarray(0.125, jnp.bfloat16),  # the only one of its dtype
        vector=jnp.arange(3.0, dtype=jnp.float32),
        placed=jax.device_put(jnp.asarray(1.0, jnp.float32), jax.devices()[0]),
    )


def test_scalar_hyperparameters_are_packed_exactly():
    """The optimizer's 0-d leaves cross into the compiled step stacked, one array
    per dtype: inside, every leaf has its own dtype, shape and weak type; the
    numbers are the general path's; new values reuse the compiled step."""
    params = {"w": jnp.ones(3), "b": jnp.zeros(2)}
    grads = jax.tree.map(lambda p: p + 0.5, params)
    opt = _probe(2.0)
    state = opt.init(params)
    expected = [jax.typeof(x) for x in jax.tree.leaves(opt)]
    assert expected[4].weak_type and not expected[0].weak_type
    _probe_seen.clear()
    direct = opt.step(grads, state, params)
    assert _probe_seen == [expected]
    # Only the f32 pair and the i32 pair are packed: the weak, the lone bf16, the
    # vector and the placed (committed) leaf cross as they are.
    record = _dispatch._first(opt)
    packs, others = record.packed
    assert [(x.dtype, x.shape) for x in packs] == [
        (jnp.float32, (2,)),
        (jnp.int32, (2,)),
    ]
    assert len(others) == 4
    with _use_general_path():
        general = opt.step(grads, state, params)
    assert_same(direct, general)
    assert_same(
        direct,
        eqx.filter_jit(_base._ENTRIES[True, False, False])(
            opt, grads, params, state, {}
        ),
    )
    # Another optimizer object with other values: no new trace, other numbers.
    before = _dispatch.cache_size(_base._ENTRIES[True, False, False]), len(_probe_seen)
    other = _probe(-1.0)
    moved, _ = other.step(grads, state, params)
    assert (
        _dispatch.cache_size(_base._ENTRIES[True, False, False]),
        len(_probe_seen),
    ) == before
    with _use_general_path():
        assert_same(moved, other.step(grads, state, params)[0])
    assert not np.allclose(moved["w"], direct[0]["w"])
    # Inside a user's jit the packing is traced, never cached as tracers.
    third = _probe(3.0)
    nested = jax.jit(lambda g, s, p: third.step(g, s, p))(grads, state, params)
    assert _dispatch._first(third).packed is None
    assert_same(nested, third.step(grads, state, params))


class _use_general_path:
    def __enter__(self):
        _dispatch.use_direct_path(False)

    def __exit__(self, *exc):
        _dispatch.use_direct_path(True)


def test_first_use_inside_a_jit_learns_the_concrete_array_class():
    """jaxlib's array class is learnt on first use, not at import (so that
    `jax.distributed.initialize` can run after `import eqxopt`); that first use may
    be inside a user's `jax.jit`, where `jnp.zeros` gives a tracer, and a tracer
    class taken for the concrete one would send traced leaves down the direct path."""
    from eqxopt._native import _compat

    _compat.array_type.cache_clear()
    _dispatch._all_arrays.cache_clear()
    opt = eqxopt.AdamW(1e-2)
    params = {"w": jnp.ones(3), "b": jnp.zeros(())}
    traced = jax.jit(lambda p: opt.step(p, opt.init(p), p))(params)
    assert _compat.array_type() is type(jnp.zeros(()))
    direct = opt.step(params, opt.init(params), params)
    filtered = eqx.filter_jit(lambda o, p: o.step(p, o.init(p), p))(opt, params)
    assert_same(traced, direct)
    assert_same(filtered, direct)
