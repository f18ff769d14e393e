"""Preconditioners under FSDP on 8 host devices: `w` (512, 512) on `P('fsdp', None)`
and `b` (512,) on `P('fsdp')`. For Shampoo, SOAP, PSGDKron, GaLore, SM3 and
Adafactor: the preconditioner's bytes per device / its bytes (the arrays' shards, at
init and after 4 steps), the largest difference from the same 4 steps on one device,
the collectives in the compiled step, and the root problems (eigendecompositions,
QRs, triangular solves) one device's program computes at most, on 8 devices and on
one. `--time`: the step that recomputes the roots, per call, on 8 devices and on
one device (medians of interleaved rounds; CPU time on a shared machine varies).

    cd benchmarks
    PYTHONPATH=../src ../.venv/bin/python bench_precond_sharding.py [--time]
"""

import os

# The device count must be set before JAX starts.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import re
import sys
import time

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import eqxopt

OPS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
WORK = {
    "Shampoo": ("lapack_ssyevd",),
    "SOAP": ("lapack_ssyevd", "geqrf"),
    "PSGDKron": ("lapack_strsm",),
}
CASES = {
    "Shampoo": (
        lambda: eqxopt.Shampoo(1e-3, eps=1.0, precondition_frequency=2),
        ("factors", "roots"),
    ),
    "SOAP": (lambda: eqxopt.SOAP(1e-3, precondition_frequency=2), ("gg", "q")),
    "PSGDKron": (lambda: eqxopt.PSGDKron(1e-3), ("q",)),
    "GaLore": (lambda: eqxopt.GaLore(1e-3, rank=128), ("mu", "nu", "projector")),
    "SM3": (lambda: eqxopt.SM3(1e-1), ("accumulators",)),
    "Adafactor": (lambda: eqxopt.Adafactor(1e-2), ("v_row", "v_col")),
}


def collectives(text: str) -> dict[str, int]:
    return {op: len(re.findall(rf"\b{op}(?:-start)?\(", text)) for op in OPS}


def problems_per_device(text: str, op: str) -> int:
    """The most problems of `op` one device's program computes: each call's batch,
    times the trip counts of the loops around it (every branch counted)."""
    comps = {}
    for block in re.split(r"\n(?=\S)", text):
        head = re.match(r"(?:ENTRY )?%([\w.\-]+)", block)
        if head:
            comps[head.group(1)] = block
    callers: dict[str, tuple[str, int]] = {}
    for name, block in comps.items():
        for line in block.splitlines():
            trips = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', line)
            body = re.search(r"body=%([\w.\-]+)", line)
            if body:
                callers[body.group(1)] = (name, int(trips.group(1)) if trips else 1)
            refs = re.findall(
                r"(?:calls|to_apply|condition|true_computation|false_computation)"
                r"=%([\w.\-]+)",
                line,
            )
            for group in re.findall(r"branch_computations=\{([^}]*)\}", line):
                refs += re.findall(r"%([\w.\-]+)", group)
            for ref in refs:
                callers.setdefault(ref, (name, 1))

    def runs(name: str) -> int:
        count = 1
        while name in callers:
            name, times = callers[name]
            count *= times
        return count

    total = 0
    for name, block in comps.items():
        for line in block.splitlines():
            if op not in line or "get-tuple-element" in line:
                continue
            shape = re.search(r"= \(?\w+\[([\d,]*)\]", line)
            assert shape is not None, line
            dims = [int(d) for d in shape.group(1).split(",") if d]
            batch = re.search(r'num_batch_dims="(\d+)"', line)
            batched = int(batch.group(1)) if batch else len(dims) - 2
            total += int(np.prod(dims[:batched])) * runs(name)
    return total


def held(state, fields) -> tuple[int, int]:
    leaves = [x for f in fields for x in jax.tree.leaves(getattr(state, f))]
    per_device: dict = {}
    for x in leaves:
        for shard in x.addressable_shards:
            per_device[shard.device] = (
                per_device.get(shard.device, 0) + shard.data.nbytes
            )
    return sum(x.nbytes for x in leaves), max(per_device.values())


def main(timing: bool) -> None:
    assert len(jax.devices()) == 8, jax.devices()
    mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    specs = {"w": P("fsdp", None), "b": P("fsdp")}
    rng = np.random.default_rng(0)
    host = {
        "w": rng.normal(size=(512, 512)).astype(np.float32),
        "b": rng.normal(size=(512,)).astype(np.float32),
    }
    grads = [
        {k: rng.normal(size=v.shape).astype(np.float32) for k, v in host.items()}
        for _ in range(4)
    ]

    def put(tree):
        return {
            k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in tree.items()
        }

    one = jax.devices()[0]
    for name, (make, fields) in CASES.items():
        opt = make()
        runs = {}
        for where, place in (
            ("8 devices", put),
            ("1 device", lambda t: jax.device_put(t, one)),
        ):
            params = place(host)
            state = opt.init(params)
            at_init = held(state, fields)
            step = jax.jit(lambda g, s, p, opt=opt: opt.step(g, s, p))
            text = step.lower(place(grads[0]), state, params).compile().as_text()
            for g in grads:
                params, state = step(place(g), state, params)
            runs[where] = (params, state, at_init, text, step, place)
        params, state, at_init, text, step, place = runs["8 devices"]
        one_params, _, _, one_text, _, _ = runs["1 device"]
        gap = max(
            float(np.max(np.abs(np.asarray(params[k]) - np.asarray(one_params[k]))))
            for k in params
        )
        whole, most = at_init
        after = held(state, fields)
        line = (
            f"{name}: preconditioner {most}/{whole} bytes per device at init "
            f"({most / whole:.4f}), {after[1] / after[0]:.4f} after 4 steps; "
            f"max |8 devices - 1 device| {gap:.1e}; collectives {collectives(text)}"
        )
        for op in WORK.get(name, ()):
            line += (
                f"; {op} problems per device {problems_per_device(text, op)} "
                f"(one device {problems_per_device(one_text, op)})"
            )
        print(line)
        if timing and name in WORK:
            # k = 4 after the steps above: precondition_frequency=2 recomputes at
            # every even k, so time pairs of steps from here.
            timed = {}
            for where in ("8 devices", "1 device"):
                p, s, _, _, stepper, placer = runs[where]
                g = placer(grads[0])
                timed[where] = (stepper, g, [p, s])
            samples: dict[str, list[float]] = {w: [] for w in timed}
            for _ in range(5):
                for where, (stepper, g, carry) in timed.items():
                    start = time.perf_counter()
                    for _ in range(2):
                        carry[0], carry[1] = stepper(g, carry[1], carry[0])
                    jax.block_until_ready(carry)
                    samples[where].append((time.perf_counter() - start) / 2)
            medians = {w: float(np.median(v)) for w, v in samples.items()}
            print(
                f"  {name} step (half of them recompute): "
                + ", ".join(f"{w} {m * 1e3:.1f} ms" for w, m in medians.items())
            )


if __name__ == "__main__":
    main("--time" in sys.argv[1:])
