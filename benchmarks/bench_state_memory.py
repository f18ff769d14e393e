"""Quantized optimizer state (issue 11): AdamW's state bytes per parameter at
float32 / bf16 / 8-bit / 4-bit / fp8 / companded 8-bit / bf16-with-int8-residual
moments, from XLA's memory analysis of the compiled `init` (its outputs) and of a
donated step (its temporaries: XLA's code, and the native kernels' in-place step),
and the donated step's time on one 16M-float32 leaf at float32 / 8-bit / 4-bit /
companded / bf16+int8 moments (interleaved medians, with the ratio to float32),
with the native kernels and with XLA's code, and the CPU time (all threads) per
native step, which a loaded machine disturbs less than the wall time.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_state_memory.py [--no-speed]
"""

import statistics
import sys
import time

import jax
import jax.numpy as jnp

import eqxopt
from _common import Stepper, interleaved, machine, rounds, save, table

N = 16 * 2**20  # one 16M-float leaf (a multiple of both block sizes)

STORAGES = {
    "float32": None,
    "bf16": jnp.bfloat16,
    "8-bit": eqxopt.Blockwise8bit(),
    "4-bit": eqxopt.Blockwise4bit(),
    "fp8": eqxopt.BlockwiseFp8(),
    "companded": eqxopt.Companded8bit(),
    "bf16+int8": eqxopt.ErrorCorrectedBf16(),
}


def adamw(storage):
    return eqxopt.AdamW(1e-3, weight_decay=1e-2, mu_dtype=storage, nu_dtype=storage)


def memory(storage) -> dict:
    params = jax.ShapeDtypeStruct((N,), jnp.float32)
    opt = adamw(storage)
    init = jax.jit(lambda p: opt.init(p)).lower(params).compile()
    state = jax.eval_shape(opt.init, params)

    def step(g, s, p):
        return opt.step(g, s, p)

    donated = jax.jit(step, donate_argnums=(1, 2)).lower(params, state, params)
    analysis = donated.compile().memory_analysis()

    def in_place(g, s, p):  # `donate=True`: the native kernels where available
        return opt.step(g, s, p, donate=True)

    native = jax.jit(in_place, donate_argnums=(1, 2)).lower(params, state, params)
    native_analysis = native.compile().memory_analysis()
    return {
        "state_bytes_per_param": init.memory_analysis().output_size_in_bytes / N,
        "step_temp_bytes_per_param": analysis.temp_size_in_bytes / N,
        "in_place_step_temp_bytes_per_param": native_analysis.temp_size_in_bytes / N,
    }


SPEED = ("float32", "8-bit", "4-bit", "companded", "bf16+int8")


def speed() -> dict:
    """Median seconds per donated step, interleaved: with the native kernels (if
    available here), then with XLA's code."""
    times = {}
    for kernels in (True, False):
        eqxopt.set_native_kernels(kernels)
        label = "native" if kernels and eqxopt.native_kernels_available() else "xla"
        if kernels and label == "xla":
            continue  # no compiler here: the second round measures XLA's code
        times[label], cpu = _speed_round()
        if label == "native":
            times["native CPU time"] = cpu
    eqxopt.set_native_kernels(True)
    return times


def _speed_round() -> dict:
    steppers = {}
    for name in SPEED:
        opt = adamw(STORAGES[name])
        params = jnp.zeros(N, jnp.float32) + 0.5
        # Moments of mixed magnitudes in each block, as in training.
        key = jax.random.key(0)
        grads = jax.random.normal(key, (N,), jnp.float32) * 1e-3
        state = opt.init(params)

        def fn(carry, opt=opt, grads=grads):
            p, s = carry
            return opt.step(grads, s, p, donate=True)

        steppers[name] = Stepper(fn, (params, state))
    wall = interleaved(steppers, rounds(10))
    return wall, {name: _cpu_seconds(s) for name, s in steppers.items()}


def _cpu_seconds(stepper: Stepper, n: int = 5) -> float:
    """Median CPU seconds (this process, all threads) per step."""
    seconds = []
    for _ in range(rounds(n)):
        start = time.process_time()
        stepper.run()
        seconds.append(time.process_time() - start)
    return statistics.median(seconds)


def main():
    results = {name: memory(storage) for name, storage in STORAGES.items()}
    rows = [
        (
            name,
            f"{r['state_bytes_per_param']:.4f}",
            f"{r['step_temp_bytes_per_param']:.4f}",
            f"{r['in_place_step_temp_bytes_per_param']:.4f}",
        )
        for name, r in results.items()
    ]
    table(
        "AdamW state, one 16M leaf (XLA memory analysis)",
        rows,
        (
            "moments",
            "state bytes / param",
            "step temporaries / param (XLA's code)",
            "`donate=True` step temporaries / param",
        ),
    )
    payload: dict = {"memory": results, "machine": machine()}
    if "--no-speed" not in sys.argv:
        times = speed()
        payload["step_seconds"] = times
        rows = [
            (
                label,
                *(
                    f"{t[name] * 1e3:.1f} ms ({t[name] / t['float32']:.2f}x)"
                    for name in SPEED
                ),
            )
            for label, t in times.items()
        ]
        table(
            "AdamW donated step, one 16M leaf (median wall time, and CPU time of the "
            "native step; ratio to float32 moments)",
            rows,
            ("code", *SPEED),
        )
    save("state_memory", payload)


if __name__ == "__main__":
    main()
