"""Quantized optimizer state (issue 11): AdamW's state bytes per parameter at
float32 / bf16 / 8-bit / 4-bit / fp8 moments, from XLA's memory analysis of the
compiled `init` (its outputs) and of a donated step (its temporaries), and the
donated step's time on one 16M-float32 leaf, 8-bit vs float32 moments.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_state_memory.py [--no-speed]
"""

import sys

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
    return {
        "state_bytes_per_param": init.memory_analysis().output_size_in_bytes / N,
        "step_temp_bytes_per_param": analysis.temp_size_in_bytes / N,
    }


def speed() -> dict:
    steppers = {}
    for name in ("float32", "8-bit"):
        opt = adamw(STORAGES[name])
        params = jnp.zeros(N, jnp.float32) + 0.5
        grads = jnp.full(N, 1e-3, jnp.float32)
        state = opt.init(params)

        def fn(carry, opt=opt, grads=grads):
            p, s = carry
            return opt.step(grads, s, p, donate=True)

        steppers[name] = Stepper(fn, (params, state))
    return interleaved(steppers, rounds(10))


def main():
    results = {name: memory(storage) for name, storage in STORAGES.items()}
    rows = [
        (
            name,
            f"{r['state_bytes_per_param']:.4f}",
            f"{r['step_temp_bytes_per_param']:.4f}",
        )
        for name, r in results.items()
    ]
    table(
        "AdamW state, one 16M leaf (XLA memory analysis)",
        rows,
        ("moments", "state bytes / param", "donated step temporaries / param"),
    )
    payload: dict = {"memory": results, "machine": machine()}
    if "--no-speed" not in sys.argv:
        times = speed()
        payload["step_seconds"] = times
        print(
            f"donated step, 16M leaf: float32 {times['float32'] * 1e3:.1f} ms, "
            f"8-bit {times['8-bit'] * 1e3:.1f} ms "
            f"({times['8-bit'] / times['float32']:.2f}x)"
        )
    save("state_memory", payload)


if __name__ == "__main__":
    main()
