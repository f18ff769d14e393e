"""Schedules against optax and torch.optim.lr_scheduler over thousands of steps, plus
the contract every schedule shares (vectorised, traced, no recompiles, usable as a
learning rate, errors in words) and the plot helper."""

import dataclasses
import inspect
import math
import re
import sys
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import eqxopt
from helpers import (
    assert_histories_close,
    enable_x64,
    grad_stream,
    load_script,
    nested_tree,
    run_eqxopt,
    run_optax,
    run_torch,
)

N_STEPS = 3001
STEPS = jnp.arange(N_STEPS, dtype=jnp.int32)

# Reference comparisons are float32 against float32 (optax) or float64 rounded to
# float32 (torch): a few ulps relative, and an absolute floor of ~8 ulps of the
# schedule's largest value where a curve passes near zero (a cosine at its end).
RTOL = 2e-6
ATOL_OF_MAX = 1e-6


def f32(x: float) -> float:
    """The float32 value of `x` as a Python float: eqxopt stores float hyperparameters
    as float32 arrays, so the torch (float64) reference gets the same numbers."""
    return float(np.float32(x))


TRACES: list[str] = []  # one entry per trace of `evaluate`


@eqx.filter_jit
def evaluate(schedule, steps):
    TRACES.append(type(schedule).__name__)
    return schedule(steps)


@eqx.filter_jit
def evaluate_many(schedules, steps):
    return [schedule(steps) for schedule in schedules]


def assert_close(ours, ref):
    ours = np.asarray(ours)
    ref = np.asarray(ref, dtype=np.float64)
    assert ours.dtype == np.float32
    assert ours.shape == ref.shape
    assert np.all(np.isfinite(ours))
    atol = ATOL_OF_MAX * float(np.max(np.abs(ref)))
    np.testing.assert_allclose(ours, ref, rtol=RTOL, atol=atol)


def optax_values(schedule: Callable, jit: bool = True) -> np.ndarray:
    """optax's values at steps 0..N-1. `jit=False` runs eagerly: under jax.jit, XLA
    turns optax's division by a constant step count into a multiplication by its
    reciprocal, so `polynomial_schedule(power=0.5)` ends 1.6e-4 above `end_value`
    instead of on it (sqrt of a 2.5e-8 rounding error). eqxopt divides by an array
    field and is exact there."""
    fn = jax.vmap(schedule)
    with jax.numpy_dtype_promotion("standard"):  # optax promotes implicitly
        return np.asarray((jax.jit(fn) if jit else fn)(STEPS))


def torch_values(make: Callable, lr: float) -> np.ndarray:
    """The learning rate torch uses at steps 0..N-1: read, then step the scheduler."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=lr)
    scheduler = make(opt)
    values = []
    for _ in range(N_STEPS):
        values.append(scheduler.get_last_lr()[0])
        opt.step()
        scheduler.step()
    return np.asarray(values)


def torch_momentum(make: Callable, adam: bool = False) -> np.ndarray:
    """The momentum (SGD's `momentum`, or Adam's `betas[0]`) torch uses at steps
    0..N-1 under a scheduler with `cycle_momentum=True`."""
    param = torch.nn.Parameter(torch.zeros(1))
    if adam:
        opt = torch.optim.Adam([param], lr=0.1)
    else:
        opt = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    scheduler = make(opt)
    values = []
    for _ in range(N_STEPS):
        group = opt.param_groups[0]
        values.append(group["betas"][0] if adam else group["momentum"])
        opt.step()
        scheduler.step()
    return np.asarray(values)


def np_one_cycle_momentum(s, total, low, high, pct, cosine=True, three=False):
    """torch's OneCycleLR momentum in NumPy float64, held from `total - 1` on."""
    s = np.minimum(np.asarray(s, dtype=np.float64), total - 1.0)
    ends = [pct * total - 1.0] + ([2 * pct * total - 2.0] if three else [])
    ends.append(total - 1.0)
    values = [high, low] + ([high] if three else []) + [high]
    out, start = np.zeros_like(s), 0.0
    chosen = np.zeros(s.shape, bool)
    for i, end in enumerate(ends):
        inside = ~chosen & ((s <= end) | (i == len(ends) - 1))
        p = np.clip((s - start) / (end - start), 0.0, 1.0)
        a, b = values[i], values[i + 1]
        here = b + (a - b) / 2 * (np.cos(np.pi * p) + 1) if cosine else a + (b - a) * p
        out = np.where(inside, here, out)
        chosen |= inside
        start = end
    return out


def inverse_time(s):
    """A user's `lr_lambda` for eqxopt (JAX operations on the step array; the
    float cast is what strict promotion asks)."""
    return 1.0 / (1.0 + 0.01 * jnp.asarray(s).astype(float))


def inverse_time_torch(epoch):
    """The same factor for torch, which calls `lr_lambda` on a Python int."""
    return 1.0 / (1.0 + 0.01 * epoch)


def np_wsd(s, peak, warmup, total, decay, init, end, shape):
    """Warmup-stable-decay written out in NumPy float64."""
    s = np.asarray(s, dtype=np.float64)
    p = np.clip((s - (total - decay)) / decay, 0.0, 1.0)
    factor = {
        "linear": 1.0 - p,
        "cosine": 0.5 * (1.0 + np.cos(np.pi * p)),
        "1-sqrt": 1.0 - np.sqrt(p),
    }[shape]
    ramp = init + (peak - init) * s / max(warmup, 1)
    return np.where(s < warmup, ramp, end + (peak - end) * factor)


def np_swalr(s, init, swa_lr, anneal, strategy):
    """torch's SWALR in closed form, in NumPy float64."""
    s = np.asarray(s, dtype=np.float64)
    t = np.ones_like(s) if anneal == 0 else np.clip(s / anneal, 0.0, 1.0)
    alpha = (1 - np.cos(np.pi * t)) / 2 if strategy == "cos" else t
    return swa_lr * alpha + init * (1 - alpha)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    schedule: Any
    reference: Callable[[], np.ndarray]


SGDR_CYCLES = [
    dict(
        init_value=0.0,
        peak_value=1.0,
        warmup_steps=100,
        decay_steps=1000,
        end_value=0.01,
    ),
    dict(
        init_value=0.01,
        peak_value=0.5,
        warmup_steps=50,
        decay_steps=800,
        end_value=0.0,
        exponent=2.0,
    ),
    dict(
        init_value=0.0, peak_value=0.25, warmup_steps=0, decay_steps=700, end_value=0.0
    ),
]
SCALES = {300: 4.0, 1000: 0.25, 2200: 0.1}
L = torch.optim.lr_scheduler
SWA_UTILS = torch.optim.swa_utils

CASES = [
    Case(
        "Constant",
        eqxopt.Constant(0.3),
        lambda: np.full(N_STEPS, f32(0.3)),
    ),
    Case(
        "Linear",
        eqxopt.Linear(0.5, 0.01, 1500, transition_begin=200),
        lambda: optax_values(optax.linear_schedule(0.5, 0.01, 1500, 200)),
    ),
    Case(
        "Linear-rising",
        eqxopt.Linear(0.0, 1.0, 1000),
        lambda: optax_values(optax.linear_schedule(0.0, 1.0, 1000)),
    ),
    Case(
        "Polynomial-2",
        eqxopt.Polynomial(1.0, 0.001, 2.0, 2500, 100),
        lambda: optax_values(optax.polynomial_schedule(1.0, 0.001, 2.0, 2500, 100)),
    ),
    Case(
        "Polynomial-0.5",
        eqxopt.Polynomial(1.0, 0.001, 0.5, 2500, 100),
        lambda: optax_values(
            optax.polynomial_schedule(1.0, 0.001, 0.5, 2500, 100), jit=False
        ),
    ),
    Case(
        "PiecewiseConstant",
        eqxopt.PiecewiseConstant(0.1, {500: 0.5, 1200: 0.1, 2000: 2.0}),
        lambda: optax_values(
            optax.piecewise_constant_schedule(0.1, {500: 0.5, 1200: 0.1, 2000: 2.0})
        ),
    ),
    Case(
        "ExponentialDecay",
        eqxopt.ExponentialDecay(1.0, 100, 0.97),
        lambda: optax_values(optax.exponential_decay(1.0, 100, 0.97)),
    ),
    Case(
        "ExponentialDecay-staircase",
        eqxopt.ExponentialDecay(1.0, 100, 0.9, 150, staircase=True, end_value=0.2),
        lambda: optax_values(optax.exponential_decay(1.0, 100, 0.9, 150, True, 0.2)),
    ),
    Case(
        "ExponentialDecay-growth",
        eqxopt.ExponentialDecay(0.01, 200, 1.5, end_value=0.5),
        lambda: optax_values(optax.exponential_decay(0.01, 200, 1.5, 0, False, 0.5)),
    ),
    Case(
        "CosineDecay",
        eqxopt.CosineDecay(0.4, 2000, alpha=0.05),
        lambda: optax_values(optax.cosine_decay_schedule(0.4, 2000, 0.05)),
    ),
    Case(
        "CosineDecay-exponent",
        eqxopt.CosineDecay(0.4, 2000, alpha=0.05, exponent=2.5),
        lambda: optax_values(optax.cosine_decay_schedule(0.4, 2000, 0.05, 2.5)),
    ),
    Case(
        "WarmupConstant",
        eqxopt.WarmupConstant(0.01, 0.5, 300),
        lambda: optax_values(optax.warmup_constant_schedule(0.01, 0.5, 300)),
    ),
    Case(
        "WarmupCosine",
        eqxopt.WarmupCosine(
            peak_lr=1.0, min_lr=0.1, warmup_steps=200, total_steps=2500
        ),
        lambda: optax_values(
            optax.warmup_cosine_decay_schedule(0.0, 1.0, 200, 2500, 0.1)
        ),
    ),
    Case(
        "WarmupExponentialDecay",
        eqxopt.WarmupExponentialDecay(0.1, 0.8, 250, 100, 0.95),
        lambda: optax_values(
            optax.warmup_exponential_decay_schedule(0.1, 0.8, 250, 100, 0.95)
        ),
    ),
    Case(
        "WarmupExponentialDecay-staircase",
        eqxopt.WarmupExponentialDecay(
            0.0,
            0.8,
            250,
            100,
            0.95,
            transition_begin=50,
            staircase=True,
            end_value=0.01,
        ),
        lambda: optax_values(
            optax.warmup_exponential_decay_schedule(
                0.0, 0.8, 250, 100, 0.95, 50, True, 0.01
            )
        ),
    ),
    Case(
        "LinearOneCycle",
        eqxopt.LinearOneCycle(2500, 0.7),
        lambda: optax_values(optax.linear_onecycle_schedule(2500, 0.7)),
    ),
    Case(
        "LinearOneCycle-custom",
        eqxopt.LinearOneCycle(2999, 0.7, 0.25, 0.7, 10.0, 100.0),
        lambda: optax_values(
            optax.linear_onecycle_schedule(2999, 0.7, 0.25, 0.7, 10.0, 100.0)
        ),
    ),
    Case(
        "CosineOneCycle",
        eqxopt.CosineOneCycle(2500, 0.7),
        lambda: optax_values(optax.cosine_onecycle_schedule(2500, 0.7)),
    ),
    Case(
        "CosineOneCycle-custom",
        eqxopt.CosineOneCycle(2999, 0.7, 0.45, 5.0, 50.0),
        lambda: optax_values(
            optax.cosine_onecycle_schedule(2999, 0.7, 0.45, 5.0, 50.0)
        ),
    ),
    Case(
        "SGDR",
        eqxopt.SGDR(SGDR_CYCLES),
        lambda: optax_values(optax.sgdr_schedule(SGDR_CYCLES)),
    ),
    Case(
        "PiecewiseInterpolate-linear",
        eqxopt.PiecewiseInterpolate("linear", 0.1, SCALES),
        lambda: optax_values(
            optax.piecewise_interpolate_schedule("linear", 0.1, SCALES)
        ),
    ),
    Case(
        "PiecewiseInterpolate-cosine",
        eqxopt.PiecewiseInterpolate("cosine", 0.1, SCALES),
        lambda: optax_values(
            optax.piecewise_interpolate_schedule("cosine", 0.1, SCALES)
        ),
    ),
    Case(
        "Join",
        eqxopt.Join(
            [
                eqxopt.Linear(0.0, 1.0, 200),
                eqxopt.CosineDecay(1.0, 1500, alpha=0.1),
                eqxopt.Constant(0.05),
            ],
            [200, 1700],
        ),
        lambda: optax_values(
            optax.join_schedules(
                [
                    optax.linear_schedule(0.0, 1.0, 200),
                    optax.cosine_decay_schedule(1.0, 1500, 0.1),
                    lambda c: jnp.full(jnp.shape(c), 0.05, jnp.float32),
                ],
                [200, 1700],
            )
        ),
    ),
    Case(
        "StepDecay",
        eqxopt.StepDecay(0.1, 250, 0.5),
        lambda: torch_values(lambda o: L.StepLR(o, 250, 0.5), 0.1),
    ),
    Case(
        "StepDecay-0.9",
        eqxopt.StepDecay(0.1, 100, 0.9),
        lambda: torch_values(lambda o: L.StepLR(o, 100, f32(0.9)), f32(0.1)),
    ),
    Case(
        "MultiStepDecay",
        # A repeated milestone decays twice, as in torch.
        eqxopt.MultiStepDecay(0.1, [300, 800, 800, 2000], 0.3),
        lambda: torch_values(
            lambda o: L.MultiStepLR(o, [300, 800, 800, 2000], f32(0.3)), f32(0.1)
        ),
    ),
    Case(
        "Cyclic-triangular",
        eqxopt.Cyclic(0.001, 0.1, 200, 300),
        lambda: torch_values(
            lambda o: L.CyclicLR(
                o, f32(0.001), f32(0.1), 200, 300, cycle_momentum=False
            ),
            f32(0.001),
        ),
    ),
    Case(
        "Cyclic-triangular2",
        eqxopt.Cyclic(0.001, 0.1, 250, mode="triangular2"),
        lambda: torch_values(
            lambda o: L.CyclicLR(
                o, f32(0.001), f32(0.1), 250, mode="triangular2", cycle_momentum=False
            ),
            f32(0.001),
        ),
    ),
    Case(
        "Cyclic-exp_range",
        eqxopt.Cyclic(0.001, 0.1, 150, 350, mode="exp_range", gamma=0.9995),
        lambda: torch_values(
            lambda o: L.CyclicLR(
                o,
                f32(0.001),
                f32(0.1),
                150,
                350,
                mode="exp_range",
                gamma=f32(0.9995),
                cycle_momentum=False,
            ),
            f32(0.001),
        ),
    ),
    Case(
        "Cyclic-momentum",
        # torch's cycle_momentum: the same triangle from max_momentum down.
        eqxopt.Cyclic(0.9, 0.8, 150, 350, mode="exp_range", gamma=0.9995),
        lambda: torch_momentum(
            lambda o: L.CyclicLR(
                o,
                0.001,
                0.1,
                150,
                350,
                mode="exp_range",
                gamma=f32(0.9995),
                base_momentum=f32(0.8),
                max_momentum=f32(0.9),
            )
        ),
    ),
    Case(
        "Cyclic-triangular2-b1",
        eqxopt.Cyclic(0.95, 0.85, 250, mode="triangular2"),
        lambda: torch_momentum(
            lambda o: L.CyclicLR(
                o,
                0.001,
                0.1,
                250,
                mode="triangular2",
                base_momentum=f32(0.85),
                max_momentum=f32(0.95),
            ),
            adam=True,
        ),
    ),
    Case(
        "OneCycleMomentum-cos",
        eqxopt.OneCycleMomentum(N_STEPS),
        lambda: torch_momentum(
            lambda o: L.OneCycleLR(
                o, 1.0, N_STEPS, base_momentum=f32(0.85), max_momentum=f32(0.95)
            )
        ),
    ),
    Case(
        "OneCycleMomentum-linear-three-phase-b1",
        eqxopt.OneCycleMomentum(N_STEPS, 0.8, 0.9, 0.25, "linear", True),
        lambda: torch_momentum(
            lambda o: L.OneCycleLR(
                o,
                1.0,
                N_STEPS,
                pct_start=0.25,
                anneal_strategy="linear",
                three_phase=True,
                base_momentum=f32(0.8),
                max_momentum=f32(0.9),
            ),
            adam=True,
        ),
    ),
    Case(
        "Lambda-vs-torch-LambdaLR",
        eqxopt.Lambda(0.1, inverse_time),
        lambda: torch_values(lambda o: L.LambdaLR(o, inverse_time_torch), f32(0.1)),
    ),
    Case(
        "Product-vs-torch-ChainedScheduler",
        eqxopt.Product(
            0.1,
            [
                eqxopt.PiecewiseConstant(0.25, {500: 4.0}),
                eqxopt.ExponentialDecay(1.0, 1, 0.9995),
                eqxopt.StepDecay(1.0, 700, 0.5),
            ],
        ),
        lambda: torch_values(
            lambda o: L.ChainedScheduler(
                [
                    L.ConstantLR(o, 0.25, 500),
                    L.ExponentialLR(o, f32(0.9995)),
                    L.StepLR(o, 700, 0.5),
                ]
            ),
            f32(0.1),
        ),
    ),
    Case(
        "SWALR-cos",
        eqxopt.SWALR(0.1, 0.005, 1000),
        lambda: torch_values(
            lambda o: SWA_UTILS.SWALR(o, f32(0.005), 1000, "cos"), f32(0.1)
        ),
    ),
    Case(
        "SWALR-linear",
        eqxopt.SWALR(0.1, 0.02, 700, "linear"),
        lambda: torch_values(
            lambda o: SWA_UTILS.SWALR(o, f32(0.02), 700, "linear"), f32(0.1)
        ),
    ),
    Case(
        "SWALR-no-annealing",
        eqxopt.SWALR(0.1, 0.02, 0),
        lambda: torch_values(lambda o: SWA_UTILS.SWALR(o, f32(0.02), 0), f32(0.1)),
    ),
    # torch's own versions of schedules that optax also has.
    Case(
        "Linear-vs-torch-LinearLR",
        eqxopt.Linear(0.025, 0.1, 1000),
        lambda: torch_values(lambda o: L.LinearLR(o, 0.25, 1.0, 1000), f32(0.1)),
    ),
    Case(
        "CosineDecay-vs-torch-CosineAnnealingLR",
        eqxopt.CosineDecay(0.1, 3000, alpha=0.01),
        lambda: torch_values(
            lambda o: L.CosineAnnealingLR(o, 3000, eta_min=f32(0.1) * f32(0.01)),
            f32(0.1),
        ),
    ),
    Case(
        "ExponentialDecay-vs-torch-ExponentialLR",
        eqxopt.ExponentialDecay(0.1, 1, 0.999),
        lambda: torch_values(lambda o: L.ExponentialLR(o, f32(0.999)), f32(0.1)),
    ),
    Case(
        "SGDR-vs-torch-CosineAnnealingWarmRestarts",
        # torch restarts forever; seven 500-step cycles cover the 3001 steps.
        eqxopt.SGDR(
            [dict(init_value=0.1, peak_value=0.1, decay_steps=500, end_value=0.001)] * 7
        ),
        lambda: torch_values(
            lambda o: L.CosineAnnealingWarmRestarts(o, 500, eta_min=f32(0.001)),
            f32(0.1),
        ),
    ),
    Case(
        "WarmupStableDecay-linear-vs-optax-join",
        eqxopt.WarmupStableDecay(0.6, 200, 2500, decay_steps=500, end_value=0.06),
        lambda: optax_values(
            optax.join_schedules(
                [
                    optax.linear_schedule(0.0, 0.6, 200),
                    optax.constant_schedule(0.6),
                    optax.linear_schedule(0.6, 0.06, 500),
                ],
                [200, 2000],
            )
        ),
    ),
    Case(
        "WarmupStableDecay-cosine-vs-optax-join",
        eqxopt.WarmupStableDecay(
            0.6, 200, 2500, decay_fraction=0.3, end_value=0.06, decay_shape="cosine"
        ),
        lambda: optax_values(
            optax.join_schedules(
                [
                    optax.linear_schedule(0.0, 0.6, 200),
                    optax.constant_schedule(0.6),
                    optax.cosine_decay_schedule(0.6, 750, 0.1),
                ],
                [200, 1750],
            )
        ),
    ),
    Case(
        "WarmupStableDecay-1-sqrt-vs-numpy",
        eqxopt.WarmupStableDecay(
            1.0, 100, 2800, decay_steps=600, init_value=0.1, decay_shape="1-sqrt"
        ),
        lambda: np_wsd(
            np.arange(N_STEPS), 1.0, 100, 2800, 600, f32(0.1), 0.0, "1-sqrt"
        ),
    ),
]
ids = [c.name for c in CASES]
cases = pytest.mark.parametrize("case", CASES, ids=ids)


@cases
def test_matches_reference_over_thousands_of_steps(case):
    ours = evaluate(case.schedule, STEPS)
    assert_close(ours, case.reference())


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_warmup_stable_decay_matches_numpy_formula(shape):
    sched = eqxopt.WarmupStableDecay(
        0.5,
        300,
        2700,
        decay_fraction=0.25,
        init_value=0.05,
        end_value=0.01,
        decay_shape=shape,
    )
    assert int(sched.decay_steps) == 675
    ref = np_wsd(np.arange(N_STEPS), 0.5, 300, 2700, 675, f32(0.05), f32(0.01), shape)
    assert_close(evaluate(sched, STEPS), ref)
    values = np.asarray(evaluate(sched, STEPS))
    np.testing.assert_array_equal(values[300:2025], np.float32(0.5))  # the plateau
    np.testing.assert_array_equal(values[2700:], np.float32(0.01))  # the floor


PICKS = [0, 1, 99, 100, 250, 299, 300, 1000, 1999, 2000, 2500, 3000]


@eqx.filter_jit
def scalars_and_batch(schedule, picks):
    # Each picks[i] is a traced int32 scalar: no Python `if` on the step may run.
    return [schedule(picks[i]) for i in range(picks.shape[0])], schedule(picks)


# Every schedule class under jax_enable_x64, against float64 references: optax's
# schedules called on float64 steps (on int32 ones they compute in float32 even
# under x64), torch's schedulers (float64 arithmetic), or a NumPy formula. Built
# under x64, a schedule's values are float64 and so are its results.
def _optax64(schedule: Callable) -> Callable[[], np.ndarray]:
    return lambda: np.asarray(jax.vmap(schedule)(STEPS.astype(jnp.float64)))


STAIRS = {500: 0.5, 1200: 0.1, 2000: 2.0}
X64_CASES = {
    "Constant": (
        lambda: eqxopt.Constant(0.3),
        lambda: np.full(N_STEPS, 0.3),
    ),
    "Linear": (
        lambda: eqxopt.Linear(0.5, 0.01, 1500, transition_begin=200),
        _optax64(optax.linear_schedule(0.5, 0.01, 1500, 200)),
    ),
    "Polynomial": (
        lambda: eqxopt.Polynomial(1.0, 0.001, 2.0, 2500, 100),
        _optax64(optax.polynomial_schedule(1.0, 0.001, 2.0, 2500, 100)),
    ),
    "PiecewiseConstant": (
        lambda: eqxopt.PiecewiseConstant(0.1, STAIRS),
        _optax64(optax.piecewise_constant_schedule(0.1, STAIRS)),
    ),
    "ExponentialDecay": (
        lambda: eqxopt.ExponentialDecay(1.0, 100, 0.9, 150, True, end_value=0.2),
        _optax64(optax.exponential_decay(1.0, 100, 0.9, 150, True, 0.2)),
    ),
    "CosineDecay": (
        lambda: eqxopt.CosineDecay(0.4, 2000, alpha=0.05, exponent=2.5),
        _optax64(optax.cosine_decay_schedule(0.4, 2000, 0.05, 2.5)),
    ),
    "WarmupConstant": (
        lambda: eqxopt.WarmupConstant(0.01, 0.5, 300),
        _optax64(optax.warmup_constant_schedule(0.01, 0.5, 300)),
    ),
    "WarmupCosine": (
        lambda: eqxopt.WarmupCosine(3e-4, 3e-5, 200, 2500),
        _optax64(optax.warmup_cosine_decay_schedule(0.0, 3e-4, 200, 2500, 3e-5)),
    ),
    "WarmupExponentialDecay": (
        lambda: eqxopt.WarmupExponentialDecay(0.1, 0.8, 250, 100, 0.95),
        _optax64(optax.warmup_exponential_decay_schedule(0.1, 0.8, 250, 100, 0.95)),
    ),
    "LinearOneCycle": (
        lambda: eqxopt.LinearOneCycle(2500, 0.7),
        _optax64(optax.linear_onecycle_schedule(2500, 0.7)),
    ),
    "CosineOneCycle": (
        lambda: eqxopt.CosineOneCycle(2500, 0.7),
        _optax64(optax.cosine_onecycle_schedule(2500, 0.7)),
    ),
    "SGDR": (
        lambda: eqxopt.SGDR(SGDR_CYCLES),
        _optax64(optax.sgdr_schedule(SGDR_CYCLES)),
    ),
    "PiecewiseInterpolate": (
        lambda: eqxopt.PiecewiseInterpolate("cosine", 0.1, SCALES),
        _optax64(optax.piecewise_interpolate_schedule("cosine", 0.1, SCALES)),
    ),
    "Join": (
        lambda: eqxopt.Join(
            [eqxopt.Linear(0.0, 1.0, 200), eqxopt.CosineDecay(1.0, 1500, alpha=0.1)],
            [200],
        ),
        _optax64(
            optax.join_schedules(
                [
                    optax.linear_schedule(0.0, 1.0, 200),
                    optax.cosine_decay_schedule(1.0, 1500, 0.1),
                ],
                [200],
            )
        ),
    ),
    "StepDecay": (
        lambda: eqxopt.StepDecay(0.1, 100, 0.9),
        lambda: torch_values(lambda o: L.StepLR(o, 100, 0.9), 0.1),
    ),
    "MultiStepDecay": (
        lambda: eqxopt.MultiStepDecay(0.1, [300, 800, 800, 2000], 0.3),
        lambda: torch_values(
            lambda o: L.MultiStepLR(o, [300, 800, 800, 2000], 0.3), 0.1
        ),
    ),
    "Cyclic": (
        lambda: eqxopt.Cyclic(0.001, 0.1, 150, 350, mode="exp_range", gamma=0.9995),
        lambda: torch_values(
            lambda o: L.CyclicLR(
                o, 0.001, 0.1, 150, 350, "exp_range", gamma=0.9995, cycle_momentum=False
            ),
            0.001,
        ),
    ),
    "OneCycleMomentum": (
        lambda: eqxopt.OneCycleMomentum(2500, 0.8, 0.9, 0.3, "cos", True),
        lambda: np_one_cycle_momentum(
            np.arange(N_STEPS), 2500, 0.8, 0.9, 0.3, True, True
        ),
    ),
    "Lambda": (
        lambda: eqxopt.Lambda(0.3, inverse_time),
        lambda: 0.3 / (1.0 + 0.01 * np.arange(N_STEPS, dtype=np.float64)),
    ),
    "Product": (
        lambda: eqxopt.Product(
            0.5, [eqxopt.CosineDecay(1.0, 2000, alpha=0.05), eqxopt.StepDecay(1.0, 300)]
        ),
        lambda: (
            _optax64(optax.cosine_decay_schedule(0.5, 2000, 0.05))()
            * 0.1 ** (np.arange(N_STEPS) // 300)
        ),
    ),
    "SWALR": (
        lambda: eqxopt.SWALR(0.1, 0.005, 1000),
        lambda: np_swalr(np.arange(N_STEPS), 0.1, 0.005, 1000, "cos"),
    ),
    "WarmupStableDecay": (
        lambda: eqxopt.WarmupStableDecay(
            1.0, 100, 2800, decay_steps=600, init_value=0.1, decay_shape="1-sqrt"
        ),
        lambda: np_wsd(np.arange(N_STEPS), 1.0, 100, 2800, 600, 0.1, 0.0, "1-sqrt"),
    ),
}


def test_every_schedule_class_has_a_float64_case():
    classes = {
        name
        for name in dir(eqxopt)
        if isinstance(getattr(eqxopt, name), type)
        and issubclass(getattr(eqxopt, name), eqxopt.AbstractSchedule)
        and not name.startswith("Abstract")
    }
    assert classes == set(X64_CASES)


@pytest.mark.parametrize("name", sorted(X64_CASES))
def test_schedules_compute_in_float64_under_x64(name):
    """Under `jax_enable_x64` a schedule returns float64 (the default float dtype,
    that of every hyperparameter), equal to float64 references to rounding: in
    float32 its values would be 1e-8 off."""
    make, reference = X64_CASES[name]
    with enable_x64(True), jax.numpy_dtype_promotion("standard"):
        schedule = make()
        ours = np.asarray(jax.jit(schedule)(STEPS))
        traced = np.asarray(evaluate(schedule, STEPS))
        ref = np.asarray(reference(), np.float64)
    assert ours.dtype == traced.dtype == np.float64
    atol = 1e-14 * float(np.max(np.abs(ref)))
    np.testing.assert_allclose(ours, ref, rtol=1e-13, atol=atol)
    np.testing.assert_allclose(traced, ref, rtol=1e-13, atol=atol)
    with enable_x64(False):
        assert make()(STEPS).dtype == jnp.float32


def float32_atol(values) -> float:
    """float32 rounding at a schedule's own scale: its formulas add and subtract
    values that large (optax's `(init - end) * frac + end`), so a small value
    carries their rounding, and two programs that round it apart (one fusing a
    multiply and an add, one not) differ by that much."""
    return 1e-6 * float(np.max(np.abs(values)))


@cases
def test_scalar_and_vector_calls_agree_and_work_traced(case):
    vector = np.asarray(evaluate(case.schedule, STEPS))
    atol = float32_atol(vector)
    scalars, batch = scalars_and_batch(case.schedule, jnp.asarray(PICKS, jnp.int32))
    for s, out in zip(PICKS, scalars):
        assert out.shape == () and out.dtype == jnp.float32
        np.testing.assert_allclose(float(out), vector[s], rtol=1e-6, atol=atol)
    assert batch.shape == (len(PICKS),) and batch.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(batch), vector[PICKS], rtol=1e-6, atol=atol)


def test_eager_calls_on_python_ints_and_numpy_arrays():
    sched = eqxopt.WarmupStableDecay(1.0, 10, 100, decay_steps=20)
    assert float(sched(5)) == pytest.approx(0.5)
    out = sched(np.asarray([0, 50, 90, 100], np.int64))
    assert out.dtype == jnp.float32 and out.shape == (4,)
    np.testing.assert_allclose(np.asarray(out), [0.0, 1.0, 0.5, 0.0], atol=1e-7)
    assert eqxopt.Cyclic(0.0, 1.0, 4)(jnp.int32(2)).dtype == jnp.float32


def _scale_floats(tree, factor):
    return jax.tree.map(lambda x: x * factor if eqx.is_inexact_array(x) else x, tree)


@cases
def test_changing_float_values_does_not_recompile(case):
    # `evaluate` is shared with the reference test, so in a full run it is already
    # compiled for this schedule; count traces from here.
    first = np.asarray(evaluate(case.schedule, STEPS))
    before = len(TRACES)
    halved = _scale_floats(case.schedule, 0.5)
    second = np.asarray(evaluate(halved, STEPS))
    assert len(TRACES) == before, "a new float value recompiled"
    assert not np.array_equal(first, second)


def test_new_objects_with_other_values_and_steps_reuse_the_compiled_function():
    traces = []

    @eqx.filter_jit
    def run(sched, steps):
        traces.append(type(sched).__name__)
        return sched(steps)

    steps = jnp.arange(8, dtype=jnp.int32)
    pairs = [
        (
            eqxopt.WarmupStableDecay(1.0, 10, 100),
            eqxopt.WarmupStableDecay(
                0.3, 20, 300, decay_steps=50, init_value=0.1, end_value=0.01
            ),
        ),
        (
            eqxopt.PiecewiseConstant(0.1, {10: 0.5, 20: 0.1}),
            eqxopt.PiecewiseConstant(0.2, {15: 0.3, 40: 0.2}),
        ),
        (eqxopt.MultiStepDecay(0.1, [3, 5]), eqxopt.MultiStepDecay(0.5, [2, 9], 0.5)),
        (eqxopt.Cyclic(0.1, 1.0, 4), eqxopt.Cyclic(0.2, 0.5, 3, 7)),
        (eqxopt.LinearOneCycle(100, 1.0), eqxopt.LinearOneCycle(50, 2.0, 0.1, 0.5)),
        (
            eqxopt.SGDR(SGDR_CYCLES),
            eqxopt.SGDR(
                [
                    dict(c, peak_value=0.9, decay_steps=c["decay_steps"] + 5)
                    for c in SGDR_CYCLES
                ]
            ),
        ),
        (
            eqxopt.Join([eqxopt.Constant(1.0), eqxopt.Linear(1.0, 0.0, 5)], [3]),
            eqxopt.Join([eqxopt.Constant(2.0), eqxopt.Linear(3.0, 1.0, 9)], [5]),
        ),
    ]
    for a, b in pairs:
        before = len(traces)
        va, vb = run(a, steps), run(b, steps)
        assert len(traces) == before + 1, type(a).__name__
        assert not np.array_equal(np.asarray(va), np.asarray(vb))


def test_lambda_recompiles_for_a_new_function_not_a_new_step_or_value():
    """The function is static (part of the program), the step and `init_value`
    are arrays."""
    traces = []

    @eqx.filter_jit
    def run(schedule, step):
        traces.append(type(schedule).__name__)
        return schedule(step)

    schedule = eqxopt.Lambda(0.1, inverse_time)
    first = run(schedule, jnp.int32(3))
    assert len(traces) == 1
    np.testing.assert_allclose(float(first), 0.1 / 1.03, rtol=1e-6)
    run(schedule, jnp.int32(700))
    run(eqxopt.Lambda(0.5, inverse_time), jnp.int32(9))
    assert len(traces) == 1, "a new step or init_value recompiled"
    other = run(eqxopt.Lambda(0.1, lambda s: inverse_time(s) ** 2), jnp.int32(3))
    assert len(traces) == 2, "a new function must compile its own program"
    np.testing.assert_allclose(float(other), 0.1 / 1.03**2, rtol=1e-6)


def test_values_may_be_tracers():
    @jax.jit
    def build_and_call(peak, steps):
        return (
            eqxopt.WarmupStableDecay(peak, 2, 10, decay_steps=3)(steps),
            eqxopt.CosineDecay(peak, 10, alpha=0.1)(steps),
            eqxopt.LinearOneCycle(10, peak, pct_start=peak / 4)(steps),
        )

    steps = jnp.arange(12, dtype=jnp.int32)
    concrete = [
        eqxopt.WarmupStableDecay(0.8, 2, 10, decay_steps=3),
        eqxopt.CosineDecay(0.8, 10, alpha=0.1),
        eqxopt.LinearOneCycle(10, 0.8, pct_start=0.2),
    ]
    for got, want in zip(
        build_and_call(jnp.float32(0.8), steps), evaluate_many(concrete, steps)
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


ONE_PER_CLASS = list({type(c.schedule): c for c in reversed(CASES)}.values())[::-1]


@pytest.mark.parametrize("case", ONE_PER_CLASS, ids=[c.name for c in ONE_PER_CLASS])
def test_usable_as_sgd_learning_rate(case):
    # With a constant gradient of ones, SGD's parameter after n steps is
    # -sum(lr(0..n-1)): the schedule is read at the step count before the increment.
    opt = eqxopt.SGD(learning_rate=case.schedule)
    params = {"w": jnp.zeros((2,), jnp.float32)}
    grads = {"w": jnp.ones((2,), jnp.float32)}
    state = opt.init(params)
    for _ in range(4):
        params, state = opt.step(grads, state, params)
    lrs = np.asarray(evaluate(case.schedule, jnp.arange(4, dtype=jnp.int32)))
    np.testing.assert_allclose(
        np.asarray(params["w"]),
        np.full(2, -np.sum(lrs, dtype=np.float32)),
        rtol=1e-6,
        atol=4 * float32_atol(evaluate(case.schedule, STEPS)),
    )


class _SteppedWithScheduler:
    """A torch optimizer whose `step` also steps its scheduler (what `run_torch`
    calls), as a training loop does."""

    def __init__(self, opt, scheduler):
        self.opt, self.scheduler = opt, scheduler

    def step(self):
        self.opt.step()
        self.scheduler.step()


@pytest.mark.parametrize("adam", [False, True], ids=["sgd-momentum", "adam-b1"])
def test_cycled_momentum_trains_as_torch_cyclic_lr_with_cycle_momentum(adam):
    """`momentum=` / `b1=` take a schedule: `Cyclic(max_momentum, base_momentum)`
    there and `Cyclic(base_lr, max_lr)` as the learning rate train as torch's
    `CyclicLR(cycle_momentum=True)` over 30 steps (measured max abs difference
    3.6e-7 with SGD, 7.5e-8 with Adam; default tolerances)."""
    params = nested_tree(seed=3)
    grads = list(grad_stream(params, 30, seed=4))
    lr = eqxopt.Cyclic(0.01, 0.05, 4, 6, mode="triangular2")
    momentum = eqxopt.Cyclic(0.95, 0.8, 4, 6, mode="triangular2")
    if adam:
        opt = eqxopt.Adam(lr, b1=momentum, b2=0.99)
    else:
        opt = eqxopt.SGD(lr, momentum=momentum)

    def make(tensors):
        if adam:
            torch_opt = torch.optim.Adam(tensors, lr=0.01, betas=(0.9, 0.99))
        else:
            torch_opt = torch.optim.SGD(tensors, lr=0.01, momentum=0.9)
        scheduler = L.CyclicLR(
            torch_opt,
            f32(0.01),
            f32(0.05),
            4,
            6,
            mode="triangular2",
            base_momentum=f32(0.8),
            max_momentum=f32(0.95),
        )
        return _SteppedWithScheduler(torch_opt, scheduler)

    assert_histories_close(
        run_eqxopt(opt, params, grads), run_torch(make, params, grads)
    )


def test_schedule_in_adamw_matches_optax_adamw_with_optax_schedule():
    params = nested_tree()
    grads = list(grad_stream(params, 40))
    sched = eqxopt.WarmupStableDecay(1e-2, 5, 40, decay_steps=10, decay_shape="cosine")
    ref = optax.join_schedules(
        [
            optax.linear_schedule(0.0, 1e-2, 5),
            optax.constant_schedule(1e-2),
            optax.cosine_decay_schedule(1e-2, 10),
        ],
        [5, 30],
    )
    ours = run_eqxopt(
        eqxopt.AdamW(learning_rate=sched, weight_decay=0.1), params, grads
    )
    theirs = run_optax(optax.adamw(ref, weight_decay=0.1), params, grads)
    assert_histories_close(ours, theirs)


def test_degenerate_values_give_no_nan():
    steps = jnp.arange(0, 40, dtype=jnp.int32)
    schedules = [
        # optax's warmup-cosine with peak 0 divides end by peak; here all zeros.
        eqxopt.WarmupCosine(0.0, 0.0, 0, 10),
        eqxopt.SGDR([dict(peak_value=0.0, decay_steps=5, end_value=0.1)]),
        eqxopt.WarmupConstant(0.0, 1.0, 0),  # no warmup: the peak from step 0
        eqxopt.WarmupStableDecay(1.0, 0, 10, decay_steps=10),  # all decay
        eqxopt.Cyclic(0.1, 1.0, 5, 0),  # no way down: a sawtooth
        eqxopt.LinearOneCycle(1, 1.0),  # phases of zero length
        eqxopt.CosineOneCycle(10, 1.0, pct_start=0.0),
        eqxopt.PiecewiseInterpolate("cosine", 1.0, {0: 2.0, 5: 0.0}),
        eqxopt.PiecewiseConstant(1.0),
        eqxopt.Join([eqxopt.Constant(1.0)], []),
    ]
    outputs = evaluate_many(schedules, steps)
    for sched, values in zip(schedules, outputs):
        assert np.all(np.isfinite(np.asarray(values))), type(sched).__name__
    np.testing.assert_array_equal(np.asarray(outputs[0]), np.float32(0.0))
    np.testing.assert_array_equal(np.asarray(outputs[2]), np.float32(1.0))
    np.testing.assert_allclose(
        np.asarray(outputs[4])[:7],
        np.float32([0.1, 0.28, 0.46, 0.64, 0.82, 0.1, 0.28]),
        rtol=1e-6,
    )


ERRORS = [
    (
        lambda: eqxopt.Linear(-1.0, 0.0, 10),
        ValueError,
        r"init_value must be in \[0.0, inf\)",
    ),
    (lambda: eqxopt.Linear(1.0, math.inf, 10), ValueError, "end_value must be in"),
    (
        lambda: eqxopt.Linear(1.0, 0.0, 0),
        ValueError,
        "transition_steps must be >= 1, got 0",
    ),
    (
        lambda: eqxopt.Linear(1.0, 0.0, 10, -3),
        ValueError,
        "transition_begin must be >= 0",
    ),
    (
        lambda: eqxopt.Linear(1.0, 0.0, 10.0),
        TypeError,
        "transition_steps must be an integer",
    ),
    (
        lambda: eqxopt.Polynomial(1.0, 0.0, 0.0, 10),
        ValueError,
        r"power must be in \(0.0",
    ),
    (
        lambda: eqxopt.PiecewiseConstant(1.0, [(1, 0.5)]),
        TypeError,
        "boundaries_and_scales must be a dict",
    ),
    (
        lambda: eqxopt.PiecewiseConstant(1.0, {10: -0.5}),
        ValueError,
        r"boundaries_and_scales\[10\] must be in",
    ),
    (
        lambda: eqxopt.PiecewiseConstant(1.0, {1.5: 0.5}),
        TypeError,
        "keys must be integer steps",
    ),
    (
        lambda: eqxopt.PiecewiseConstant(1.0, {-4: 0.5}),
        ValueError,
        r"boundaries_and_scales\[0\] must be >= 0",
    ),
    (
        lambda: eqxopt.ExponentialDecay(1.0, 10, 0.0),
        ValueError,
        r"decay_rate must be in \(0.0",
    ),
    (
        lambda: eqxopt.ExponentialDecay(1.0, 0, 0.5),
        ValueError,
        "transition_steps must be >= 1",
    ),
    (
        lambda: eqxopt.ExponentialDecay(1.0, 10, 0.5, staircase=1),
        TypeError,
        "staircase must be a bool",
    ),
    (
        lambda: eqxopt.ExponentialDecay(1.0, 10, 0.5, end_value=-1.0),
        ValueError,
        "end_value must be in",
    ),
    (lambda: eqxopt.CosineDecay(1.0, 0), ValueError, "decay_steps must be >= 1"),
    (
        lambda: eqxopt.CosineDecay(1.0, 10, exponent=-1.0),
        ValueError,
        "exponent must be in",
    ),
    (lambda: eqxopt.CosineDecay(1.0, 10, alpha=-0.1), ValueError, "alpha must be in"),
    (
        lambda: eqxopt.WarmupConstant(0.0, 1.0, -1),
        ValueError,
        "warmup_steps must be >= 0",
    ),
    (
        lambda: eqxopt.WarmupExponentialDecay(0.0, 1.0, 5, 10, -0.5),
        ValueError,
        "decay_rate must be in",
    ),
    (
        lambda: eqxopt.PiecewiseInterpolate("cubic", 1.0),
        ValueError,
        "interpolate_type must be one of 'linear', 'cosine'",
    ),
    (
        lambda: eqxopt.LinearOneCycle(0, 1.0),
        ValueError,
        "transition_steps must be >= 1",
    ),
    (
        lambda: eqxopt.LinearOneCycle(100, 1.0, 0.9, 0.5),
        ValueError,
        "pct_final must be >= pct_start",
    ),
    (
        lambda: eqxopt.LinearOneCycle(100, 1.0, 1.5),
        ValueError,
        r"pct_start must be in \[0.0, 1.0\]",
    ),
    (
        lambda: eqxopt.CosineOneCycle(100, 1.0, div_factor=0.0),
        ValueError,
        r"div_factor must be in \(0.0",
    ),
    (
        lambda: eqxopt.CosineOneCycle(100, 1.0, final_div_factor=-2.0),
        ValueError,
        "final_div_factor must be in",
    ),
    (lambda: eqxopt.SGDR([]), ValueError, "cycles must hold at least one cycle"),
    (
        lambda: eqxopt.SGDR(dict(peak_value=1.0, decay_steps=10)),
        TypeError,
        "cycles must be a list of dicts",
    ),
    (
        lambda: eqxopt.SGDR([dict(peak_value=1.0)]),
        ValueError,
        r"cycles\[0\] needs the key 'decay_steps'",
    ),
    (
        lambda: eqxopt.SGDR([dict(peak_value=1.0, decay_steps=10, alpha=0.1)]),
        ValueError,
        r"cycles\[0\] has unknown keys \['alpha'\]",
    ),
    (
        lambda: eqxopt.SGDR(
            [
                dict(peak_value=1.0, decay_steps=10),
                dict(peak_value=1.0, decay_steps=5, warmup_steps=5),
            ]
        ),
        ValueError,
        r"cycles\[1\]\['decay_steps'\] must be > cycles\[1\]\['warmup_steps'\]",
    ),
    (
        lambda: eqxopt.SGDR([dict(peak_value=-1.0, decay_steps=10)]),
        ValueError,
        r"cycles\[0\]\['peak_value'\] must be in",
    ),
    (
        lambda: eqxopt.Join([], []),
        ValueError,
        "schedules must hold at least one schedule",
    ),
    (
        lambda: eqxopt.Join([eqxopt.Constant(1.0), 0.5], [3]),
        TypeError,
        r"schedules\[1\] must be an eqxopt schedule module",
    ),
    (
        lambda: eqxopt.Join([eqxopt.Constant(1.0)] * 3, [3]),
        ValueError,
        r"boundaries must have len\(schedules\) - 1 = 2 entries, got 1",
    ),
    (
        lambda: eqxopt.Join([eqxopt.Constant(1.0)] * 3, [5, 3]),
        ValueError,
        r"boundaries must be sorted, got \[5, 3\]",
    ),
    (
        lambda: eqxopt.Join([eqxopt.Constant(1.0)] * 2, 3),
        TypeError,
        "boundaries must be a sequence of integer steps",
    ),
    (lambda: eqxopt.StepDecay(1.0, 0), ValueError, "step_size must be >= 1"),
    (
        lambda: eqxopt.StepDecay(1.0, 10, gamma=0.0),
        ValueError,
        r"gamma must be in \(0.0",
    ),
    (
        lambda: eqxopt.MultiStepDecay(1.0, [30, 10]),
        ValueError,
        "milestones must be sorted",
    ),
    (
        lambda: eqxopt.MultiStepDecay(1.0, [10, -1]),
        ValueError,
        r"milestones\[1\] must be >= 0",
    ),
    (lambda: eqxopt.Cyclic(0.1, 1.0, 0), ValueError, "step_size_up must be >= 1"),
    (
        lambda: eqxopt.Cyclic(0.1, 1.0, 10, -1),
        ValueError,
        "step_size_down must be >= 0",
    ),
    (
        lambda: eqxopt.Cyclic(0.1, 1.0, 10, mode="sine"),
        ValueError,
        "mode must be one of 'triangular', 'triangular2', 'exp_range'",
    ),
    (
        lambda: eqxopt.Cyclic(0.1, 1.0, 10, gamma=1.5),
        ValueError,
        r"gamma must be in \(0.0, 1.0\]",
    ),
    (
        lambda: eqxopt.WarmupStableDecay(
            1.0, 10, 100, decay_steps=20, decay_fraction=0.2
        ),
        ValueError,
        "give decay_steps or decay_fraction, not both",
    ),
    (
        lambda: eqxopt.WarmupStableDecay(1.0, 90, 100, decay_steps=20),
        ValueError,
        "warmup_steps \\+ decay_steps must be <= total_steps",
    ),
    (
        lambda: eqxopt.WarmupStableDecay(1.0, 10, 100, decay_fraction=0.0),
        ValueError,
        r"decay_fraction must be in \(0.0, 1.0\]",
    ),
    (
        lambda: eqxopt.WarmupStableDecay(1.0, 0, 10, decay_fraction=0.01),
        ValueError,
        "decay_fraction \\* total_steps must round to at least one step",
    ),
    (
        lambda: eqxopt.WarmupStableDecay(1.0, 10, 100, decay_steps=0),
        ValueError,
        "decay_steps must be >= 1",
    ),
    (
        lambda: eqxopt.WarmupStableDecay(1.0, 10, 100, decay_shape="exp"),
        ValueError,
        "decay_shape must be one of 'linear', 'cosine', '1-sqrt'",
    ),
    (
        lambda: eqxopt.WarmupStableDecay(1.0, 10, 100, end_value=-0.1),
        ValueError,
        "end_value must be in",
    ),
    (
        lambda: eqxopt.SWALR(1.0, 0.1, 10, "cosine"),
        ValueError,
        "anneal_strategy must be one of",
    ),
    (lambda: eqxopt.SWALR(1.0, 0.1, -1), ValueError, "anneal_steps must be >= 0"),
    (
        lambda: eqxopt.Lambda(0.1, 0.5),
        TypeError,
        "lr_lambda must be a function of the step",
    ),
    (
        lambda: eqxopt.Lambda(0.1, eqxopt.Constant(0.5)),
        TypeError,
        "lr_lambda must be a function of the step",
    ),
    (lambda: eqxopt.Lambda(-0.1, inverse_time), ValueError, "init_value must be in"),
    (
        lambda: eqxopt.Product(0.1, []),
        ValueError,
        "factors must hold at least one schedule",
    ),
    (
        lambda: eqxopt.Product(0.1, [0.5]),
        TypeError,
        r"factors\[0\] must be an eqxopt schedule module",
    ),
    (
        lambda: eqxopt.OneCycleMomentum(100, pct_start=1.5),
        ValueError,
        r"pct_start must be in \[0.0, 1.0\]",
    ),
    (lambda: eqxopt.OneCycleMomentum(0), ValueError, "total_steps must be >= 1"),
    (lambda: eqxopt.SWALR(1.0, -0.1), ValueError, r"swa_lr must be in \[0.0"),
    (
        lambda: eqxopt.SGD(learning_rate=lambda s: 0.1),
        TypeError,
        "Wrap plain functions of the step",
    ),
]


@pytest.mark.parametrize("make,error,match", ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_constructor_errors_name_the_argument(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_calling_with_a_float_step_is_rejected():
    with pytest.raises(Exception, match="step"):
        eqxopt.Linear(1.0, 0.0, 10)(jnp.float32(3.0))


def test_plot_schedules_writes_pngs(tmp_path):
    schedules = {
        "warmup-cosine": eqxopt.WarmupCosine(1.0, 0.1, 10, 100),
        "wsd": eqxopt.WarmupStableDecay(1.0, 10, 100, decay_shape="1-sqrt"),
    }
    overlay = eqxopt.plot_schedules(schedules, tmp_path / "overlay.png", 120, title="t")
    grid = eqxopt.plot_schedules(
        list(schedules.values()),
        str(tmp_path / "grid.png"),
        np.arange(0, 120, 3),
        columns=3,
        log_scale=True,
    )
    single = eqxopt.plot_schedules(
        eqxopt.Cyclic(0.1, 1.0, 10), tmp_path / "one.png", 50, dpi=50
    )
    for path in (overlay, grid, single):
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(data) > 1000


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(schedules=[]), ValueError, "schedules must hold at least one schedule"),
        (dict(schedules={"a": 0.1}), TypeError, r"schedules\['a'\] must be an eqxopt"),
        (dict(schedules=0.1), TypeError, "schedules must be a schedule, a list"),
        (dict(steps=0), ValueError, "steps must be >= 1, got 0"),
        (dict(steps=np.linspace(0, 1, 5)), ValueError, "integer steps"),
        (dict(columns=0), ValueError, "columns must be None or an int >= 1"),
    ],
)
def test_plot_schedules_errors(tmp_path, kwargs, error, match):
    args = dict(schedules=eqxopt.Constant(1.0), path=tmp_path / "x.png", steps=10)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        eqxopt.plot_schedules(**args)


def test_plot_schedules_without_matplotlib_says_how_to_install_it(
    tmp_path, monkeypatch
):
    """eqxopt is on no package index: the message gives the install from a checkout
    (as README does), not `pip install "eqxopt[plot]"`."""
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
    with pytest.raises(ImportError, match=r"pip install \"\.\[plot\]\"` in a checkout"):
        eqxopt.plot_schedules(eqxopt.Constant(1.0), tmp_path / "x.png", 10)
    assert not (tmp_path / "x.png").exists()
    assert 'pip install ".[plot]"' in (eqxopt.plot_schedules.__doc__ or "")
    assert "eqxopt[plot]" not in (eqxopt.plot_schedules.__doc__ or "")


def test_gallery_script_builds_every_schedule():
    module = load_script("docs/make_gallery.py")
    schedules = module.gallery()
    public = {
        name
        for name in dir(eqxopt)
        if isinstance(getattr(eqxopt, name), type)
        and issubclass(getattr(eqxopt, name), eqxopt.AbstractSchedule)
        and name != "AbstractSchedule"
    }
    assert {type(s).__name__ for s in schedules.values()} == public
    outputs = evaluate_many(list(schedules.values()), jnp.arange(1000))
    for label, values in zip(schedules, outputs):
        values = np.asarray(values)
        assert np.all((values >= 0) & (values <= 1.0 + 1e-6)), label


# --------------------------------------------------------------------------------------
# Random configurations against optax (eager reference, 600 steps). eqxopt compiles
# once per structure: every example below reuses the compiled `evaluate`.
# --------------------------------------------------------------------------------------

SHORT = jnp.arange(600, dtype=jnp.int32)
# Zero or a realistic magnitude: values near float32's smallest normal (1e-38) flush
# to zero in one library's intermediate and not the other's.
value = (st.just(0.0) | st.floats(1e-4, 2.0)).map(f32)
count = st.integers(1, 400)
begin = st.integers(0, 200)
random_settings = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def assert_matches_optax(ours, optax_schedule):
    with jax.numpy_dtype_promotion("standard"):  # optax promotes implicitly
        expected = np.asarray(jax.vmap(optax_schedule)(SHORT))
    assert_close(evaluate(ours, SHORT), expected)


def arr(x):
    """optax gets its numbers as arrays here: eager JAX inlines Python scalars into
    each primitive's kernel, so every new example would compile new kernels; arrays
    reuse them. (Integer step counts as Python ints also become constants that XLA
    divides by via their reciprocal: `1 - c / T` can be 6e-8 instead of 0 at the end,
    which a power of 0.5 turns into 2.4e-4.)"""
    return jnp.asarray(x, jnp.int32 if isinstance(x, int) else jnp.float32)


@random_settings
@given(value, value, st.floats(0.25, 3.0).map(f32), count, begin)
def test_random_polynomial_matches_optax(init, end, power, steps, start):
    ours = evaluate(eqxopt.Polynomial(init, end, power, steps, start), SHORT)
    theirs = optax.polynomial_schedule(*map(arr, (init, end, power, steps, start)))
    expected = np.asarray(jax.vmap(theirs)(SHORT), np.float64)
    # From the end of the transition on the value is `end` exactly. optax's float32
    # fraction `1 - count / steps` can stop at 6e-8 instead of 0 there (hypothesis
    # found init=0, end=1, power=0.5, steps=47: optax ends at 0.99975586).
    done = np.asarray(SHORT) >= start + steps
    np.testing.assert_array_equal(np.asarray(ours)[done], np.float32(end))
    assert_close(ours, np.where(done, np.float64(np.float32(end)), expected))
    assert_matches_optax(
        eqxopt.Linear(init, end, steps, start),
        optax.linear_schedule(*map(arr, (init, end, steps, start))),
    )


@random_settings
@given(
    value,
    st.integers(1, 200),
    st.floats(0.5, 1.5).map(f32),
    st.integers(0, 100),
    st.booleans(),
    st.none() | value,
)
def test_random_exponential_decay_matches_optax(init, steps, rate, start, stairs, end):
    ours = eqxopt.ExponentialDecay(init, steps, rate, start, stairs, end)
    reference = optax.exponential_decay(
        *map(arr, (init, steps, rate, start)),
        staircase=stairs,
        end_value=None if end is None else arr(end),
    )
    expected = np.asarray(jax.vmap(reference)(SHORT), np.float64)
    if init == 0.0:
        # optax gives 0 * inf = NaN once a growing rate overflows; zero stays zero here
        # (then clamped by the end value as every other value is).
        zero = 0.0 if end is None else (max(0.0, end) if rate < 1 else min(0.0, end))
        expected = np.where(np.isnan(expected), zero, expected)
    # A growth without an end value that overflows float32 within the range is inf in
    # both libraries; compare where the schedule is representable.
    assume(bool(np.all(np.isfinite(expected))))
    assert_close(evaluate(ours, SHORT), expected)


def test_exponential_growth_from_zero_stays_zero():
    schedule = eqxopt.ExponentialDecay(0.0, 1, 1.5)
    assert np.all(np.asarray(schedule(jnp.array([0, 10, 300, 2**31 - 1]))) == 0.0)


@random_settings
@given(
    value,
    st.integers(1, 600),
    st.floats(0.0, 1.0).map(f32),
    st.floats(0.5, 3.0).map(f32),
)
def test_random_cosine_decay_matches_optax(init, steps, alpha, exponent):
    assert_matches_optax(
        eqxopt.CosineDecay(init, steps, alpha, exponent),
        optax.cosine_decay_schedule(*map(arr, (init, steps, alpha, exponent))),
    )


@random_settings
@given(value, st.floats(0.0, 1.0), st.integers(0, 300), st.integers(1, 400))
def test_random_warmup_cosine_matches_optax(peak, floor_fraction, warmup, length):
    floor = f32(peak * floor_fraction)
    total = warmup + length
    assert_matches_optax(
        eqxopt.WarmupCosine(peak, floor, warmup, total),
        optax.warmup_cosine_decay_schedule(
            *map(arr, (0.0, peak, warmup, total, floor))
        ),
    )


@random_settings
@given(
    st.sampled_from(["linear", "cosine"]),
    value,
    st.dictionaries(
        st.integers(0, 600), st.floats(0.0, 4.0).map(f32), min_size=3, max_size=3
    ),
)
def test_random_piecewise_schedules_match_optax(kind, init, scales):
    array_scales = {k: arr(v) for k, v in scales.items()}
    assert_matches_optax(
        eqxopt.PiecewiseInterpolate(kind, init, scales),
        optax.piecewise_interpolate_schedule(kind, arr(init), array_scales),
    )
    assert_matches_optax(
        eqxopt.PiecewiseConstant(init, scales),
        optax.piecewise_constant_schedule(arr(init), array_scales),
    )


@random_settings
@given(
    st.integers(10, 600),
    value,
    st.floats(0.05, 0.45),
    st.floats(0.55, 1.0),
    st.floats(1.0, 50.0).map(f32),
    st.floats(1.0, 1e4).map(f32),
)
def test_random_one_cycles_match_optax(steps, peak, start, final, div, final_div):
    # Distinct phase ends: optax builds a dict keyed by them, so equal ends would
    # merge (a degenerate case where the two libraries differ; see the docstring).
    # The fractions stay Python floats on both sides: the phase ends are
    # int(pct * steps) in float64, which `0.9` in float32 would round one step lower.
    assume(len({int(start * steps), int(final * steps), steps}) == 3)
    assert_matches_optax(
        eqxopt.LinearOneCycle(steps, peak, start, final, div, final_div),
        optax.linear_onecycle_schedule(
            steps, arr(peak), start, final, arr(div), arr(final_div)
        ),
    )
    assert_matches_optax(
        eqxopt.CosineOneCycle(steps, peak, start, div, final_div),
        optax.cosine_onecycle_schedule(
            steps, arr(peak), start, arr(div), arr(final_div)
        ),
    )


def test_one_cycle_phase_ends_use_the_fraction_as_given():
    # int(0.9 * 10) == 9, but int(float32(0.9) * 10) == 8.
    assert int(eqxopt.LinearOneCycle(10, 1.0, 0.3, 0.9).final_step) == 9
    assert int(eqxopt.CosineOneCycle(10, 1.0, 0.7).start_step) == 7
    assert (
        int(eqxopt.WarmupStableDecay(1.0, 0, 10, decay_fraction=0.9).decay_steps) == 9
    )


# --------------------------------------------------------------------------------------
# Schedules as plain functions, and step counts beyond int32.
# --------------------------------------------------------------------------------------


@cases
def test_jax_jit_takes_a_schedule_as_the_function(case):
    """optax schedules are plain functions users `jax.jit`; so are these (a
    schedule hashes by identity, as a function does)."""
    jitted = jax.jit(case.schedule)
    expected = np.asarray(evaluate(case.schedule, STEPS))
    # Its values are constants to XLA here, which divides by a constant via its
    # reciprocal (as under `jax.jit` of optax's schedules, see `optax_values`):
    # power 0.5 turns that rounding into 1.6e-4 at the end.
    atol = 2e-4 if case.name == "Polynomial-0.5" else 1e-6
    np.testing.assert_allclose(jitted(STEPS), expected, rtol=1e-5, atol=atol)
    for step in (0, 300, 3000):
        np.testing.assert_allclose(
            jitted(jnp.int32(step)), expected[step], rtol=1e-5, atol=atol
        )
    assert hash(case.schedule) == hash(case.schedule)
    copy = jax.tree.map(lambda x: x, case.schedule)  # equal values, another object
    assert hash(copy) != hash(case.schedule)
    assert bool(copy == case.schedule)


BIG = 10**10
# Steps across the whole int32 range, the last ones included (the step counter
# saturates at 2**31 - 1).
INT32_STEPS = jnp.asarray(
    [0, 1, 99, 100, 101, 5000, 2**20, 2**24 + 1, 2**30, 2**31 - 2, 2**31 - 1],
    jnp.int32,
)


def _optax_onecycle(kind, total, peak, points):
    return optax.piecewise_interpolate_schedule(
        kind, peak / 25.0, {float(b): s for b, s in points(total)}
    )


def _formula(fn):
    """Marks a float64 NumPy reference (called on all steps at once)."""
    fn.formula = True
    return fn


def _np_cyclic(s, base, peak, up, down):
    s = s.astype(np.float64)
    r = np.mod(s, up + down)
    height = np.where(r <= up, r / up, (up + down - r) / down)
    return base + (peak - base) * height


# (name, eqxopt schedule with a step count beyond int32, the reference at
# INT32_STEPS). optax takes such counts as Python floats (its cosine schedules
# convert ints to floats themselves; its others overflow on a huge int);
# torch-only schedules get a float64 formula.
HUGE = [
    (
        "CosineDecay",
        lambda: eqxopt.CosineDecay(0.4, BIG, alpha=0.05),
        lambda: optax.cosine_decay_schedule(0.4, BIG, 0.05),
    ),
    (
        "WarmupCosine",
        lambda: eqxopt.WarmupCosine(0.5, 0.05, 100, 2**40),
        lambda: optax.warmup_cosine_decay_schedule(0.0, 0.5, 100, 2**40, 0.05),
    ),
    (
        "Polynomial",
        lambda: eqxopt.Polynomial(1.0, 0.001, 2.0, BIG, 100),
        lambda: optax.polynomial_schedule(1.0, 0.001, 2.0, float(BIG), 100),
    ),
    (
        "Polynomial-begin",
        lambda: eqxopt.Polynomial(1.0, 0.001, 2.0, 1000, 2**35),
        lambda: optax.polynomial_schedule(1.0, 0.001, 2.0, 1000, float(2**35)),
    ),
    (
        "Linear",
        lambda: eqxopt.Linear(0.5, 0.01, BIG, transition_begin=100),
        lambda: optax.linear_schedule(0.5, 0.01, float(BIG), 100),
    ),
    (
        "ExponentialDecay",
        lambda: eqxopt.ExponentialDecay(1.0, BIG, 0.01, end_value=0.5),
        lambda: optax.exponential_decay(1.0, float(BIG), 0.01, 0, False, 0.5),
    ),
    (
        "ExponentialDecay-begin-staircase",
        lambda: eqxopt.ExponentialDecay(1.0, 100, 0.5, 2**33, staircase=True),
        lambda: optax.exponential_decay(1.0, 100, 0.5, float(2**33), True),
    ),
    (
        "PiecewiseConstant",
        lambda: eqxopt.PiecewiseConstant(0.1, {100: 0.5, 2**35: 0.1}),
        lambda: optax.piecewise_constant_schedule(0.1, {100: 0.5, float(2**35): 0.1}),
    ),
    (
        "WarmupConstant",
        lambda: eqxopt.WarmupConstant(0.01, 0.5, 2**40),
        lambda: optax.warmup_constant_schedule(0.01, 0.5, float(2**40)),
    ),
    (
        "WarmupExponentialDecay",
        lambda: eqxopt.WarmupExponentialDecay(0.0, 1.0, 100, BIG, 0.5, 2**32),
        lambda: optax.warmup_exponential_decay_schedule(
            0.0, 1.0, 100, float(BIG), 0.5, float(2**32)
        ),
    ),
    (
        "PiecewiseInterpolate",
        lambda: eqxopt.PiecewiseInterpolate("cosine", 1.0, {100: 0.5, 2**35: 0.1}),
        lambda: optax.piecewise_interpolate_schedule(
            "cosine", 1.0, {100: 0.5, float(2**35): 0.1}
        ),
    ),
    (
        "LinearOneCycle",
        lambda: eqxopt.LinearOneCycle(2**40, 1.0),
        lambda: _optax_onecycle(
            "linear",
            2**40,
            1.0,
            lambda t: [(int(0.3 * t), 25.0), (int(0.85 * t), 1 / 25.0), (t, 1e-4)],
        ),
    ),
    (
        "CosineOneCycle",
        lambda: eqxopt.CosineOneCycle(2**40, 1.0),
        lambda: _optax_onecycle(
            "cosine", 2**40, 1.0, lambda t: [(int(0.3 * t), 25.0), (t, 1 / 25e4)]
        ),
    ),
    (
        "SGDR",
        lambda: eqxopt.SGDR(
            [
                dict(peak_value=1.0, warmup_steps=10, decay_steps=1000),
                dict(peak_value=0.5, decay_steps=2**40, end_value=0.1),
            ]
        ),
        lambda: optax.sgdr_schedule(
            [
                dict(init_value=0.0, peak_value=1.0, warmup_steps=10, decay_steps=1000),
                dict(
                    init_value=0.0,
                    peak_value=0.5,
                    warmup_steps=0,
                    decay_steps=float(2**40),
                    end_value=0.1,
                ),
            ]
        ),
    ),
    (
        "Join",
        lambda: eqxopt.Join(
            [eqxopt.Constant(1.0), eqxopt.Linear(1.0, 0.0, 10)], [2**40]
        ),
        lambda: optax.join_schedules(
            [optax.constant_schedule(1.0), optax.linear_schedule(1.0, 0.0, 10)],
            [float(2**40)],
        ),
    ),
    (
        "StepDecay",
        lambda: eqxopt.StepDecay(1.0, 2**40, gamma=0.5),
        lambda: _formula(lambda s: np.ones_like(s)),
    ),
    (
        "MultiStepDecay",
        lambda: eqxopt.MultiStepDecay(1.0, [100, 2**40], gamma=0.5),
        lambda: _formula(lambda s: np.where(s >= 100, 0.5, 1.0)),
    ),
    (
        "Cyclic",
        lambda: eqxopt.Cyclic(
            0.1, 1.0, step_size_up=2**31 - 2**20, step_size_down=2**40
        ),
        lambda: _formula(
            lambda s: _np_cyclic(s, f32(0.1), f32(1.0), f32(2**31 - 2**20), 2.0**40)
        ),
    ),
    (
        "OneCycleMomentum",
        lambda: eqxopt.OneCycleMomentum(2**40, 0.8, 0.9, 0.5, "linear"),
        lambda: _formula(
            lambda s: np_one_cycle_momentum(s, 2.0**40, f32(0.8), f32(0.9), 0.5, False)
        ),
    ),
    (
        "Product",
        lambda: eqxopt.Product(2.0, [eqxopt.CosineDecay(0.5, BIG, alpha=0.05)]),
        lambda: optax.cosine_decay_schedule(1.0, BIG, 0.05),
    ),
    (
        "SWALR",
        lambda: eqxopt.SWALR(1.0, 0.1, 2**40, "linear"),
        lambda: _formula(lambda s: np_swalr(s, 1.0, 0.1, 2**40, "linear")),
    ),
    (
        "WarmupStableDecay",
        lambda: eqxopt.WarmupStableDecay(0.5, 100, 2**40, decay_fraction=0.5),
        lambda: _formula(
            lambda s: np_wsd(s, 0.5, 100, 2**40, 2**39, 0.0, 0.0, "linear")
        ),
    ),
]


@pytest.mark.parametrize("name,make,reference", HUGE, ids=[h[0] for h in HUGE])
def test_step_counts_beyond_int32_match_the_reference(name, make, reference):
    """Any step count a user can write is accepted (optax takes them), and every
    int32 step gets the reference's value, the last ones included."""
    schedule = make()
    ref = reference()
    steps = np.asarray(INT32_STEPS)
    if getattr(ref, "formula", False):
        expected = ref(steps.astype(np.float64))
    else:  # optax, step by step, as its users call it
        with jax.numpy_dtype_promotion("standard"):  # optax promotes implicitly
            expected = np.asarray([float(ref(jnp.int32(s))) for s in steps])
    for values in (evaluate(schedule, INT32_STEPS), jax.jit(schedule)(INT32_STEPS)):
        values = np.asarray(values)
        assert values.dtype == np.float32 and np.all(np.isfinite(values))
        np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-7)


def test_huge_step_counts_work_in_every_schedule_class():
    public = {
        name
        for name in dir(eqxopt)
        if isinstance(getattr(eqxopt, name), type)
        and issubclass(getattr(eqxopt, name), eqxopt.AbstractSchedule)
        and getattr(eqxopt, name) is not eqxopt.AbstractSchedule
    }
    covered = {type(make()).__name__ for _, make, _ in HUGE}
    assert public - covered == {"Constant", "Lambda"}  # no step count


def test_counts_beyond_int32_compare_exactly_with_int32_steps():
    """A count just past int32 is never rounded down onto an int32 step (float32
    rounds 2**31 + 1 to 2**31, which the last steps would reach)."""
    last = jnp.int32(2**31 - 1)
    assert float(eqxopt.WarmupConstant(0.0, 1.0, 2**31 + 1)(last)) < 1.0
    assert float(eqxopt.PiecewiseConstant(1.0, {2**31: 0.5})(last)) == 1.0
    assert float(eqxopt.MultiStepDecay(1.0, [2**31], 0.5)(last)) == 1.0
    join = eqxopt.Join([eqxopt.Constant(1.0), eqxopt.Constant(2.0)], [2**31])
    assert float(join(last)) == 1.0
    # Counts that fit stay int32 and exact.
    assert eqxopt.CosineDecay(1.0, 2**31 - 1).decay_steps.dtype == jnp.int32
    assert float(eqxopt.PiecewiseConstant(1.0, {2**31 - 1: 0.5})(last)) == 0.5
    # Any size, as optax: beyond float32's range too.
    assert float(eqxopt.CosineDecay(1.0, 10**100)(last)) == 1.0


# Each schedule with every float argument it takes (built from keywords).
SCHEDULE_FLOATS = [
    (eqxopt.Constant, dict(value=0.1), ["value"]),
    (
        eqxopt.WarmupCosine,
        dict(peak_lr=1.0, min_lr=0.1, warmup_steps=10, total_steps=100),
        ["peak_lr", "min_lr"],
    ),
    (
        eqxopt.Polynomial,
        dict(init_value=1.0, end_value=0.1, power=2.0, transition_steps=10),
        ["init_value", "end_value", "power"],
    ),
    (
        eqxopt.Linear,
        dict(init_value=1.0, end_value=0.1, transition_steps=10),
        ["init_value", "end_value"],
    ),
    (eqxopt.PiecewiseConstant, dict(init_value=1.0), ["init_value"]),
    (
        eqxopt.ExponentialDecay,
        dict(init_value=1.0, transition_steps=10, decay_rate=0.5, end_value=0.1),
        ["init_value", "decay_rate", "end_value"],
    ),
    (
        eqxopt.CosineDecay,
        dict(init_value=1.0, decay_steps=10, alpha=0.1, exponent=1.0),
        ["init_value", "alpha", "exponent"],
    ),
    (
        eqxopt.WarmupConstant,
        dict(init_value=0.0, peak_value=1.0, warmup_steps=10),
        ["init_value", "peak_value"],
    ),
    (
        eqxopt.WarmupExponentialDecay,
        dict(
            init_value=0.0,
            peak_value=1.0,
            warmup_steps=10,
            transition_steps=10,
            decay_rate=0.5,
            end_value=0.1,
        ),
        ["init_value", "peak_value", "decay_rate", "end_value"],
    ),
    (
        eqxopt.PiecewiseInterpolate,
        dict(interpolate_type="linear", init_value=1.0),
        ["init_value"],
    ),
    (
        eqxopt.LinearOneCycle,
        dict(transition_steps=100, peak_value=1.0),
        ["peak_value", "pct_start", "pct_final", "div_factor", "final_div_factor"],
    ),
    (
        eqxopt.CosineOneCycle,
        dict(transition_steps=100, peak_value=1.0),
        ["peak_value", "pct_start", "div_factor", "final_div_factor"],
    ),
    (eqxopt.StepDecay, dict(init_value=1.0, step_size=10), ["init_value", "gamma"]),
    (
        eqxopt.MultiStepDecay,
        dict(init_value=1.0, milestones=[10]),
        ["init_value", "gamma"],
    ),
    (eqxopt.Cyclic, dict(base_lr=0.1, max_lr=1.0), ["base_lr", "max_lr", "gamma"]),
    (eqxopt.SWALR, dict(init_value=1.0, swa_lr=0.1), ["init_value", "swa_lr"]),
    (eqxopt.Lambda, dict(lr_lambda=inverse_time), ["init_value"]),
    (eqxopt.Product, dict(factors=[eqxopt.Constant(1.0)]), ["init_value"]),
    (
        eqxopt.OneCycleMomentum,
        dict(total_steps=100),
        ["base_momentum", "max_momentum", "pct_start"],
    ),
    (
        eqxopt.WarmupStableDecay,
        dict(peak_value=1.0, warmup_steps=10, total_steps=100),
        ["peak_value", "init_value", "end_value", "decay_fraction"],
    ),
]
NON_FINITE = [
    (cls, base, name) for cls, base, names in SCHEDULE_FLOATS for name in names
] + [
    (eqxopt.PiecewiseConstant, dict(init_value=1.0), "boundaries_and_scales[10]"),
    (
        eqxopt.PiecewiseInterpolate,
        dict(interpolate_type="linear", init_value=1.0),
        "boundaries_and_scales[10]",
    ),
    (eqxopt.SGDR, {}, "cycles[0]['peak_value']"),
    (eqxopt.SGDR, {}, "cycles[0]['exponent']"),
]


@pytest.mark.parametrize(
    "cls,base,name", NON_FINITE, ids=[f"{c.__name__}-{n}" for c, _, n in NON_FINITE]
)
def test_non_finite_float_arguments_raise_naming_them(cls, base, name):
    """inf, and 1e40 (inf once stored as float32), are a ValueError naming the
    argument, for every float argument of every schedule."""
    for bad in (math.inf, 1e40):
        if name.startswith("boundaries_and_scales"):
            kwargs = {**base, "boundaries_and_scales": {10: bad}}
        elif name.startswith("cycles"):
            key = name.split("'")[1]
            kwargs = {"cycles": [{"peak_value": 1.0, "decay_steps": 10, key: bad}]}
        else:
            kwargs = {**base, name: bad}
        with pytest.raises(ValueError, match=re.escape(name)):
            cls(**kwargs)
    covered = {c for c, _, _ in NON_FINITE}
    assert len(covered) == len(ONE_PER_CLASS) - 1  # all but Join (no float)


INT32_MAX = np.iinfo(np.int32).max


@cases
def test_finite_at_the_saturated_step(case):
    # Optimizers' step counters saturate at the int32 maximum; a schedule must give
    # a finite value there (and just before), with no int32 arithmetic that wraps.
    steps = jnp.asarray([INT32_MAX - 1, INT32_MAX], jnp.int32)
    values = np.asarray(evaluate(case.schedule, steps))
    assert np.all(np.isfinite(values)), values
    assert np.isfinite(float(case.schedule(jnp.int32(INT32_MAX))))


# Every schedule's constructor, as users call it: argument names, order, defaults
# and keyword-only-ness (fields and converters build most of them).
SIGNATURES = {
    "Constant": "value",
    "WarmupCosine": "peak_lr, min_lr, warmup_steps, total_steps",
    "Polynomial": (
        "init_value, end_value, power, transition_steps, transition_begin=0"
    ),
    "Linear": "init_value, end_value, transition_steps, transition_begin=0",
    "PiecewiseConstant": "init_value, boundaries_and_scales=None",
    "ExponentialDecay": (
        "init_value, transition_steps, decay_rate, transition_begin=0, "
        "staircase=False, end_value=None"
    ),
    "CosineDecay": "init_value, decay_steps, alpha=0.0, exponent=1.0",
    "WarmupConstant": "init_value, peak_value, warmup_steps",
    "WarmupExponentialDecay": (
        "init_value, peak_value, warmup_steps, transition_steps, decay_rate, "
        "transition_begin=0, staircase=False, end_value=None"
    ),
    "PiecewiseInterpolate": (
        "interpolate_type, init_value, boundaries_and_scales=None"
    ),
    "LinearOneCycle": (
        "transition_steps, peak_value, pct_start=0.3, pct_final=0.85, "
        "div_factor=25.0, final_div_factor=10000.0"
    ),
    "CosineOneCycle": (
        "transition_steps, peak_value, pct_start=0.3, div_factor=25.0, "
        "final_div_factor=10000.0"
    ),
    "SGDR": "cycles",
    "Join": "schedules, boundaries",
    "StepDecay": "init_value, step_size, gamma=0.1",
    "MultiStepDecay": "init_value, milestones, gamma=0.1",
    "Cyclic": (
        "base_lr, max_lr, step_size_up=2000, step_size_down=None, "
        "mode='triangular', gamma=1.0"
    ),
    "SWALR": "init_value, swa_lr, anneal_steps=10, anneal_strategy='cos'",
    "Lambda": "init_value, lr_lambda",
    "Product": "init_value, factors",
    "OneCycleMomentum": (
        "total_steps, base_momentum=0.85, max_momentum=0.95, pct_start=0.3, "
        "anneal_strategy='cos', three_phase=False"
    ),
    "WarmupStableDecay": (
        "peak_value, warmup_steps, total_steps, *, decay_steps=None, "
        "decay_fraction=None, init_value=0.0, end_value=0.0, decay_shape='linear'"
    ),
}


def _arguments(cls: type) -> str:
    parts = []
    for p in inspect.signature(cls).parameters.values():
        if p.kind is p.KEYWORD_ONLY and "*" not in parts:
            parts.append("*")
        empty = p.default is inspect.Parameter.empty
        parts.append(p.name if empty else f"{p.name}={p.default!r}")
    return ", ".join(parts)


def test_constructor_signatures():
    public = {
        name
        for name in eqxopt.__all__
        if isinstance(getattr(eqxopt, name), type)
        and issubclass(getattr(eqxopt, name), eqxopt.AbstractSchedule)
        and name != "AbstractSchedule"
    }
    assert public == set(SIGNATURES)
    for name, expected in SIGNATURES.items():
        assert _arguments(getattr(eqxopt, name)) == expected, name


@pytest.mark.parametrize(
    "make,name",
    [
        (lambda c: eqxopt.Linear(c, 0.0, 10), "init_value"),
        (lambda c: eqxopt.WarmupCosine(c, 0.0, 1, 10), "peak_lr"),
        (lambda c: eqxopt.ExponentialDecay(1.0, 10, c), "decay_rate"),
        (lambda c: eqxopt.ExponentialDecay(1.0, 10, 0.5, end_value=c), "end_value"),
        (
            lambda c: eqxopt.PiecewiseConstant(1.0, {5: c}),
            r"boundaries_and_scales\[5\]",
        ),
        (lambda c: eqxopt.Cyclic(0.1, 1.0, 10, gamma=c), "gamma"),
        (lambda c: eqxopt.LinearOneCycle(10, 1.0, pct_start=c), "pct_start"),
        (lambda c: eqxopt.SGDR([dict(peak_value=c, decay_steps=5)]), "peak_value"),
    ],
)
def test_a_schedules_values_are_numbers_not_schedules(make, name):
    """A schedule is built from numbers: a schedule given as one of its values is a
    TypeError naming the argument (it would be called nowhere)."""
    with pytest.raises(TypeError, match=f"{name}.* must be a float or a scalar array"):
        make(eqxopt.Constant(0.5))


def test_checks_between_values_skip_traced_values():
    """Checks that compare two arguments (`min_lr <= peak_lr`, `decay_steps >
    warmup_steps`, ...) run when both are known and let traced values through."""

    @jax.jit
    def build_and_call(peak, floor, steps):
        return (
            eqxopt.WarmupCosine(peak, floor, 2, 10)(steps),
            eqxopt.SGDR([dict(peak_value=peak, decay_steps=6, end_value=floor)])(steps),
            eqxopt.Cyclic(floor, peak, 3)(steps),
        )

    steps = jnp.arange(12, dtype=jnp.int32)
    concrete = [
        eqxopt.WarmupCosine(0.8, 0.1, 2, 10),
        eqxopt.SGDR([dict(peak_value=0.8, decay_steps=6, end_value=0.1)]),
        eqxopt.Cyclic(0.1, 0.8, 3),
    ]
    traced = build_and_call(jnp.float32(0.8), jnp.float32(0.1), steps)
    for got, want in zip(traced, evaluate_many(concrete, steps)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    with pytest.raises(ValueError, match="min_lr must be <= peak_lr"):
        eqxopt.WarmupCosine(0.1, 0.8, 2, 10)


# ---------------------------------------------------------------------------------
# Ranges: each schedule knows, at construction, the least and the greatest value it
# takes (`value_range`), and an optimizer's field checks them against its bounds.


def _dense_range(schedule):
    """The least and the greatest value over steps 0 to 3000 and the last two."""
    steps = jnp.concatenate([STEPS, jnp.asarray([INT32_MAX - 1, INT32_MAX], jnp.int32)])
    values = np.asarray(evaluate(schedule, steps), np.float64)
    return float(values.min()), float(values.max())


@cases
def test_value_range_is_the_least_and_greatest_value(case):
    known = case.schedule.value_range()
    if isinstance(case.schedule, eqxopt.Lambda):
        assert known is None  # a function of the user's
        return
    assert known == _dense_range(case.schedule)


@pytest.mark.parametrize(
    "schedule",
    [
        # A peak inside a rise ((s / up) * gamma**s), and cycles without a fall.
        eqxopt.Cyclic(0.2, 1.0, 400, mode="exp_range", gamma=0.99),
        eqxopt.Cyclic(1.0, 0.2, 400, 100, mode="exp_range", gamma=0.995),
        eqxopt.Cyclic(0.1, 0.9, 7, 0),
        eqxopt.Cyclic(0.1, 0.9, 5, 3, mode="triangular2"),
        # A phase of no length: the peak it would reach is never taken.
        eqxopt.LinearOneCycle(10, 1.0, pct_start=0.3, pct_final=0.3),
        eqxopt.CosineOneCycle(7, 2.0, pct_start=0.0),
        # Phase ends between whole steps.
        eqxopt.OneCycleMomentum(7, 0.5, 0.95, pct_start=0.35),
        eqxopt.OneCycleMomentum(9, 0.5, 0.95, 0.3, "linear", three_phase=True),
        # A product that peaks between its factors' breakpoints, and one that
        # rises and falls.
        eqxopt.Product(1.0, [eqxopt.Linear(0.5, 1.0, 40), eqxopt.Linear(1.0, 0.5, 40)]),
        eqxopt.Product(
            2.0, [eqxopt.WarmupConstant(0.0, 1.0, 30), eqxopt.StepDecay(1.0, 50, 0.5)]
        ),
        eqxopt.Join(
            [eqxopt.ExponentialDecay(0.9, 10, 1.1), eqxopt.CosineDecay(0.5, 100)],
            [25],
        ),
        eqxopt.Join([eqxopt.Constant(0.3), eqxopt.Linear(0.3, 0.8, 10)], [100]),
        eqxopt.SGDR(
            [
                {
                    "init_value": 0.3,
                    "peak_value": 0.9,
                    "warmup_steps": 3,
                    "decay_steps": 9,
                },
                {"peak_value": 0.5, "decay_steps": 20, "end_value": 0.1},
            ]
        ),
        eqxopt.WarmupStableDecay(1.0, 10, 100, decay_steps=20, init_value=0.2),
        eqxopt.WarmupExponentialDecay(0.0, 1.0, 10, 20, 0.5, end_value=0.05),
        eqxopt.PiecewiseInterpolate("cosine", 1.0, {10: 2.0, 30: 0.1, 60: 10.0}),
        eqxopt.PiecewiseConstant(1.0, {10: 0.5, 20: 4.0}),
        eqxopt.SWALR(1.0, 0.05, 0),
        eqxopt.MultiStepDecay(1.0, [10, 10, 40], gamma=3.0),
    ],
    ids=lambda s: type(s).__name__,
)
def test_value_range_where_the_extremes_are_hard_to_find(schedule):
    assert schedule.value_range() == _dense_range(schedule)


def test_value_range_is_unknown_for_traced_values():
    known = eqxopt.Cyclic(0.8, 1.2, 5)

    @jax.jit
    def inside(peak):
        assert eqxopt.Linear(peak, 0.0, 10).value_range() is None
        eqxopt.SGD(0.1, momentum=eqxopt.Linear(peak, 0.0, 10))  # not checked
        # A schedule of known values is read inside a trace too.
        assert known.value_range() == pytest.approx((0.8, 1.2))
        with pytest.raises(ValueError, match=r"^b1 must be in \[0\.0, 1\.0\)"):
            eqxopt.Adam(peak, b1=known)
        return peak

    inside(1.5)


def test_a_schedule_of_your_own_says_its_range_through_its_breakpoints():
    class Triangle(eqxopt.AbstractSchedule):
        top: float

        def __call__(self, step):
            s = jnp.asarray(step).astype(jnp.float32)
            return self.top * (1.0 - jnp.abs(s - 10.0) / 10.0).clip(0.0)

    class Known(eqxopt.AbstractSchedule):
        top: float

        def __call__(self, step):
            return Triangle(self.top)(step)

        def breakpoints(self):
            return [10, 20]

    assert Triangle(0.5).value_range() is None
    eqxopt.SGD(0.1, momentum=Triangle(1.5))  # not known: not checked
    assert Known(1.5).value_range() == (0.0, 1.5)
    with pytest.raises(ValueError, match=r"^momentum must be in \[0\.0, 1\.0\)"):
        eqxopt.SGD(0.1, momentum=Known(1.5))
