"""Every transform eqxopt ships (`sweep_cases.every_case()`: the catalog and the
rest), through the facilities that read an optimizer's structure rather than run
its maths: `hyperparameters`, `explain_kernels`, packed models and schedules out
of a field's range (issue 39's sweeps). `make test` runs a few cases of each (see
`sweep_cases.swept_every_case`), `make test-slow` all of them."""

import jax
import jax.numpy as jnp
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
        (name, float(value))
        for t in transforms_in(opt)
        for name, value in vars(extend.values_at(t, step)).items()
        if value is not None
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
