"""Properties every optimizer in the catalog shares, run over `catalog.all_cases()`."""

import copy
import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from catalog import all_cases, swept
from helpers import compiles, nested_tree

CASES = all_cases()
case_params = pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
# The costlier properties: every case in `make test-slow`, a few in `make test`.
swept_params = pytest.mark.parametrize("case", swept(CASES))


def quadratic_loss(params):
    targets = nested_tree(seed=7)
    return sum(
        jnp.sum((p.astype(jnp.float32) - t) ** 2)
        for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(targets))
    )


def extra_for(case, loss_fn, params):
    return {} if case.extra is None else case.extra(loss_fn, params)


@case_params
def test_updates_keep_structure_shape_and_dtype(case):
    opt = case.make()
    params = nested_tree()
    grads = jax.grad(quadratic_loss)(params)
    state = opt.init(params)
    extra = extra_for(case, quadratic_loss, params)
    updates, new_state = opt.update(grads, state, params, **extra)
    assert jax.tree.structure(updates) == jax.tree.structure(params)
    for u, p in zip(jax.tree.leaves(updates), jax.tree.leaves(params)):
        assert u.shape == p.shape and u.dtype == p.dtype
        assert bool(jnp.all(jnp.isfinite(u)))
    new_params, stepped_state = opt.step(grads, state, params, **extra)
    assert jax.tree.structure(new_params) == jax.tree.structure(params)
    for a, b in zip(
        jax.tree.leaves(new_params),
        jax.tree.leaves(eqxopt.apply_updates(params, updates)),
    ):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert jax.tree.structure(new_state) == jax.tree.structure(stepped_state)


@swept_params
def test_inputs_are_not_mutated(case):
    opt = case.make()
    params = nested_tree()
    grads = jax.grad(quadratic_loss)(params)
    state = opt.init(params)
    before = copy.deepcopy((params, grads))
    before_leaves = [
        np.asarray(x).copy() for x in jax.tree.leaves((params, grads, state))
    ]
    extra = extra_for(case, quadratic_loss, params)
    opt.update(grads, state, params, **extra)
    opt.step(grads, state, params, **extra)
    assert jax.tree.structure((params, grads)) == jax.tree.structure(before)
    for x, y in zip(jax.tree.leaves((params, grads, state)), before_leaves):
        np.testing.assert_array_equal(np.asarray(x), y)


@swept_params
def test_none_gradients_leave_leaf_and_its_state_alone(case):
    opt = case.make()
    params = nested_tree()
    grads = jax.grad(quadratic_loss)(params)
    grads["dense"]["w"] = None
    grads["layers"][1] = None  # a whole subtree without gradients
    state = opt.init(params)
    extra = extra_for(case, quadratic_loss, params)
    # Two steps, so state that the first step would have filled in is compared too.
    new_params, new_state = opt.step(grads, state, params, **extra)
    new_params, new_state = opt.step(grads, new_state, new_params, **extra)
    np.testing.assert_array_equal(new_params["dense"]["w"], params["dense"]["w"])
    for a, b in zip(
        jax.tree.leaves(new_params["layers"][1]), jax.tree.leaves(params["layers"][1])
    ):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(new_params["dense"]["b"], params["dense"]["b"])
    skipped = ("['dense']['w']", "['layers'][1]")
    old = dict(
        (jax.tree_util.keystr(k), v) for k, v in jax.tree.leaves_with_path(state)
    )
    for path, leaf in jax.tree.leaves_with_path(new_state):
        key = jax.tree_util.keystr(path)
        if any(s in key for s in skipped):
            np.testing.assert_array_equal(leaf, old[key], err_msg=f"state{key}")


def _options_reading_params(opt):
    """The options of `opt` (its own fields) that read the parameters when set,
    each at its value that reads none (0, False)."""
    off = {}
    for field in dataclasses.fields(opt):
        converter = field.metadata.get("converter")
        if getattr(converter, "reads_params", False):
            off[field.name] = False if type(converter).__name__ == "_Flag" else 0.0
    return off


@case_params
def test_update_without_params_is_the_same_or_names_what_reads_them(case):
    """`update(grads, state)` without params, as optax allows: where nothing of
    the transform reads them (`params_needed()` is None) the same updates and
    state over 3 steps (the parameters here are far from the zeros the rule is
    then traced on, so a rule that read them would differ); elsewhere a
    `TypeError` naming what reads them. A case whose weight decay (or other
    such option) reads them is also run with it off."""
    opt = case.make()
    params = nested_tree()
    needed = opt.params_needed()
    if needed is not None:
        grads = jax.grad(quadratic_loss)(params)
        extra = extra_for(case, quadratic_loss, params)
        with pytest.raises(
            TypeError, match=r"was called without params, which are read by "
        ) as error:
            opt.update(grads, opt.init(params), **extra)
        assert needed in str(error.value)
        off = _options_reading_params(opt)
        if not off or type(opt).reads_params is not None:
            return
        opt = case.make(**off)
        assert opt.params_needed() is None, opt.params_needed()
    state = without = opt.init(params)
    for _ in range(3):
        grads = jax.grad(quadratic_loss)(params)
        extra = extra_for(case, quadratic_loss, params)
        updates, state = opt.update(grads, state, params, **extra)
        bare_updates, without = opt.update(grads, without, **extra)
        for a, b in zip(
            jax.tree.leaves((updates, state)),
            jax.tree.leaves((bare_updates, without)),
            strict=True,
        ):
            # To rounding: the two programs may fuse the same sums apart, and a
            # rule that forms its update as `new_p - p` (SOAP) rounds it at the
            # parameter's scale (here about 1: an ulp is 1.2e-7).
            np.testing.assert_allclose(
                np.asarray(a), np.asarray(b), rtol=1e-6, atol=1.2e-7
            )
        params = eqxopt.apply_updates(params, updates)


@swept_params
def test_whole_equinox_model_trains_without_filtering(case):
    model = eqx.nn.MLP(3, 2, 16, 2, activation=jax.nn.tanh, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (32, 3))
    y = jnp.stack([jnp.sin(x[:, 0]), x[:, 1] * x[:, 2]], axis=1)

    def loss_fn(m):
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    opt = case.make()
    state = opt.init(model)
    start = loss_fn(model)
    for _ in range(30):
        grads = eqx.filter_grad(loss_fn)(model)
        extra = extra_for(case, loss_fn, model)  # the same function every step
        model, state = opt.step(grads, state, model, **extra)
    assert model.activation is jax.nn.tanh  # non-array leaves pass through
    assert loss_fn(model) < start


@swept_params
def test_bfloat16_parameters_keep_their_dtype(case):
    opt = case.make()
    params = nested_tree(dtype=jnp.bfloat16)
    grads = jax.grad(quadratic_loss)(params)
    state = opt.init(params)
    extra = extra_for(case, quadratic_loss, params)
    for _ in range(3):
        updates, _ = opt.update(grads, state, params, **extra)
        params, state = opt.step(grads, state, params, **extra)
        grads = jax.grad(quadratic_loss)(params)
        extra = extra_for(case, quadratic_loss, params)
    for leaf in jax.tree.leaves((updates, params)):
        assert leaf.dtype == jnp.bfloat16
        assert bool(jnp.all(jnp.isfinite(leaf.astype(jnp.float32))))
    for leaf in jax.tree.leaves(state):
        if jnp.issubdtype(leaf.dtype, jnp.inexact):
            assert bool(jnp.all(jnp.isfinite(leaf.astype(jnp.float32))))


@swept_params
def test_float16_parameters_with_zero_gradients_stay_finite(case):
    """float16 parameters where gradients are 0 (every element on the first step,
    then every other element, whose parameter is 0 too): no NaN or infinity in
    the parameters, updates or state. A state that starts at a small constant
    must not start at 0 (an `eps` of 1e-8 is 0 in float16) and be divided by."""

    def half_zero(x):
        return jnp.where(jnp.arange(x.size).reshape(x.shape) % 2 == 0, 0, x)

    opt = case.make()
    params = jax.tree.map(half_zero, nested_tree(dtype=jnp.float16))
    state = opt.init(params)
    for k in range(4):
        grads = jax.tree.map(half_zero, jax.grad(quadratic_loss)(params))
        if k == 0:
            grads = jax.tree.map(jnp.zeros_like, grads)
        extra = extra_for(case, quadratic_loss, params)
        updates, _ = opt.update(grads, state, params, **extra)
        params, state = opt.step(grads, state, params, **extra)
    for name, tree in (("updates", updates), ("params", params), ("state", state)):
        for path, leaf in jax.tree.leaves_with_path(tree):
            where = f"{name}{jax.tree_util.keystr(path)}"
            if name != "state":
                assert leaf.dtype == jnp.float16, where
            if jnp.issubdtype(leaf.dtype, jnp.inexact):
                finite = jnp.isfinite(leaf.astype(jnp.float32))
                assert bool(jnp.all(finite)), where


@case_params
def test_changing_a_hyperparameter_does_not_recompile(case):
    params = nested_tree()
    grads = jax.grad(quadratic_loss)(params)
    extra = extra_for(case, quadratic_loss, params)
    name, value = case.vary
    results, logs = [], []
    for opt in (case.make(), case.make(**{name: value})):
        state = opt.init(params)
        p = params
        with compiles() as log:
            for _ in range(3):
                p, state = opt.step(grads, state, p, **extra)
        results.append(p)
        logs.append(log)
    # The second optimizer's steps reuse the first one's compiled program.
    assert logs[1] == [], logs[1]
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1]))
    ), f"changing {name} changed nothing"


@swept_params
def test_hyperparameters_may_be_traced(case):
    name, value = case.vary
    params = nested_tree()
    grads = jax.grad(quadratic_loss)(params)
    extra = extra_for(case, quadratic_loss, params)

    @jax.jit
    def run(hyper, params):
        opt = case.make(**{name: hyper})
        return opt.step(grads, opt.init(params), params, **extra)

    eager_opt = case.make(**{name: value})
    expected, _ = eager_opt.step(grads, eager_opt.init(params), params, **extra)
    hyper = value if not isinstance(value, float) else jnp.asarray(value)
    got, _ = run(hyper, params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


INVALID = [(c, arg, bad) for c in CASES for arg, bad in c.invalid]


@pytest.mark.parametrize(
    "case,arg,bad", INVALID, ids=[f"{c.name}-{a}={b!r}" for c, a, b in INVALID]
)
def test_invalid_hyperparameter_raises_naming_it(case, arg, bad):
    with pytest.raises(ValueError, match=arg):
        case.make(**{arg: bad})


@swept_params
def test_state_buffers_are_its_own(case):
    """No two state leaves share a buffer, nor with params or the optimizer (a
    0-d fill used to return the hyperparameter array itself): otherwise a donated
    step fails ("donate the same buffer twice") or deletes the optimizer's field."""
    opt = case.make()
    params = nested_tree()
    state = opt.init(params)

    def pointers(tree):
        return [
            x.unsafe_buffer_pointer()
            for x in jax.tree.leaves(tree)
            if isinstance(x, jax.Array)
        ]

    mine = pointers(state)
    assert len(set(mine)) == len(mine)
    assert not set(mine) & set(pointers(params) + pointers(opt))
    # And so a donated step runs and leaves the optimizer usable.
    grads = jax.grad(quadratic_loss)(params)
    extra = extra_for(case, quadratic_loss, params)
    donated = jax.tree.map(lambda x: jnp.array(x, copy=True), params)
    opt.step(grads, state, donated, donate=True, **extra)
    opt.step(grads, opt.init(params), params, **extra)


INT32_MAX = np.iinfo(np.int32).max
SATURATING = ("step", "gradient_step")  # counters that only ever count up


def at_int32_max(state):
    """`state` with every int32 scalar (step counters, micro-step and plateau
    counters) set to the int32 maximum."""

    def saturate(x):
        if isinstance(x, jax.Array) and x.ndim == 0 and x.dtype == jnp.int32:
            return jnp.full((), INT32_MAX, jnp.int32)
        return x

    return jax.tree.map(saturate, state)


def counter_name(path) -> str:
    last = path[-1]
    return str(getattr(last, "name", getattr(last, "key", last)))


@swept_params
def test_step_counter_at_int32_max_stays_finite_and_saturated(case):
    """A saturated step counter (and every other int counter at its limit) gives
    finite updates and parameters, and the step stays at the limit: nothing
    computes `step + 1` (or `step - offset + 1`) in int32, where it would wrap."""
    opt = case.make()
    params = nested_tree()
    state = at_int32_max(opt.init(params))
    for _ in range(2):
        grads = jax.grad(quadratic_loss)(params)
        extra = extra_for(case, quadratic_loss, params)
        updates, _ = opt.update(grads, state, params, **extra)
        params, state = opt.step(grads, state, params, **extra)
        for leaf in jax.tree.leaves((updates, params)):
            assert bool(jnp.all(jnp.isfinite(leaf)))
        for path, leaf in jax.tree.leaves_with_path(state):
            if jnp.issubdtype(leaf.dtype, jnp.inexact):
                assert bool(jnp.all(jnp.isfinite(leaf))), jax.tree_util.keystr(path)
            elif counter_name(path) in SATURATING:
                assert int(leaf) == INT32_MAX, jax.tree_util.keystr(path)


def _after_a_nan_gradient(case, path):
    """Parameters and state after two steps of `case` from `nested_tree()`, the first
    with one NaN gradient element (in `['dense']['w']`, a block of its own in the
    quantized cases), by `path`: `"update"` (`update` + `apply_updates`), `"step"`,
    `"donated"` (`step(..., donate=True)`), each with the native kernels off, or
    `"donated-native"` (on: the kernels run in donated steps)."""
    eqxopt.set_native_kernels(path == "donated-native")
    try:
        opt = case.make()
        params = jax.tree.map(jnp.copy, nested_tree())
        state = opt.init(params)
        for i in range(2):
            grads = jax.grad(quadratic_loss)(params)
            if i == 0:
                grads["dense"]["w"] = grads["dense"]["w"].at[1, 2].set(jnp.nan)
            extra = extra_for(case, quadratic_loss, params)
            if path == "update":
                updates, state = opt.update(grads, state, params, **extra)
                params = eqxopt.apply_updates(params, updates)
            else:
                donate = path.startswith("donated")
                params, state = opt.step(grads, state, params, donate=donate, **extra)
        return params, state
    finally:
        eqxopt.set_native_kernels(True)


@swept_params
@pytest.mark.parametrize(
    "path",
    [
        "update",
        "donated",
        pytest.param("donated-native", marks=pytest.mark.needs_compiler),
    ],
)
def test_one_nan_gradient_element_every_path_agrees(case, path):
    """Which parameters a NaN gradient element turns NaN, and the state it leaves,
    do not depend on how the step is run: with or without donation, with the
    native kernels or XLA's code, with float32 or quantized moments (where a value
    that is not finite is stored as 0: `eqxopt.QuantizedArray`)."""
    expected = _after_a_nan_gradient(case, "step")
    got = _after_a_nan_gradient(case, path)
    items = jax.tree.leaves_with_path(got)
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for (where, a), b in zip(items, jax.tree.leaves(expected)):
        what = f"{path}: {'params' if where[0].idx == 0 else 'state'}"
        what += jax.tree_util.keystr(where[1:])
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype, what
        if not np.issubdtype(a.dtype, np.inexact):
            np.testing.assert_array_equal(a, b, err_msg=what)
            continue
        np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=what)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=what)

    # And a quantized moment holds finite numbers only.
    def is_quantized(x):
        return isinstance(x, eqxopt.QuantizedArray)

    for x in filter(is_quantized, jax.tree.leaves(got[1], is_leaf=is_quantized)):
        assert np.all(np.isfinite(np.asarray(x.absmax))), path
        assert np.all(np.isfinite(np.asarray(x.dequantize()))), path
