"""Draws every eqxopt schedule to docs/schedule_gallery.png (shown in README), and
each one on its own to docs/schedules/<name>.png (shown in docs/schedules.md).

Run from the repository root: `python docs/make_gallery.py` (needs matplotlib:
`pip install ".[plot]"` in a checkout).
"""

import pathlib
import re

import jax.numpy as jnp

import eqxopt

STEPS = 1000
PEAK = 1.0


def inverse_time(step):
    """`Lambda`'s function: JAX operations on the step array."""
    return 1.0 / (1.0 + 0.01 * jnp.asarray(step).astype(float))


def gallery() -> dict[str, eqxopt.AbstractSchedule]:
    return {
        "Constant": eqxopt.Constant(PEAK),
        "Linear": eqxopt.Linear(PEAK, 0.1, 800, transition_begin=100),
        "Polynomial (power 2)": eqxopt.Polynomial(PEAK, 0.0, 2.0, 900),
        "PiecewiseConstant": eqxopt.PiecewiseConstant(
            PEAK, {300: 0.5, 600: 0.4, 850: 0.5}
        ),
        "ExponentialDecay (staircase)": eqxopt.ExponentialDecay(
            PEAK, 100, 0.7, staircase=True, end_value=0.05
        ),
        "CosineDecay (alpha 0.1)": eqxopt.CosineDecay(PEAK, 900, alpha=0.1),
        "WarmupConstant": eqxopt.WarmupConstant(0.0, PEAK, 150),
        "WarmupCosine": eqxopt.WarmupCosine(PEAK, 0.1, 100, 1000),
        "WarmupExponentialDecay": eqxopt.WarmupExponentialDecay(
            0.0, PEAK, 100, 100, 0.75
        ),
        "LinearOneCycle": eqxopt.LinearOneCycle(1000, PEAK),
        "CosineOneCycle": eqxopt.CosineOneCycle(1000, PEAK),
        "SGDR (3 cycles)": eqxopt.SGDR(
            [
                dict(peak_value=PEAK, warmup_steps=20, decay_steps=200),
                dict(peak_value=0.8 * PEAK, warmup_steps=20, decay_steps=300),
                dict(peak_value=0.6 * PEAK, warmup_steps=20, decay_steps=500),
            ]
        ),
        "PiecewiseInterpolate (cosine)": eqxopt.PiecewiseInterpolate(
            "cosine", 0.2 * PEAK, {200: 5.0, 500: 0.5, 900: 0.1}
        ),
        "Join (linear, constant, cosine)": eqxopt.Join(
            [
                eqxopt.Linear(0.0, PEAK, 100),
                eqxopt.Constant(0.7 * PEAK),
                eqxopt.CosineDecay(0.7 * PEAK, 400),
            ],
            [100, 600],
        ),
        "StepDecay (torch StepLR)": eqxopt.StepDecay(PEAK, 200, 0.5),
        "MultiStepDecay": eqxopt.MultiStepDecay(PEAK, [400, 700, 900], 0.3),
        "Cyclic (triangular2)": eqxopt.Cyclic(0.1, PEAK, 100, mode="triangular2"),
        "Cyclic (exp_range)": eqxopt.Cyclic(0.1, PEAK, 100, 150, "exp_range", 0.998),
        "Lambda (inverse time)": eqxopt.Lambda(PEAK, inverse_time),
        "Product (warmup x steps)": eqxopt.Product(
            PEAK, [eqxopt.Linear(0.1, 1.0, 100), eqxopt.StepDecay(1.0, 300, 0.5)]
        ),
        "OneCycleMomentum": eqxopt.OneCycleMomentum(1000),
        "SWALR (cos)": eqxopt.SWALR(PEAK, 0.2, 400),
        "WarmupStableDecay (1-sqrt)": eqxopt.WarmupStableDecay(
            PEAK, 100, 1000, decay_fraction=0.2, decay_shape="1-sqrt"
        ),
        "WarmupStableDecay (cosine)": eqxopt.WarmupStableDecay(
            PEAK, 50, 1000, decay_steps=300, end_value=0.1, decay_shape="cosine"
        ),
    }


def main() -> None:
    out = pathlib.Path(__file__).parent / "schedule_gallery.png"
    eqxopt.plot_schedules(
        gallery(),
        out,
        STEPS,
        columns=4,
        title=f"eqxopt schedules, steps 0..{STEPS - 1}",
        panel_size=(3.0, 1.9),
        dpi=80,
    )
    print(f"wrote {out} ({out.stat().st_size // 1024} KB)")
    folder = out.parent / "schedules"
    folder.mkdir(exist_ok=True)
    for label, schedule in gallery().items():
        path = folder / f"{slug(label)}.png"
        eqxopt.plot_schedules(
            {label: schedule}, path, STEPS, title=label, panel_size=(2.6, 1.3), dpi=70
        )
    print(f"wrote {len(gallery())} plots to {folder}")


def slug(label: str) -> str:
    """The file name of a schedule's plot: `SGDR (3 cycles)` -> `sgdr-3-cycles`."""
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")


if __name__ == "__main__":
    main()
