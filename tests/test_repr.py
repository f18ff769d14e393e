"""`print(opt)` shows the values an optimizer, transform or schedule holds (where
Equinox's own `repr` shows each array field as its shape, `b1=f32[]`), for every
such class of `eqxopt.__all__`; traced and stacked (`population`) values keep
Equinox's shape summary."""

import dataclasses
import inspect
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest

import eqxopt
from catalog import all_cases

BASES = (eqxopt.AbstractTransform, eqxopt.AbstractSchedule)
# Equinox's summary of an array: `f32[]`, `i32[3]`, `bool[]`, `u32[2]`.
SUMMARY = re.compile(r"\b(?:f|i|u|c|bf|weak_f)\d+\[|\bbool\[")


def _positive(updates, state, params):
    return jax.tree.map(jnp.abs, updates)


def _always(step):
    return step >= 0


# The classes that no catalog case builds (the catalog builds the optimizers and,
# inside them, most wrappers and blocks).
MORE = [
    eqxopt.ConditionallyMask(eqxopt.SGD(0.1), _always),
    eqxopt.ConditionallyTransform(eqxopt.SGD(0.1), _always),
    eqxopt.CosineDecay(0.1, 100, alpha=0.1),
    eqxopt.CosineOneCycle(100, 0.5),
    eqxopt.Cyclic(0.01, 0.1),
    eqxopt.DPSGD(0.1, l2_norm_clip=1.0, noise_multiplier=0.5, seed=0),
    eqxopt.DifferentiallyPrivateAggregate(1.0, 0.5, seed=0),
    eqxopt.EMA(0.99),
    eqxopt.ErrorCorrection(eqxopt.SGD(0.1), key=0),
    eqxopt.ExponentialDecay(0.1, 10, 0.5),
    eqxopt.FromOptax(optax.sgd(0.1)),
    eqxopt.Join([eqxopt.Constant(0.1), eqxopt.Linear(0.1, 0.0, 50)], [10]),
    eqxopt.KeepParamsNonnegative(),
    eqxopt.Lambda(0.1, lambda step: 1.0 / (1.0 + step)),
    eqxopt.Linear(0.1, 0.0, 100),
    eqxopt.LinearOneCycle(100, 0.5),
    eqxopt.Masked(eqxopt.SGD(0.1), {"w": True}),
    eqxopt.MeasureWithEMA(lambda updates, state, params: 1.0, 0.9),
    eqxopt.MultiStepDecay(0.1, [10, 20]),
    eqxopt.NormalizeByUpdateNorm(),
    eqxopt.OneCycleMomentum(100),
    eqxopt.PiecewiseConstant(0.1, {10: 0.5, 20: 0.1}),
    eqxopt.PiecewiseInterpolate("linear", 0.1, {10: 0.5}),
    eqxopt.Polynomial(0.1, 0.0, 2.0, 100),
    eqxopt.Product(0.1, [eqxopt.Linear(0.0, 1.0, 10)]),
    eqxopt.SGDR(
        [{"init_value": 0.0, "peak_value": 0.1, "warmup_steps": 5, "decay_steps": 50}]
    ),
    eqxopt.OffloadState(eqxopt.AdamW(1e-3)),
    eqxopt.QKClip(eqxopt.AdamW(1e-3), threshold=50.0),
    eqxopt.SWALR(0.1, 0.05),
    eqxopt.ScaleByBacktrackingLinesearch(10),
    eqxopt.Snapshot("loss", lambda updates, state, params: 1.0),
    eqxopt.SplitRealAndImaginary(eqxopt.SGD(0.1)),
    eqxopt.StepDecay(0.1, 10),
    eqxopt.WarmupConstant(0.0, 0.1, 10),
    eqxopt.WarmupExponentialDecay(0.0, 0.1, 10, 20, 0.5),
    eqxopt.WarmupStableDecay(0.1, 10, 100),
]


def _held(obj, found):
    """Every eqxopt optimizer, transform or schedule in `obj`, `obj` included."""
    if isinstance(obj, BASES):
        found.setdefault(type(obj), obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            _held(getattr(obj, field.name, None), found)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _held(item, found)
    elif isinstance(obj, dict):
        for item in obj.values():
            _held(item, found)
    return found


def _one_of_each() -> dict[type, object]:
    found: dict[type, object] = {}
    for case in all_cases():
        _held(case.make(), found)
    for obj in MORE:
        _held(obj, found)
    return found


INSTANCES = _one_of_each()


def test_every_optimizer_transform_and_schedule_class_is_printed():
    classes = {
        obj
        for name in eqxopt.__all__
        if isinstance(obj := getattr(eqxopt, name), type)
        and issubclass(obj, BASES)
        and not inspect.isabstract(obj)
        and not name.startswith("Abstract")
    }
    assert sorted(c.__name__ for c in classes - set(INSTANCES)) == []


@pytest.mark.parametrize(
    "obj", list(INSTANCES.values()), ids=lambda obj: type(obj).__name__
)
def test_print_shows_values_not_shapes(obj):
    text = repr(obj)
    assert text.startswith(f"{type(obj).__name__}("), text
    assert SUMMARY.search(text) is None, text


def test_print_shows_the_values_given():
    text = " ".join(repr(eqxopt.AdamW(1e-3, weight_decay=0.01)).split())
    assert text.startswith(
        "AdamW( learning_rate=0.001, b1=0.9, b2=0.999, eps=1e-08, weight_decay=0.01,"
    )
    schedule = eqxopt.WarmupCosine(3e-4, 3e-5, warmup_steps=500, total_steps=20_000)
    assert repr(schedule) == (
        "WarmupCosine(peak_lr=0.0003, min_lr=3e-05, warmup_steps=500, "
        "total_steps=20000)"
    )
    assert "learning_rate=WarmupCosine(" in repr(eqxopt.SGD(schedule))
    assert str(eqxopt.Constant(0.5)) == "Constant(value=0.5)"
    assert "boundaries=[10, 20], scales=[0.5, 0.1]" in repr(
        eqxopt.PiecewiseConstant(0.1, {10: 0.5, 20: 0.1})
    )


def test_a_module_holding_an_optimizer_prints_its_values():
    class TrainState(eqx.Module):
        opt: eqxopt.AbstractTransform
        step: jax.Array

    text = repr(TrainState(eqxopt.SGD(0.1, momentum=0.9), jnp.zeros((), jnp.int32)))
    assert "opt=SGD(learning_rate=0.1, momentum=0.9" in text
    assert "step=i32[]" in text  # the model's own arrays as Equinox prints them


def test_traced_and_stacked_values_keep_the_shape_summary():
    shown = []

    @jax.jit
    def build(learning_rate, momentum):
        shown.append(repr(eqxopt.SGD(learning_rate, momentum=momentum)))
        return learning_rate

    build(0.1, 0.9)
    # (A number given inside the trace is a number: `dampening` shows its value.)
    assert shown == [
        "SGD(learning_rate=Constant(value=f32[]), momentum=f32[], dampening=0.0)"
    ]
    stacked = eqxopt.population(
        lambda learning_rate: eqxopt.SGD(learning_rate, momentum=0.9),
        learning_rate=[0.1, 0.01],
    )
    assert repr(stacked) == (
        "SGD(learning_rate=Constant(value=f32[2]), momentum=f32[2], dampening=f32[2])"
    )
