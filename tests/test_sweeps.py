"""Every transform eqxopt ships (`sweep_cases.every_case()`: the catalog and the
rest), through the facilities that read an optimizer's structure rather than run
its maths: `hyperparameters`, `explain_kernels`, packed models and schedules out
of a field's range (issue 39's sweeps). `make test` runs a few cases of each (see
`sweep_cases.swept_every_case`), `make test-slow` all of them."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqxopt
from eqxopt import extend
from helpers import nested_tree
from sweep_cases import extra_for, per_example, swept_every_case, transforms_in

CASES = swept_every_case()


def _reported(values):
    for key, value in values.items():
        if isinstance(value, dict):
            yield from _reported(value)
        elif value is not None:
            yield key, float(value)


@pytest.mark.parametrize("case", CASES)
def test_hyperparameters_report_every_declared_float_hyperparameter(case):
    # Each float hyperparameter that a transform declares (`extend.values_at`
    # reads them), of the transform and of every transform it holds, is reported
    # once, with its value at the state's step.
    opt = case.make()
    state = opt.init(nested_tree())
    step = jnp.zeros((), jnp.int32)
    declared = sorted(
        (name, float(getattr(extend.values_at(t, step), name)))
        for t in transforms_in(opt)
        for name in extend.hyperparameter_fields(t)
        if getattr(t, name) is not None
    )
    # (every case declares some, but an optax transformation: its are baked in)
    assert declared or isinstance(opt, eqxopt.FromOptax)
    assert sorted(_reported(eqxopt.hyperparameters(opt, state))) == declared


@pytest.mark.parametrize("case", CASES)
def test_explain_kernels_gives_a_report(case):
    params = nested_tree()
    extra = extra_for(case, params)
    opt = case.make()
    report = extend.explain_kernels(opt, params, **extra)
    assert isinstance(report, str) and report
    if eqxopt.native_kernels_available():
        name = type(opt).__name__
        assert report.startswith((f"A donated {name}.step", f"{name} runs no per-leaf"))


@pytest.mark.parametrize("members", [1, 3])
def test_explain_kernels_of_a_population_explains_each_member(members):
    # Issue 39, item 6: a population failed with JAX's broadcast error.
    rates = [0.1, 0.01, 0.001][:members]
    opts = eqxopt.population(
        lambda learning_rate: eqxopt.AdamW(learning_rate), learning_rate=rates
    )
    params = nested_tree()
    stacked = jax.tree.map(lambda x: jnp.stack([x] * members), params)
    for given in (params, stacked):
        report = extend.explain_kernels(opts, given)
        if not eqxopt.native_kernels_available():
            assert len(report.splitlines()) == 1
            continue
        assert report.splitlines()[0].startswith(
            f"A donated AdamW.step of each of the {members} members"
        )
        lines = report.splitlines()[1:]
        assert len(lines) == len(jax.tree.leaves(params))
        assert all(line.endswith("native kernel") for line in lines), report


def test_explain_kernels_of_dpsgd_takes_per_example_gradients():
    # Issue 39, item 6: DPSGD complained about gradients the caller never passed.
    opt = eqxopt.DPSGD(0.1, 1.0, 0.5, seed=0, momentum=0.9)
    report = extend.explain_kernels(opt, nested_tree())
    if eqxopt.native_kernels_available():
        lines = report.splitlines()
        assert lines[0] == "A donated DPSGD.step on these parameters:"
        assert len(lines) == 1 + len(jax.tree.leaves(nested_tree()))


def test_per_example_sweep_cases_take_per_example_gradients():
    # The sweeps' helper gives what each case takes.
    for case in (c.values[0] for c in CASES):
        if "per_example" in case.tags:
            opt = case.make()
            params = nested_tree()
            grads = per_example(case, params)
            opt.update(grads, opt.init(params), params)


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: eqxopt.SGD(0.1, momentum=eqxopt.Constant(1.5)), "momentum"),
        (
            lambda: eqxopt.SGD(
                0.1, momentum=eqxopt.OneCycleMomentum(10, max_momentum=1.5)
            ),
            "momentum",
        ),
        (lambda: eqxopt.Adam(0.1, b1=eqxopt.Cyclic(0.8, 1.2, 5)), "b1"),
        (lambda: eqxopt.Adam(0.1, b2=eqxopt.ExponentialDecay(0.999, 10, 0.5)), "b2"),
        (lambda: eqxopt.RMSProp(0.1, eps=eqxopt.Linear(1e-8, 0.0, 10)), "eps"),
        (
            lambda: eqxopt.AdamW(
                0.1, weight_decay=eqxopt.Lambda(1.0, lambda s: -1.0 + 0.0 * s)
            ),
            None,  # a function of the user's: its range is not known
        ),
    ],
)
def test_a_schedule_out_of_a_fields_range_is_refused_naming_it(make, name):
    # Issue 39, item 4: these were accepted, and diverged.
    if name is None:
        make()
        return
    with pytest.raises(ValueError, match=rf"^{name} must be in .* at every step"):
        make()


def _out_of_range(case):
    """`(argument, value)` of the case's invalid values that are finite numbers
    (the checks of numbers, which a schedule of the same value must meet too)."""
    return [
        (arg, value)
        for arg, value in case.invalid
        if isinstance(value, (int, float))
        and not isinstance(value, bool)
        and abs(value) < 1e30
    ]


@pytest.mark.parametrize("case", CASES)
def test_a_schedule_out_of_each_fields_range_is_refused(case):
    # The sweep: each invalid number a case lists, as a schedule (constant, or
    # reaching it after valid values), is refused as the number is, naming the
    # argument (a `TypeError` where the field takes no schedule).
    for arg, value in _out_of_range(case):
        start = case.vary[1] if case.vary[0] == arg else value
        for schedule in (
            eqxopt.Constant(value),
            eqxopt.Join([eqxopt.Constant(start), eqxopt.Constant(value)], [5]),
        ):
            with pytest.raises((ValueError, TypeError), match=rf"\b{arg}\b"):
                case.make(**{arg: schedule})


# ---------------------------------------------------------------------------------
# Packed models: the tree's numbers, or a refusal naming the transform.

# Vectors only: a mask or label function that reads a leaf's rank (as several
# cases' do) then reads the same on the packed buffers, so that the sweep is about
# the transforms' own maths.
VECTORS = {"a": jnp.linspace(-1.0, 1.0, 6), "b": [jnp.arange(3.0) / 4, jnp.ones(5)]}
VECTORS["c"] = {"w": jnp.asarray([0.3, -0.7, 1.1, -0.2])}


def vector_loss(params):
    targets = jax.tree.leaves(jax.tree.map(lambda x: jnp.cos(3 * x), VECTORS))
    return sum(
        jnp.sum((p - t) ** 2 + 0.1 * p**4)
        for p, t in zip(jax.tree.leaves(params), targets)
    )


def packed_loss(packed):
    return vector_loss(packed.unpack())


def _run(opt, case, params, loss, steps=4):
    state = opt.init(params)
    for _ in range(steps):
        extra = {} if case.extra is None else case.extra(loss, params)
        grads = per_example(case, jax.grad(loss)(params))
        params, state = opt.step(grads, state, params, **extra)
    return params


def _distance(a, b):
    return max(
        float(jnp.max(jnp.abs(x - y)))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def _storage_off(opt):
    """The storage options of `opt` that quantize, set to `None` (float32)."""
    storages = (
        eqxopt.Blockwise8bit,
        eqxopt.Blockwise4bit,
        eqxopt.BlockwiseFp8,
        eqxopt.Companded8bit,
    )
    return {
        f.name: None
        for f in dataclasses.fields(opt)
        if isinstance(getattr(opt, f.name), storages)
    }


def _leaf_reducers(opt):
    return {type(t).__name__ for t in transforms_in(opt) if t.reduction() == "leaf"}


@pytest.mark.parametrize("case", CASES)
def test_a_packed_model_gets_the_trees_numbers_or_a_refusal(case):
    opt = case.make()
    reducers = _leaf_reducers(opt)
    packed = eqxopt.pack(VECTORS)
    if reducers:
        with pytest.raises(ValueError, match=r"reduces over each leaf") as error:
            opt.init(packed)
        assert str(error.value).split()[0] in reducers
        return
    tree = _run(opt, case, VECTORS, vector_loss)
    got = _run(opt, case, packed, packed_loss).unpack()
    if "quantized" in case.tags:
        # Block-wise moments are quantized per block of the buffer, not of each
        # leaf: as close to the float32 run as the tree's quantized run is.
        exact = _run(case.make(**_storage_off(opt)), case, VECTORS, vector_loss)
        # Companded codes are nearly linear (a softsign, 4 times finer near 0 at
        # most), where the dynamic map has decades: a group of the buffer that
        # mixes leaves of unlike magnitudes loses more (measured 1.6 times the
        # tree's distance for AdamW-Companded8bit).
        factor = 2.5 if "Companded" in case.name else 1.5
        assert _distance(got, exact) <= factor * _distance(tree, exact) + 1e-6
        return
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(tree), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=case.name)
    # The run moved: the comparison is not of two starting points.
    assert any(
        not np.allclose(x, y)
        for x, y in zip(jax.tree.leaves(tree), jax.tree.leaves(VECTORS))
    )


def _train_loss(params, x):
    squares = [jnp.sum(p * p) for p in jax.tree.leaves(params) if eqx_is_float(p)]
    return sum(squares) * jnp.mean(x)


def eqx_is_float(x):
    return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.inexact)


@pytest.mark.parametrize("case", CASES)
def test_make_train_step_works_or_refuses_when_made(case):
    """Every transform through `make_train_step`: the step is made and its first
    call runs, or it is refused when it is made, never at its first call. What a
    transform needs besides gradients comes from its declarations (the loss, the
    loss as a function of the parameters, per-example gradients)."""
    opt = case.make()
    params = jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), nested_tree())
    x = jnp.linspace(0.5, 1.5, 4)
    axes = 0 if opt.takes_per_example_grads() else None
    try:
        step = eqxopt.make_train_step(_train_loss, opt, per_example_axes=axes)
    except (TypeError, ValueError) as error:
        assert str(error), case.name
        return
    new_params, _, loss = step(params, opt.init(params), x)
    assert np.isfinite(float(loss))
    assert jax.tree.structure(new_params) == jax.tree.structure(nested_tree())
    assert all(np.all(np.isfinite(np.asarray(p))) for p in jax.tree.leaves(new_params))
