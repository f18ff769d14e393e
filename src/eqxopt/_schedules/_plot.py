"""Drawing schedules to a PNG (matplotlib is optional: `pip install ".[plot]"`)."""

import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from .._core._schedule import AbstractSchedule


@eqx.filter_jit
def _evaluate(schedule: AbstractSchedule, steps: Any) -> Any:
    return schedule(steps)


def _labelled(schedules: Any) -> list[tuple[str, AbstractSchedule]]:
    if isinstance(schedules, AbstractSchedule):
        pairs = [(type(schedules).__name__, schedules)]
    elif isinstance(schedules, Mapping):
        pairs = [(str(k), v) for k, v in schedules.items()]
    elif isinstance(schedules, Sequence) and not isinstance(schedules, str):
        pairs = [(type(s).__name__, s) for s in schedules]
    else:
        raise TypeError(
            "schedules must be a schedule, a list of schedules or a dict from labels "
            f"to schedules, got {type(schedules).__name__}"
        )
    if not pairs:
        raise ValueError("schedules must hold at least one schedule, got none")
    for label, s in pairs:
        if not isinstance(s, AbstractSchedule):
            raise TypeError(
                f"schedules[{label!r}] must be an eqxopt schedule module, got "
                f"{type(s).__name__}"
            )
    return pairs


def _step_range(steps: Any) -> np.ndarray:
    if isinstance(steps, (int, np.integer)) and not isinstance(steps, bool):
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        return np.arange(int(steps), dtype=np.int32)
    array = np.asarray(steps)
    if array.ndim != 1 or array.size == 0 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            "steps must be a positive int or a non-empty 1-D array of integer steps, "
            f"got {steps!r}"
        )
    return array.astype(np.int32)


def plot_schedules(
    schedules: Any,
    path: str | pathlib.Path,
    steps: Any = 1000,
    *,
    columns: int | None = None,
    title: str | None = None,
    log_scale: bool = False,
    panel_size: tuple[float, float] = (3.2, 2.2),
    dpi: int = 100,
) -> pathlib.Path:
    """Draws schedules over a range of steps and writes a PNG.

    **Arguments:**

    - `schedules`: one schedule module, a list of them (labelled by class name) or a
      dict from labels to schedules.
    - `path`: where the PNG goes (parent folders must exist).
    - `steps`: an int `N` for steps `0..N-1`, or a 1-D array of integer steps.
    - `columns`: `None` draws every curve on one set of axes with a legend; an int
      draws one small panel per schedule, this many to a row (a gallery).
    - `title`: a title over the figure.
    - `log_scale`: a logarithmic value axis.
    - `panel_size`: width and height in inches of one panel (or of the single axes
      times `(2, 2)` in overlay mode).
    - `dpi`: resolution.

    **Returns:** the path written, as a `pathlib.Path`.

    Needs matplotlib (in a checkout of eqxopt, `pip install ".[plot]"`, or
    `pip install matplotlib`); it is imported only here and drawn without pyplot,
    so no window opens and no global state changes.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        # eqxopt is on no package index, so `pip install "eqxopt[plot]"` finds nothing.
        raise ImportError(
            "plot_schedules needs matplotlib; install it with "
            '`pip install ".[plot]"` in a checkout of eqxopt, or `pip install '
            "matplotlib`"
        ) from error
    pairs = _labelled(schedules)
    xs = _step_range(steps)
    if columns is not None and (
        isinstance(columns, bool) or not isinstance(columns, int) or columns < 1
    ):
        raise ValueError(f"columns must be None or an int >= 1, got {columns!r}")
    curves = [(label, np.asarray(_evaluate(s, jnp.asarray(xs)))) for label, s in pairs]
    width, height = panel_size
    if columns is None:
        fig = Figure(figsize=(2 * width, 2 * height), dpi=dpi, layout="constrained")
        ax = fig.add_subplot()
        for label, ys in curves:
            ax.plot(xs, ys, label=label, linewidth=1.5)
        ax.set_xlabel("step")
        ax.set_ylabel("value")
        if log_scale:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=min(0.0, *(float(ys.min()) for _, ys in curves)))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    else:
        cols = min(columns, len(curves))
        rows = math.ceil(len(curves) / cols)
        fig = Figure(
            figsize=(cols * width, rows * height), dpi=dpi, layout="constrained"
        )
        axes = fig.subplots(rows, cols, squeeze=False)
        for i, ax in enumerate(axes.flat):
            if i >= len(curves):
                ax.set_axis_off()
                continue
            label, ys = curves[i]
            ax.plot(xs, ys, color=f"C{i % 10}", linewidth=1.5)
            ax.set_title(label, fontsize="medium")
            if log_scale:
                ax.set_yscale("log")
            else:
                ax.set_ylim(bottom=min(0.0, float(ys.min())))
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize="x-small")
    if title is not None:
        fig.suptitle(title)
    out = pathlib.Path(path)
    fig.savefig(out, format="png")
    return out
