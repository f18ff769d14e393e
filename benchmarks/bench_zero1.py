"""ZeRO-1 (issue 10): AdamW on a transformer-shaped tree over 8 host devices,
parameters replicated, the state replicated or split over "data" with
`eqxopt.shard_state`. Reports the state bytes per device / replicated state bytes
(XLA memory analysis of the program that creates the state, and the arrays'
addressable shards), the collectives in each compiled step (all-gather, all-reduce,
reduce-scatter, all-to-all, collective-permute, counted in the HLO text), and the
donated step time of eqxopt (replicated, ZeRO-1) and optax (replicated), medians of
interleaved rounds.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_zero1.py [--no-speed]
"""

import os

# The device count must be set before JAX starts (`_common` imports it).
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import eqxopt
from _common import (
    Stepper,
    interleaved,
    kernel_path,
    kernel_paths,
    machine,
    ms,
    rounds,
    save,
    table,
)

VOCAB, D, LAYERS = 4096, 256, 4
COLLECTIVE = re.compile(
    r"\b(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
    r"(?:-start)?\("
)


def transformer() -> dict:
    def layer():
        return {
            "ln1": jnp.ones(D),
            "qkv": jnp.ones((D, 3 * D)),
            "qkv_b": jnp.zeros(3 * D),
            "out": jnp.ones((D, D)),
            "ln2": jnp.ones(D),
            "up": jnp.ones((D, 4 * D)),
            "up_b": jnp.zeros(4 * D),
            "down": jnp.ones((4 * D, D)),
        }

    tree = {"embed": jnp.ones((VOCAB, D)), "layers": [layer() for _ in range(LAYERS)]}
    tree["final_ln"] = jnp.ones(D)
    return jax.tree.map(lambda x: x * 0.01, tree)


def collectives(text: str) -> dict:
    counts: dict = {}
    for match in COLLECTIVE.finditer(text):
        counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    return counts


def main():
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, P())
    params = jax.device_put(transformer(), replicated)
    grads = jax.tree.map(lambda x: jnp.full_like(x, 1e-3), params)
    opt = eqxopt.AdamW(1e-3, weight_decay=1e-2)
    n_params = sum(x.size for x in jax.tree.leaves(params))

    # Bytes: the compiled `init` per device, replicated vs ZeRO-1 (the shardings
    # from the state itself: on Auto axes `jax.eval_shape` records none).
    full = opt.init(params)
    zero1 = eqxopt.state_shardings(full, mesh, "data")

    def init_bytes(shardings):
        compiled = jax.jit(lambda p: opt.init(p), out_shardings=shardings)
        analysis = compiled.lower(params).compile().memory_analysis()
        return analysis.output_size_in_bytes

    whole = init_bytes(jax.tree.map(lambda _: replicated, full))
    split = init_bytes(zero1)
    state = {
        "replicated": jax.device_put(opt.init(params), replicated),
        "ZeRO-1": eqxopt.shard_state(opt.init(params), mesh, "data"),
    }
    on_device_0 = {
        name: sum(
            shard.data.nbytes
            for x in jax.tree.leaves(s)
            for shard in x.addressable_shards
            if shard.device == jax.devices()[0]
        )
        for name, s in state.items()
    }
    table(
        f"AdamW state per device, {n_params / 1e6:.1f}M-parameter transformer tree, "
        "8 host devices",
        [
            ("XLA memory analysis (init)", whole, split, split / whole),
            (
                "addressable shards (device 0)",
                on_device_0["replicated"],
                on_device_0["ZeRO-1"],
                on_device_0["ZeRO-1"] / on_device_0["replicated"],
            ),
        ],
        ("measured by", "replicated bytes", "ZeRO-1 bytes", "ZeRO-1 / replicated"),
    )

    # Collectives in the compiled donated step that `opt.step(..., donate=True)`
    # runs (its outputs placed like its inputs), on each path.
    paths = kernel_paths()
    counts = {}
    for path in paths:
        with kernel_path(path):
            for name, s in state.items():
                lowered = opt.step.lower(grads, s, params, donate=True)
                counts[f"{name}, {path}"] = collectives(lowered.compile().as_text())
    kinds = sorted({k for c in counts.values() for k in c})
    table(
        "collectives per donated AdamW step (compiled HLO)",
        [
            (name, sum(c.values()), *(c.get(k, 0) for k in kinds))
            for name, c in counts.items()
        ],
        ("state", "total", *kinds),
    )
    payload: dict = {
        "params": n_params,
        "state_bytes_per_device": {"replicated": whole, "zero1": split},
        "ratio_memory_analysis": split / whole,
        "ratio_addressable_shards": on_device_0["ZeRO-1"] / on_device_0["replicated"],
        "collectives": counts,
    }

    if "--no-speed" not in sys.argv:
        import optax

        tx = optax.adamw(1e-3, weight_decay=1e-2)

        def optax_step(carry, g):
            p, st = carry
            updates, st = tx.update(g, st, p)
            return optax.apply_updates(p, updates), st

        optax_donated = jax.jit(optax_step, donate_argnums=0)

        def fn(carry):
            p, st = carry
            return opt.step(grads, st, p, donate=True)

        reference = Stepper(
            lambda carry: optax_donated(carry, grads),
            jax.tree.map(jnp.copy, (params, tx.init(params))),
        )
        # One phase per path (switching drops eqxopt's compiled steps), each
        # interleaved with optax; ratios against optax's rounds of the same phase.
        times, ratios = {}, {}
        for path in paths:
            with kernel_path(path), jax.numpy_dtype_promotion("standard"):
                steppers = {
                    f"eqxopt {name}, {path}": Stepper(
                        fn, jax.tree.map(jnp.copy, (params, s))
                    )
                    for name, s in state.items()
                }
                steppers["optax replicated"] = reference
                med = interleaved(steppers, rounds(15))
                for name, t in med.items():
                    if name != "optax replicated":
                        times[name] = t
                        ratios[name] = t / med["optax replicated"]
            times.setdefault("optax replicated", med["optax replicated"])
        ratios["optax replicated"] = 1.0
        table(
            "donated AdamW step, 8 host devices (median of interleaved rounds; the"
            " ratio against optax's rounds of the same path)",
            [(name, ms(t), ratios[name]) for name, t in times.items()],
            ("variant", "ms", "/ optax replicated"),
        )
        payload["step_seconds"] = times
        payload["step_vs_optax"] = ratios
    payload["machine"] = machine()
    save("zero1", payload)


if __name__ == "__main__":
    main()
