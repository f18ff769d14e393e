"""Shared helpers for the benchmarks: interleaved timing, compile counting, results.

Every case runs eqxopt and its peers in one process, interleaved (one call of each
variant per round), and reports the median over rounds. The machine these numbers
come from is shared and noisy, so each case also records the load average.

Environment:

- `EQXOPT_BENCH_PLATFORM`: JAX's platforms (`jax_platforms`), `cpu` by default;
  empty: JAX's own choice (the GPU of a CUDA JAX; `bench_gpu.py` leaves it so).
- `EQXOPT_BENCH_RESULTS`: the results file, `benchmarks/results.json` by default.
- `EQXOPT_BENCH_QUICK=1`: two rounds per case.
"""

import contextlib
import gc
import json
import os
import pathlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import jax

PLATFORM = os.environ.get("EQXOPT_BENCH_PLATFORM", "cpu")
if PLATFORM:
    jax.config.update("jax_platforms", PLATFORM)

HERE = pathlib.Path(__file__).parent
RESULTS = pathlib.Path(os.environ.get("EQXOPT_BENCH_RESULTS") or HERE / "results.json")
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


class CompileEvents:
    """Sums JAX's compile-phase durations while active: tracing to a jaxpr, lowering
    to StableHLO and XLA's backend compile, read from JAX's own events during a
    first call (so nothing is compiled twice)."""

    NAMES: ClassVar[dict[str, str]] = {
        "/jax/core/compile/jaxpr_trace_duration": "trace_s",
        "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
        "/jax/core/compile/backend_compile_duration": "compile_s",
    }

    def __init__(self):
        self.active = False
        self.totals = dict.fromkeys(self.NAMES.values(), 0.0)
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        if self.active and event in self.NAMES:
            self.totals[self.NAMES[event]] += duration_secs

    def measure(self, fn: Callable[[], Any]) -> tuple[Any, dict]:
        """`fn()` waited for, and its compile phases with the whole call's seconds
        (`first_call_s`)."""
        # A full collection of Python's garbage (the earlier variants' traces) would
        # land in whichever variant happened to trigger it: collect it beforehand.
        gc.collect()
        self.totals = dict.fromkeys(self.NAMES.values(), 0.0)
        self.active = True
        start = time.perf_counter()
        try:
            out = jax.block_until_ready(fn())
        finally:
            self.active = False
        return out, {**self.totals, "first_call_s": time.perf_counter() - start}


def repeated_compiles(
    lowers: dict[str, Callable[[], Any]],
    events: CompileEvents,
    n: int,
    reference: str = "optax",
) -> dict[str, dict]:
    """Each of `lowers` (a function that traces, lowers and compiles a step) run
    again `n` times, interleaved, JAX's caches cleared before each, so that every
    repeat pays what a first call pays. A single first call moves by 10% or more
    on a shared machine; these medians are the figure to compare.

    Returns, per name: the medians of `trace_lower_s` (trace + lowering),
    `compile_s` (XLA's compile) and `total_s` (the whole call), and `vs_optax`,
    the median over repeats of each against `reference`'s in the same repeat."""
    runs: dict[str, list[dict]] = {name: [] for name in lowers}
    for _ in range(n):
        for name, lower in lowers.items():
            jax.clear_caches()
            runs[name].append(events.measure(lower)[1])
    out = {}
    for name, measured in runs.items():
        ratios = [first_call_ratios(m, r) for m, r in zip(measured, runs[reference])]
        out[name] = {
            "trace_lower_s": statistics.median(map(trace_and_lower, measured)),
            "compile_s": statistics.median(c["compile_s"] for c in measured),
            "total_s": statistics.median(c["first_call_s"] for c in measured),
            "repeats": n,
            "vs_optax": {
                "trace_lower": statistics.median(r["trace_lower"] for r in ratios),
                "compile": statistics.median(r["compile"] for r in ratios),
                "total": statistics.median(r["first_call"] for r in ratios),
            },
        }
    return out


def trace_and_lower(first: dict) -> float:
    """Seconds a first call (`CompileEvents.measure`) spent tracing and lowering."""
    return first["trace_s"] + first["lower_s"]


def first_call_ratios(first: dict, reference: dict) -> dict:
    """A first call's compile phases against the reference's: trace + lower,
    backend compile, and the whole first call."""
    return {
        "trace_lower": trace_and_lower(first) / trace_and_lower(reference),
        "compile": first["compile_s"] / reference["compile_s"],
        "first_call": first["first_call_s"] / reference["first_call_s"],
    }


# The ways eqxopt's steps can run: its native CPU kernels, or XLA's own code (what
# every GPU and TPU runs, and the CPU with `EQXOPT_NATIVE=0`).
PATHS = ("native", "xla")


def kernel_paths(requested: tuple[str, ...] = PATHS) -> list[str]:
    """The paths of `requested` that can run here: "xla" always, "native" where the
    kernels are on by default (`EQXOPT_NATIVE`) and available (a C++ compiler, the
    CPU backend)."""
    import eqxopt

    for path in requested:
        if path not in PATHS:
            raise ValueError(f"unknown path {path!r}; choose from {PATHS}")
    native = "native" in requested and eqxopt.native_kernels_available()
    return [p for p in requested if p == "xla" or native]


@contextlib.contextmanager
def kernel_path(path: str) -> Iterator[None]:
    """eqxopt's steps traced inside run on `path` ("native" or "xla"). Switching
    drops eqxopt's compiled steps, so each path's first calls trace and compile
    again; a `jax.jit` of the user's keeps the code it was traced with."""
    import eqxopt

    before = eqxopt.native_kernels_available()
    eqxopt.set_native_kernels(path == "native")
    try:
        yield
    finally:
        eqxopt.set_native_kernels(before)


def warm_up() -> None:
    """Pays, before anything is timed, what only a process's first compile pays
    (XLA's and LLVM's start) and what only a machine's first native step does
    (building the kernels of AdamW's rule; cached on disk after that)."""
    import jax.numpy as jnp

    import eqxopt

    jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.ones(3)))
    grads = {"w": jnp.ones(3)}
    opt = eqxopt.AdamW(1e-3, weight_decay=1e-2)
    for path in kernel_paths():
        with kernel_path(path):
            params = {"w": jnp.ones(3)}
            out = opt.step(grads, opt.init(params), params, donate=True)
            jax.block_until_ready(out)


def memory(compiled: Any) -> dict:
    """XLA's memory analysis of a compiled program. Peak: what is live at once, the
    arguments, the outputs not written over an argument, and the temporaries
    (deterministic: XLA's buffer assignment)."""
    compiled = getattr(compiled, "compiled", compiled)  # eqx.filter_jit's
    analysis = compiled.memory_analysis()
    peak = (
        analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes
        - analysis.alias_size_in_bytes
        + analysis.temp_size_in_bytes
    )
    return {
        "peak_bytes": int(peak),
        "temp_bytes": int(analysis.temp_size_in_bytes),
        "peak_MB": peak / 1e6,
        "temp_MB": analysis.temp_size_in_bytes / 1e6,
        "output_MB": analysis.output_size_in_bytes / 1e6,
        "aliased_MB": analysis.alias_size_in_bytes / 1e6,
    }


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
    device = jax.devices()[0]
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu(),
        "loadavg": os.getloadavg(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device": f"{len(jax.devices())} x {device.device_kind}",
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


def summary_lines(case: str, results: dict, variants: Sequence[str]) -> list[str]:
    """One line per ratio to optax of each of `variants` (names without the path,
    such as "eqxopt helper") on each path: throughput (target: at least 1), first
    call and peak memory (targets: at most 1)."""
    lines = []
    for model, r in results.items():
        v = r["variants"]
        optax_peak = v["optax"]["memory"]["peak_MB"]
        for path in r["paths"]:
            for base in variants:
                name = f"{base} {path}"
                if name not in v:
                    continue
                x = v[name]
                checks = [
                    ("throughput", x["ratio"], ">= 1"),
                    ("first call", x["first_call_vs_optax"]["first_call"], "<= 1"),
                ]
                if "compiles" in x:
                    repeated = x["compiles"]
                    checks.append(
                        (
                            f"first call, median of {repeated['repeats']}",
                            repeated["vs_optax"]["total"],
                            "<= 1",
                        )
                    )
                checks.append(
                    ("peak memory", x["memory"]["peak_MB"] / optax_peak, "<= 1")
                )
                for what, value, goal in checks:
                    lines.append(
                        f"{case}, {model}: {name} / optax, {what}: {value:.2f}x"
                        f" (target {goal})"
                    )
    return lines


def summary(data: dict) -> list[str]:
    """One line per ratio of the train-step cases in `data` (results.json's
    layout): `make_train_step` against optax for the models of case 6; the tree and
    the packed model against optax, packed against the tree, and each variant's
    growth against the leaf count, for case 12."""
    lines = []
    train = {
        k: v
        for k, v in data.get("train_step", {}).items()
        if isinstance(v, dict) and "variants" in v
    }
    lines += summary_lines("train step", train, ("eqxopt helper",))
    packed = data.get("packed_layers", {})
    models = packed.get("models", {})
    lines += summary_lines("packed layers", models, ("eqxopt tree", "eqxopt packed"))
    for model, r in models.items():
        v = r["variants"]
        for path in r["paths"]:
            tree, pk = v[f"eqxopt tree {path}"], v[f"eqxopt packed {path}"]
            first = (
                pk["first_call"]["first_call_s"] / tree["first_call"]["first_call_s"]
            )
            lines += [
                f"packed layers, {model}: packed / tree on {path}, throughput:"
                f" {pk['ratio'] / tree['ratio']:.2f}x (target >= 1)",
                f"packed layers, {model}: packed / tree on {path}, first call:"
                f" {first:.2f}x (target <= 1)",
            ]
    for name, g in packed.get("growth", {}).items():
        small, large = g["leaves"]
        if name != "optax":
            lines.append(
                f"packed layers, {name}: step time from {small} to {large} leaves,"
                f" against optax's: {g['step_vs_optax']:.2f}x (target <= 1)"
            )
    return lines


def ms(seconds: float) -> float:
    return seconds * 1e3
