"""Shared helpers for the benchmarks: interleaved timing, compile counting, results.

Every case runs eqxopt and its peers in one process, interleaved (one call of each
variant per round), and reports the median over rounds. The machine these numbers
come from is shared and noisy, so each case also records the load average.
"""

import json
import os
import pathlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax

jax.config.update("jax_platforms", "cpu")

HERE = pathlib.Path(__file__).parent
RESULTS = HERE / "results.json"
QUICK = os.environ.get("EQXOPT_BENCH_QUICK") == "1"


def rounds(default: int) -> int:
    """Repeats per case: fewer with EQXOPT_BENCH_QUICK=1 (used by the smoke test)."""
    return 2 if QUICK else default


class Stepper:
    """One variant: `fn(state) -> state`, threaded through its own state (so that
    donated buffers are never reused), timed to completion of the outputs."""

    def __init__(self, fn: Callable[[Any], Any], state: Any):
        self.fn = fn
        self.state = state
        self.times: list[float] = []

    def run(self) -> float:
        start = time.perf_counter()
        self.state = self.fn(self.state)
        jax.block_until_ready(self.state)
        elapsed = time.perf_counter() - start
        self.times.append(elapsed)
        return elapsed


def interleaved(
    steppers: dict[str, Stepper], n_rounds: int, warmup: int = 1, settle: float = 0.0
) -> dict:
    """Median seconds per call of each variant over `n_rounds` interleaved rounds;
    `settle`: seconds to pause (untimed) before each call, so that no call pays for
    work its predecessor left behind (such as freeing large buffers)."""
    for s in steppers.values():
        for _ in range(warmup):
            s.run()
        s.times.clear()
    for _ in range(n_rounds):
        for s in steppers.values():
            if settle:
                time.sleep(settle)
            s.run()
    return {name: statistics.median(s.times) for name, s in steppers.items()}


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def lower_and_compile(lower: Callable[[], Any]) -> dict:
    """Seconds to lower and to compile, measured separately, and the executable."""
    lowered, t_lower = timed(lower)
    compiled, t_compile = timed(lowered.compile)
    return {"lower_s": t_lower, "compile_s": t_compile, "compiled": compiled}


class CompileCounter:
    """Counts XLA backend compiles (any function) while active."""

    def __init__(self):
        self.count = 0
        self.active = False
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        if self.active and event == "/jax/core/compile/backend_compile_duration":
            self.count += 1

    def __enter__(self) -> "CompileCounter":
        self.count = 0
        self.active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self.active = False


def cpu() -> str:
    """The CPU's model name, family and model, and its AVX-512 features."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    fields = dict(
        line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line
    )
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    features = [f for f in ("avx2", "avx512f", "avx512bw", "avx512vbmi") if f in flags]
    return (
        f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, "
        f"model {fields.get('model', '?')}; {' '.join(features)})"
    )


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu(),
        "loadavg": os.getloadavg(),
        "jax": jax.__version__,
        "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def save(case: str, payload: dict) -> None:
    """Merges one case's results into results.json."""
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    payload = {**payload, "machine": machine()}
    data[case] = payload
    RESULTS.write_text(json.dumps(data, indent=2, default=float) + "\n")


def table(title: str, rows: list[tuple], header: tuple) -> str:
    """A markdown table."""
    lines = [f"\n### {title}\n", "| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join(" --- " for _ in header) + "|")
    for row in rows:
        cells = [f"{c:.3g}" if isinstance(c, float) else str(c) for c in row]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def ms(seconds: float) -> float:
    return seconds * 1e3
