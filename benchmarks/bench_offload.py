"""Case 16: optimizer state in host memory (`eqxopt.OffloadState`) against the state
kept in device memory, on a whole AdamW train step of an MLP (`make_train_step`),
beside optax's step with the same model.

For each width: the state's bytes in device and in host memory (read from its
arrays: offloaded, AdamW's two moments move to host memory), the compiled step's
device-memory peak (XLA's memory analysis, which on a GPU leaves out host memory;
a CPU's analysis counts both as one), and the median step time over
interleaved rounds, as ratios to optax. On a CPU, host and device memory are the
same RAM and the times measure the copies' overhead only; on a GPU (`bench_gpu.py`
runs this case) they measure what the transfers cost beside the compute.

    python benchmarks/bench_offload.py            # widths 1024 and 2048, 20 rounds
    EQXOPT_BENCH_QUICK=1 python benchmarks/bench_offload.py

Results go to benchmarks/results.json under "offload".
"""

import os
import sys

import equinox as eqx
import jax
import jax.numpy as jnp

import eqxopt

sys.path.insert(0, os.path.dirname(__file__))
from _common import QUICK, Stepper, interleaved, machine, rounds, save, table

WIDTHS = (256,) if QUICK else (1024, 2048)
DEPTH, BATCH = 4, 64


def _state_bytes(state) -> dict:
    """The state's bytes by memory kind, read from its arrays."""
    out = {"device_state_MB": 0.0, "host_state_MB": 0.0}
    for x in jax.tree.leaves(state):
        if eqx.is_array(x):
            host = x.sharding.memory_kind == "pinned_host"
            out["host_state_MB" if host else "device_state_MB"] += x.nbytes / 1e6
    return out


def _memory(compiled) -> dict:
    analysis = compiled.memory_analysis()
    device = (
        analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes
        - analysis.alias_size_in_bytes
        + analysis.temp_size_in_bytes
    )
    host = (
        analysis.host_argument_size_in_bytes
        + analysis.host_output_size_in_bytes
        - analysis.host_alias_size_in_bytes
        + analysis.host_temp_size_in_bytes
    )
    return {"device_MB": device / 1e6, "host_MB": host / 1e6}


def run(widths=WIDTHS, n_rounds: int | None = None) -> dict:
    n_rounds = n_rounds or rounds(20)
    return {f"MLP width {width}": _one(width, n_rounds) for width in widths}


def _one(width: int, n_rounds: int) -> dict:
    key = jax.random.key(0)
    model = eqx.nn.MLP(width, width, width, DEPTH, key=key)
    x = jax.random.normal(jax.random.key(1), (BATCH, width))
    y = jnp.tanh(x)

    def loss_fn(model, x, y):
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    # Copies on the device: committed, as a step's outputs are (an uncommitted
    # model beside an offloaded state compiles again at the second call).
    device = jax.devices()[0]
    copy = lambda t: jax.tree.map(  # noqa: E731
        lambda a: (
            jax.device_put(jnp.array(a, copy=True), device) if eqx.is_array(a) else a
        ),
        t,
    )
    steppers, memory = {}, {}
    for name, opt in (
        ("in place", eqxopt.AdamW(1e-3)),
        ("offloaded", eqxopt.OffloadState(eqxopt.AdamW(1e-3))),
    ):
        step = eqxopt.make_train_step(loss_fn, opt)
        m = copy(model)
        s = opt.init(m)
        memory[name] = {
            **_memory(step.lower(m, s, x, y).compile()),
            **_state_bytes(s),
        }
        steppers[name] = Stepper(
            lambda ms, step=step: step(ms[0], ms[1], x, y)[:2], (m, s)
        )
    import optax

    tx = optax.adamw(1e-3)
    params, static = eqx.partition(copy(model), eqx.is_array)

    @jax.jit
    def optax_step(params, opt_state):
        grads = jax.grad(lambda p: loss_fn(eqx.combine(p, static), x, y))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    memory["optax"] = {
        **_memory(optax_step.lower(params, tx.init(params)).compile()),
        **_state_bytes(tx.init(params)),
    }
    steppers["optax"] = Stepper(lambda ps: optax_step(*ps), (params, tx.init(params)))
    # Two warm-up calls: a first call commits uncommitted arguments (optax's
    # count), which compiles once more.
    times = interleaved(steppers, n_rounds, warmup=2)
    n = sum(a.size for a in jax.tree.leaves(eqx.filter(model, eqx.is_array)))
    return {
        "params": n,
        "memory": memory,
        "ms": {k: v * 1e3 for k, v in times.items()},
        "vs_optax": {k: v / times["optax"] for k, v in times.items()},
    }


def main() -> None:
    print(f"OffloadState on {machine()['device']} ({jax.default_backend()})")
    results = run()
    rows = []
    for name, r in results.items():
        for variant in ("in place", "offloaded", "optax"):
            mem = r["memory"][variant]
            rows.append(
                (
                    f"{name} ({r['params'] / 1e6:.1f}M)",
                    variant,
                    mem["device_state_MB"],
                    mem["host_state_MB"],
                    mem["device_MB"],
                    r["ms"][variant],
                    r["vs_optax"][variant],
                )
            )
    table(
        "AdamW train step, state in device or host memory",
        rows,
        (
            "model",
            "state",
            "state in device MB",
            "state in host MB",
            "step's device peak MB",
            "ms/step",
            "vs optax",
        ),
    )
    save("offload", {"results": results})


if __name__ == "__main__":
    main()
