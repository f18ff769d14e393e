"""Case 18: DiLoCo against data-parallel training on 8 host devices, one replica
per device (`jax.shard_map` over a "data" axis): the bytes each device sends in
all-reduces per inner step, read from the compiled programs (a local step, a
synchronisation, a data-parallel step with `pmean` of the gradients), and the
median time of H steps of each over interleaved rounds, on an MLP.

The bytes are exact (they are the programs' all-reduce operands); on host devices
an all-reduce is a memory copy, so the time ratio shows the cost of the extra
programs and the outer step, not a network's.

    cd benchmarks && PYTHONPATH=../src ../.venv/bin/python bench_diloco.py
"""

import os

# The device count must be set before JAX starts.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import re
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

import eqxopt
from eqxopt._core._jax_api import shard_map

sys.path.insert(0, os.path.dirname(__file__))
from _common import QUICK, Stepper, interleaved, machine, rounds, save, table

WIDTH, DEPTH, BATCH = (64, 2, 8) if QUICK else (256, 3, 32)
H = 8
BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f64": 8}


def per_device(f, mesh):
    """`f` on each device's replica: its block's leading axis of 1 dropped."""

    def body(*args):
        out = f(*jax.tree.map(lambda a: a[0], args))
        return jax.tree.map(lambda a: a[None], out)

    return jax.jit(shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data")))


def all_reduce_bytes(fn, *args) -> tuple[int, int]:
    """The all-reduces in `fn`'s compiled program and the bytes of their results
    (what each device contributes)."""
    ops = [
        line
        for line in fn.lower(*args).compile().as_text().splitlines()
        if re.search(r" all-reduce(?:-start)?\(", line)
    ]
    total = 0
    for line in ops:
        result = re.split(r" all-reduce(?:-start)?\(", line.split("=", 1)[1])[0]
        for dtype, dims in re.findall(r"(\w+)\[([0-9,]*)\]", result):
            size = int(np.prod([int(d) for d in dims.split(",") if d]))
            total += size * BYTES.get(dtype, 4)
    return len(ops), total


def run(n_rounds: int | None = None) -> dict:
    n_rounds = n_rounds or rounds(10)
    devices = jax.devices()
    if len(devices) != 8:
        raise RuntimeError(f"needs 8 host devices, got {len(devices)}")
    mesh = Mesh(np.array(devices), ("data",))
    model = eqx.nn.MLP(WIDTH, WIDTH, WIDTH, DEPTH, key=jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)
    n = sum(x.size for x in jax.tree.leaves(params))
    stacked = jax.tree.map(lambda p: jnp.broadcast_to(p, (8, *p.shape)), params)
    x = jax.random.normal(jax.random.key(1), (8, BATCH, WIDTH))
    y = jnp.tanh(x)

    def loss(p, x, y):
        return jnp.mean((jax.vmap(eqx.combine(p, static))(x) - y) ** 2)

    diloco = eqxopt.DiLoCo(eqxopt.AdamW(1e-3), sync_every=H, axis_name="data")
    data_parallel = eqxopt.AdamW(1e-3)

    def local(s, p, x, y):
        return diloco.local_step(jax.grad(loss)(p, x, y), s, p)

    def step(s, p, x, y):
        return diloco.step(jax.grad(loss)(p, x, y), s, p)

    def dp(s, p, x, y):
        g = jax.lax.pmean(jax.grad(loss)(p, x, y), "data")
        return data_parallel.step(g, s, p)

    local_fn, sync_fn = per_device(local, mesh), per_device(diloco.sync, mesh)
    step_fn, dp_fn = per_device(step, mesh), per_device(dp, mesh)
    d_state = per_device(diloco.init, mesh)(stacked)
    dp_state = per_device(data_parallel.init, mesh)(stacked)
    counts = {
        "local step": all_reduce_bytes(local_fn, d_state, stacked, x, y),
        "sync": all_reduce_bytes(sync_fn, d_state, stacked),
        "data-parallel step": all_reduce_bytes(dp_fn, dp_state, stacked, x, y),
    }
    per_step = {
        "DiLoCo": counts["local step"][1] + counts["sync"][1] / H,
        "data parallel": counts["data-parallel step"][1],
    }

    def h_steps(fn):
        def run_h(ps):
            p, s = ps
            for _ in range(H):
                p, s = fn(s, p, x, y)
            return p, s

        return run_h

    times = interleaved(
        {
            "DiLoCo": Stepper(h_steps(step_fn), (stacked, d_state)),
            "data parallel": Stepper(h_steps(dp_fn), (stacked, dp_state)),
        },
        n_rounds,
        warmup=1,
    )
    return {
        "params": n,
        "sync_every": H,
        "all_reduces": {k: {"ops": v[0], "bytes": v[1]} for k, v in counts.items()},
        "bytes_per_step": per_step,
        "bytes_ratio": per_step["data parallel"] / per_step["DiLoCo"],
        "ms_per_step": {k: v * 1e3 / H for k, v in times.items()},
        "time_ratio": times["DiLoCo"] / times["data parallel"],
    }


def main() -> None:
    print(f"DiLoCo on {machine()['device']} ({jax.default_backend()}), 8 devices")
    r = run()
    table(
        f"All-reduces of one replica's programs ({r['params']} parameters)",
        [(k, v["ops"], v["bytes"]) for k, v in r["all_reduces"].items()],
        ("program", "all-reduces", "bytes"),
    )
    table(
        f"Per inner step (H = {r['sync_every']})",
        [
            (k, r["bytes_per_step"][k], r["ms_per_step"][k])
            for k in ("DiLoCo", "data parallel")
        ],
        ("training", "bytes all-reduced", "ms/step"),
    )
    print(
        f"data parallel sends {r['bytes_ratio']:.3g}x DiLoCo's bytes; DiLoCo's "
        f"step takes {r['time_ratio']:.3g}x data parallel's time"
    )
    save("diloco", r)


if __name__ == "__main__":
    main()
