"""FSDP on 8 host devices (issue 10): an AdamW step on a transformer-shaped tree whose
leaves are split along a dimension that 8 divides over an "fsdp" mesh axis, eqxopt
(`opt.step`) vs optax (`tx.update` + `optax.apply_updates`), each in one donated
`jax.jit`: the step time ratio (the median of the ratios of interleaved rounds) and
the collectives the optimizer adds (the gradients come in sharded like the
parameters, so every collective in the compiled step is the optimizer's; the target
for element-wise optimizers is none). Then the same counts, and the bytes they move,
for LAMB, Adafactor and Muon against optax's equivalents, and for eqxopt's Muon on an
Explicit mesh (where `optax.contrib.muon` does not trace).

    cd benchmarks && PYTHONPATH=../src ../.venv/bin/python bench_fsdp.py [--no-speed]
"""

import os

# The device count must be set before JAX starts.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import re
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

import eqxopt
from _common import Stepper, interleaved, rounds, save, table

D, VOCAB, BLOCKS = 256, 4096, 4
OPS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "pred": 1, "f64": 8}


def shapes() -> dict:
    block = {
        "ln1": {"scale": (D,), "bias": (D,)},
        "attn": {"qkv": (D, 3 * D), "out": (D, D)},
        "ln2": {"scale": (D,), "bias": (D,)},
        "mlp": {"up": (D, 4 * D), "up_bias": (4 * D,), "down": (4 * D, D)},
    }
    return {
        "embed": (VOCAB, D),
        "blocks": [block] * BLOCKS,
        "ln_f": {"scale": (D,), "bias": (D,)},
        "unembed": (D, VOCAB),
    }


def spec(shape: tuple) -> P:
    """Split along the first dimension that 8 divides."""
    for i, d in enumerate(shape):
        if d % 8 == 0:
            return P(*([None] * i), "fsdp")
    return P()


def make_mesh(kind: str):
    types = getattr(jax.sharding, "AxisType", None)
    if types is None:  # JAX without axis types: every mesh is Auto
        return jax.sharding.Mesh(np.array(jax.devices()), ("fsdp",))
    return jax.make_mesh((8,), ("fsdp",), axis_types=(getattr(types, kind),))


def tree(mesh, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    is_shape = lambda x: isinstance(x, tuple)  # noqa: E731
    return jax.tree.map(
        lambda s: jax.device_put(
            jnp.asarray(0.02 * rng.normal(size=s), jnp.float32),
            NamedSharding(mesh, spec(s)),
        ),
        shapes(),
        is_leaf=is_shape,
    )


def collectives(text: str) -> dict:
    """Count and bytes (summed result sizes; a combined op has a tuple of results)
    of each collective in compiled HLO."""
    out = {}
    for op in OPS:
        found = re.findall(r"= (\(.*?\)|\S+) " + op + r"(?:-start)?\(", text)
        size = sum(
            BYTES.get(t, 4) * int(np.prod([int(d) for d in dims.split(",") if d]))
            for result in found
            for t, dims in re.findall(r"(\w+)\[([\d,]*)\]", result)
        )
        out[op] = {"count": len(found), "bytes": size}
    return out


def eqxopt_step(opt):
    return jax.jit(lambda g, s, p: opt.step(g, s, p), donate_argnums=(1, 2))


def optax_step(tx):
    def step(g, s, p):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    return jax.jit(step, donate_argnums=(1, 2))


def compiled_text(step, grads, state, params) -> str:
    return step.lower(grads, state, params).compile().as_text()


def pairs() -> dict:
    lr = 1e-3
    muon_leaf = lambda p: jax.tree.map(lambda x: x.ndim == 2, p)  # noqa: E731
    return {
        "AdamW": (
            eqxopt.AdamW(lr, weight_decay=0.01),
            optax.adamw(lr, weight_decay=0.01),
        ),
        "LAMB": (eqxopt.LAMB(lr, weight_decay=0.01), optax.lamb(lr, weight_decay=0.01)),
        "Adafactor": (eqxopt.Adafactor(lr), optax.adafactor(lr)),
        "Muon": (eqxopt.Muon(0.02, muon_mask=muon_leaf), optax.contrib.muon(0.02)),
    }


def main() -> None:
    speed = "--no-speed" not in sys.argv
    mesh = make_mesh("Auto")
    params = tree(mesh, 0)
    grads = tree(mesh, 1)
    n = sum(x.size for x in jax.tree.leaves(params))
    print(f"{len(jax.tree.leaves(params))} leaves, {n / 1e6:.2f}M params, 8 devices")

    counts: dict = {}
    for name, (opt, tx) in pairs().items():
        e_text = compiled_text(eqxopt_step(opt), grads, opt.init(params), params)
        o_text = compiled_text(optax_step(tx), grads, tx.init(params), params)
        counts[name] = {"eqxopt": collectives(e_text), "optax": collectives(o_text)}
    # Explicit axes (JAX's default mesh): optax's Muon fails to trace there.
    explicit = {}
    if getattr(jax.sharding, "AxisType", None) is not None:
        emesh = make_mesh("Explicit")
        eparams, egrads = tree(emesh, 0), tree(emesh, 1)
        for name in ("AdamW", "Muon"):
            opt, tx = pairs()[name]
            e_text = compiled_text(eqxopt_step(opt), egrads, opt.init(eparams), eparams)
            explicit[name] = {"eqxopt": collectives(e_text)}
            try:
                o_text = compiled_text(
                    optax_step(tx), egrads, tx.init(eparams), eparams
                )
                explicit[name]["optax"] = collectives(o_text)
            except Exception as err:  # report, don't stop
                explicit[name]["optax"] = f"fails: {str(err).splitlines()[0][:120]}"

    rows = []
    for mesh_kind, data in (("Auto", counts), ("Explicit", explicit)):
        for name, r in data.items():
            for lib in ("eqxopt", "optax"):
                c = r.get(lib)
                if isinstance(c, str):
                    rows.append((mesh_kind, name, lib, c, "", ""))
                    continue
                total = sum(v["count"] for v in c.values())
                mb = sum(v["bytes"] for v in c.values()) / 2**20
                detail = ", ".join(
                    f"{op} {v['count']}" for op, v in c.items() if v["count"]
                )
                rows.append((mesh_kind, name, lib, total, detail or "-", f"{mb:.3g}"))
    table(
        "collectives in one compiled FSDP step (8 devices)",
        rows,
        ("mesh axes", "optimizer", "library", "collectives", "which", "MB moved"),
    )

    payload: dict = {
        "leaves": len(jax.tree.leaves(params)),
        "params": n,
        "collectives_auto_mesh": counts,
        "collectives_explicit_mesh": explicit,
    }
    if not speed:
        save("fsdp", payload)
        return
    # Step time: AdamW, both donated, interleaved.
    opt, tx = pairs()["AdamW"]
    e_step, o_step = eqxopt_step(opt), optax_step(tx)

    def fresh():
        return tree(mesh, 0)

    e_params, o_params = fresh(), fresh()
    steppers = {
        "eqxopt opt.step": Stepper(
            lambda c: e_step(grads, c[1], c[0]), (e_params, opt.init(e_params))
        ),
        "optax update + apply_updates": Stepper(
            lambda c: o_step(grads, c[1], c[0]), (o_params, tx.init(o_params))
        ),
    }
    times = interleaved(steppers, rounds(30), warmup=2)
    # The median of the per-round ratios: both variants of a round see the same
    # load on this shared machine.
    per_round = [
        e / o
        for e, o in zip(
            steppers["eqxopt opt.step"].times,
            steppers["optax update + apply_updates"].times,
        )
    ]
    ratio = statistics.median(per_round)
    table(
        "FSDP AdamW step, donated, 8 devices",
        [(k, f"{v * 1e3:.2f} ms") for k, v in times.items()]
        + [("eqxopt / optax (median of per-round ratios)", f"{ratio:.3f}")],
        ("variant", "median step"),
    )
    payload["adamw_step_ms"] = {k: v * 1e3 for k, v in times.items()}
    payload["adamw_ratio_eqxopt_over_optax"] = ratio
    save("fsdp", payload)


if __name__ == "__main__":
    main()
