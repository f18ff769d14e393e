"""Where the time of a native step with quantized moments goes (issue 11), on one
thread with the data in cache: the whole AdamW step on a 1M-float leaf at float32 /
8-bit / 4-bit moments (the float32 step is mostly the rule's arithmetic here, not
memory traffic), and the quantizer's pieces timed by a small C++ program built from
the kernel's own source (`quantized_pieces.cc`): dequantize, block absmax and code
search with store, in chunks of 256 as the step runs them. ns per element of the
leaf, both moments together. The CPU model is printed with the figures: the search
and the rule's divisions cost very different cycles on different x86 cores.

    cd benchmarks && PYTHONPATH=../src ../.venv/bin/python bench_quantized_pieces.py
"""

import os

os.environ["EQXOPT_NUM_THREADS"] = "1"  # before the native library loads

import pathlib
import statistics
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import eqxopt
from _common import HERE, cpu, rounds, save, table
from eqxopt._core import _storage
from eqxopt._native import _build

N = 2**20
STORAGES = {
    "float32": None,
    "8-bit": eqxopt.Blockwise8bit(),
    "4-bit": eqxopt.Blockwise4bit(),
}
MAPS = ("dynamic8_signed", "dynamic8_unsigned", "dynamic4_signed", "linear4_unsigned")


def whole_steps() -> dict:
    """Median seconds per donated AdamW step on one N-float leaf, interleaved."""
    states = {}
    for name, storage in STORAGES.items():
        opt = eqxopt.AdamW(1e-3, weight_decay=1e-2, mu_dtype=storage, nu_dtype=storage)
        params = jnp.zeros(N, jnp.float32) + 0.5
        grads = jax.random.normal(jax.random.key(0), (N,), jnp.float32) * 1e-3
        states[name] = (opt, grads, (params, opt.init(params)))
    times: dict[str, list[float]] = {name: [] for name in states}

    def run(name: str, calls: int) -> float:
        opt, grads, (params, state) = states[name]
        start = time.perf_counter()
        for _ in range(calls):
            params, state = opt.step(grads, state, params, donate=True)
        jax.block_until_ready((params, state))
        states[name] = (opt, grads, (params, state))
        return (time.perf_counter() - start) / calls

    for name in states:
        run(name, 2)
    for _ in range(rounds(15)):
        for name in states:
            times[name].append(run(name, 10))
    return {name: statistics.median(t) for name, t in times.items()}


def pieces() -> dict:
    """ns per element of each piece, from `quantized_pieces.cc`, 8-bit and 4-bit."""
    with tempfile.TemporaryDirectory() as directory:
        for name in MAPS:
            np.asarray(_storage.code_map(name), np.float32).tofile(
                f"{directory}/{name}.map"
            )
            tables = _storage.search_tables(name)
            np.asarray(tables.thresholds, np.float32).tofile(f"{directory}/{name}.thr")
        binary = f"{directory}/pieces"
        _build.build_harness(HERE / "quantized_pieces.cc", pathlib.Path(binary))
        result = {}
        for bits in ("8", "4"):
            out = subprocess.run(
                [binary, directory, bits], check=True, capture_output=True, text=True
            ).stdout
            result[f"{bits}-bit"] = {
                line.split()[0]: float(line.split()[1]) for line in out.splitlines()
            }
        return result


def main():
    print(f"CPU: {cpu()}")
    steps = whole_steps()
    rows = [
        (
            name,
            f"{seconds * 1e3:.3f} ms",
            f"{seconds * 1e9 / N:.3f}",
            f"{seconds / steps['float32']:.2f}x",
        )
        for name, seconds in steps.items()
    ]
    table(
        "AdamW donated step, one 1M leaf in cache, one thread",
        rows,
        ("moments", "per step", "ns per element", "ratio to float32"),
    )
    parts = pieces()
    names = list(parts["8-bit"])
    table(
        "The quantizer's pieces, one thread, chunks of 256 (ns per element, both "
        "moments)",
        [(piece, *(f"{parts[b][piece]:.3f}" for b in parts)) for piece in names],
        ("piece", *parts),
    )
    save("quantized_pieces", {"cpu": cpu(), "step_seconds": steps, "pieces_ns": parts})


if __name__ == "__main__":
    main()
