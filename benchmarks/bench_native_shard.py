"""Case 7: the native kernels in a process of 8 host devices.

A donated AdamW step on one 4M-float32 leaf (`opt.step(..., donate=True)`), in this
process of 8 host CPU devices: the leaf on device 3 of 8, and the leaf sharded over
the 8 devices (`NamedSharding`, split along its only axis), each with the native
kernels and with XLA's code (native kernels off while the step compiles); against
the same leaf in a process of one device (a second process, driven round by round
over a pipe so that its runs interleave with these). Reports the medians and the
ratios to the one-device process (target: at most 1.2) and to XLA's code, and the
fastest run of each (on a loaded machine the medians move with the load; the fastest
runs show what the step costs).
"""

import os
import sys

FLAG = "--xla_force_host_platform_device_count"
ONE_DEVICE = "--one-device" in sys.argv
if not ONE_DEVICE:  # before JAX starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {FLAG}=8").strip()

import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import eqxopt  # noqa: E402
from _common import HERE, Stepper, ms, rounds, save, table  # noqa: E402

N = 1 << 22
LR, WD = 1e-3, 1e-2


def steppers(where: object, label: str) -> dict[str, Stepper]:
    """The native and XLA donated steps of AdamW on one leaf placed at `where`."""
    rng = np.random.default_rng(0)
    p0 = rng.normal(size=N).astype(np.float32)
    g = jax.device_put(rng.normal(size=N).astype(np.float32), where)
    opt = eqxopt.AdamW(LR, weight_decay=WD)

    def fresh():
        p = jax.device_put(p0, where)
        return p, opt.init(p)

    def native(s):
        return opt.step(g, s[1], s[0], donate=True)

    # XLA's code: the same step, compiled while the native kernels are off (a
    # `jax.jit` keeps the code it was traced with).
    xla_step = jax.jit(
        lambda g, s, p: opt.step(g, s, p, donate=True), donate_argnums=(1, 2)
    )
    eqxopt.set_native_kernels(False)
    try:
        p, s = fresh()
        xla_state = xla_step(g, s, p)
    finally:
        eqxopt.set_native_kernels(True)

    def xla(s):
        return xla_step(g, s[1], s[0])

    out = {
        f"{label}, native": Stepper(native, fresh()),
        f"{label}, XLA": Stepper(xla, xla_state),
    }
    for s in out.values():  # compiled and warm
        s.run()
        s.run()
        s.times.clear()
    return out


def child() -> None:
    """The one-device process: a round of its steppers per line on stdin."""
    assert len(jax.devices()) == 1, jax.devices()
    mine = steppers(jax.devices()[0], "1-device process")
    print(json.dumps({"ready": eqxopt.native_kernels_available()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "round":
            break
        print(json.dumps({name: s.run() for name, s in mine.items()}), flush=True)


def main() -> dict:
    assert len(jax.devices()) == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    mine = {
        **steppers(jax.devices()[3], "device 3 of 8"),
        **steppers(NamedSharding(mesh, PartitionSpec("data")), "sharded over 8"),
    }
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(
        f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(FLAG)
    )
    proc = subprocess.Popen(
        [sys.executable, __file__, "--one-device"],
        cwd=HERE,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    ready = json.loads(proc.stdout.readline())
    theirs: dict[str, list[float]] = {}
    try:
        for _ in range(rounds(30)):
            for s in mine.values():
                s.run()
            proc.stdin.write("round\n")
            proc.stdin.flush()
            for name, t in json.loads(proc.stdout.readline()).items():
                theirs.setdefault(name, []).append(t)
    finally:
        proc.stdin.close()
        proc.wait()
    times = {name: s.times for name, s in mine.items()} | theirs
    med = {name: statistics.median(t) for name, t in times.items()}
    best = {name: min(t) for name, t in times.items()}
    one = med["1-device process, native"]
    rows = []
    for name, t in med.items():
        xla = med[name.replace("native", "XLA")]
        ratio_best = best[name] / best["1-device process, native"]
        rows.append((name, ms(t), t / one, t / xla, ms(best[name]), ratio_best))
    table(
        "Case 7: AdamW donated step on one 4M-float32 leaf, native kernels with 8 "
        "host devices (median and fastest of interleaved runs)",
        rows,
        (
            "variant",
            "median ms",
            "/ 1-device process native",
            "/ XLA's code, same place",
            "fastest ms",
            "fastest / 1-device native",
        ),
    )
    results = {
        "n": N,
        "step_ms": {k: ms(v) for k, v in med.items()},
        "fastest_ms": {k: ms(v) for k, v in best.items()},
        "ratio_to_one_device_native": {k: v / one for k, v in med.items()},
        "native_in_one_device_process": ready["ready"],
    }
    save("native_shard", results)
    return results


if __name__ == "__main__":
    child() if ONE_DEVICE else main()
