"""Case 12: models of many small leaves, as a tree and packed (`eqxopt.pack`), on
each path eqxopt's steps can run (its native CPU kernels, XLA's own code).

The model: N linear layers of 64 x 64 (no bias: N leaves), each followed by tanh,
on a batch of 64 vectors, mean squared error; N = 300 and 2,000 (`--leaves`).
Variants, per path (`native`, `xla`), each a whole train step
(`eqxopt.make_train_step`, AdamW):

- `eqxopt tree <path>`: the model as it is.
- `eqxopt packed <path>`: `eqxopt.pack(model)`, one buffer of N * 4,096 floats
  (the loss function gets the unpacked model; its gradient comes back packed).
- `optax`: the step optax's and Equinox's docs show (`eqx.filter_jit(donate="all")`,
  `tx.update`, `eqx.apply_updates`), on the tree.

As in case 6 (`bench_train_step.py`), each path is a phase: the first call of each
variant (trace + lowering and XLA's compile, from JAX's events), XLA's memory
analysis of its program, then interleaved rounds with optax. Reports the ratios to
optax (throughput: at least 1 is the target; first call and peak memory: at most
1), packed against the tree on the same path (packing should make neither the step
nor the first call slower), and how each variant grows from the smallest N to the
largest against the leaf count (1: linear).

`--quick` (or EQXOPT_BENCH_QUICK=1): two rounds, N = 50 and 300.
"""

import argparse
import sys
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import eqxopt
from _common import (
    PATHS,
    QUICK,
    CompileEvents,
    kernel_paths,
    rounds,
    save,
    table,
    warm_up,
)
from bench_train_step import LR, Variant, fresh, optax_variant, run_paths

WIDTH, BATCH = 64, 64
LEAVES = (300, 2000)
QUICK_LEAVES = (50, 300)


class Layers(eqx.Module):
    """`n` linear layers of `width` x `width` without bias, tanh after each."""

    layers: list

    def __init__(self, n: int, width: int, key):
        self.layers = [
            eqx.nn.Linear(width, width, use_bias=False, key=k)
            for k in jax.random.split(key, n)
        ]

    def __call__(self, x):
        for layer in self.layers:
            x = jnp.tanh(layer(x))
        return x


def mse_loss(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


def config(n: int) -> dict:
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return dict(
        name=f"{n} linear layers of {WIDTH}x{WIDTH}",
        leaves=n,
        model=Layers(n, WIDTH, k1),
        loss=mse_loss,
        batch=(
            jax.random.normal(k2, (BATCH, WIDTH)),
            jax.random.normal(k3, (BATCH, WIDTH)),
        ),
        examples=BATCH,
        unit="examples/s",
    )


def eqxopt_variants(cfg: dict, opt, path: str) -> dict[str, Variant]:
    """The tree and the packed model on `path` (built and run inside
    `kernel_path(path)`)."""
    batch = cfg["batch"]
    out = {}
    for layout, model in (
        ("tree", cfg["model"]),
        ("packed", eqxopt.pack(cfg["model"])),
    ):
        step = eqxopt.make_train_step(cfg["loss"], opt)
        out[f"eqxopt {layout} {path}"] = Variant(
            lambda c, step=step: step(c[0], c[1], *batch)[:2],
            (fresh(model), opt.init(model)),
            lambda c, step=step: step.lower(c[0], c[1], *batch).compile(),
        )
    return out


def packing_rows(results: dict) -> list[tuple]:
    """Packed against the tree, per model and path: throughput (tree's time /
    packed's), first call and peak memory (packed / tree)."""
    rows = []
    for model, r in results.items():
        v = r["variants"]
        for path in r["paths"]:
            tree, packed = v[f"eqxopt tree {path}"], v[f"eqxopt packed {path}"]
            first = (
                packed["first_call"]["first_call_s"]
                / tree["first_call"]["first_call_s"]
            )
            rows.append(
                (
                    model,
                    path,
                    f"{packed['ratio'] / tree['ratio']:.2f}",
                    f"{first:.2f}",
                    f"{packed['memory']['peak_MB'] / tree['memory']['peak_MB']:.3f}",
                )
            )
    return rows


def growth(results: dict) -> dict[str, dict]:
    """Per variant, its step time and first call at the largest model against the
    smallest, divided by the ratio of their leaf counts (1: linear in the leaves),
    and its step's growth against optax's (`step_vs_optax`: its throughput ratio to
    optax at the smallest model over that at the largest, each from rounds under
    the same load as optax's; 1: it grows as optax's step does)."""
    if len(results) < 2:
        return {}
    ordered = sorted(results.values(), key=lambda r: r["leaves"])
    small, large = ordered[0], ordered[-1]
    scale = large["leaves"] / small["leaves"]
    out = {}
    for name, x in large["variants"].items():
        y = small["variants"].get(name)
        if y is None:
            continue
        out[name] = {
            "leaves": [small["leaves"], large["leaves"]],
            "step": x["step_s"] / y["step_s"] / scale,
            "step_vs_optax": y["ratio"] / x["ratio"],
            "first_call": x["first_call"]["first_call_s"]
            / y["first_call"]["first_call_s"]
            / scale,
        }
    return out


def run(
    leaves: Sequence[int], paths: Sequence[str], n_rounds: int, events: CompileEvents
) -> dict:
    results = {}
    rows = []
    for n in leaves:
        cfg = config(n)
        opt = eqxopt.AdamW(LR, weight_decay=1e-4)
        tx = optax.adamw(LR, weight_decay=1e-4)
        found = run_paths(
            optax_variant(cfg, tx),
            lambda path, cfg=cfg, opt=opt: eqxopt_variants(cfg, opt, path),
            paths,
            n_rounds,
            events,
        )
        optax_peak = found["optax"]["memory"]["peak_MB"]
        for name, v in found.items():
            c, cr = v["first_call"], v["first_call_vs_optax"]
            rows.append(
                (
                    cfg["name"],
                    name,
                    f"{v['step_s'] * 1e3:.2f}",
                    f"{v['ratio']:.2f}",
                    f"{v['cpu_ratio']:.2f}",
                    f"{c['trace_s'] + c['lower_s']:.2f}",
                    f"{c['compile_s']:.2f}",
                    f"{cr['first_call']:.2f} (compile {cr['compile']:.2f})",
                    f"{v['memory']['peak_MB']:.1f}",
                    f"{v['memory']['peak_MB'] / optax_peak:.3f}",
                )
            )
        results[cfg["name"]] = {
            "leaves": n,
            "params": n * WIDTH * WIDTH,
            "unit": cfg["unit"],
            "paths": list(paths),
            "variants": found,
        }
    table(
        f"Case 12: N linear layers of {WIDTH}x{WIDTH}, whole AdamW train step,"
        f" {n_rounds} interleaved rounds per path (ratio: optax's step time / the"
        " variant's, median over rounds)",
        rows,
        (
            "model",
            "variant",
            "step ms",
            "throughput / optax",
            "CPU time ratio",
            "trace+lower s",
            "compile s",
            "first call / optax",
            "peak MB",
            "peak / optax",
        ),
    )
    table(
        "Case 12: packed against the tree, same path",
        packing_rows(results),
        (
            "model",
            "path",
            "throughput packed / tree",
            "first call packed / tree",
            "peak packed / tree",
        ),
    )
    grown = growth(results)
    if grown:
        first = next(iter(grown.values()))["leaves"]
        table(
            f"Case 12: growth from {first[0]} to {first[1]} leaves, against the"
            " leaf count (1: linear)",
            [
                (name, g["step"], g["first_call"], g["step_vs_optax"])
                for name, g in grown.items()
            ],
            ("variant", "step", "first call", "step, against optax's growth"),
        )
    return {"models": results, "growth": grown}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="two rounds, 50 and 300 leaves"
    )
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--leaves", type=int, nargs="+", default=None)
    parser.add_argument(
        "--paths",
        nargs="+",
        choices=PATHS,
        default=list(PATHS),
        help="eqxopt's paths to measure (native: where the kernels can run)",
    )
    args = parser.parse_args()
    quick = args.quick or QUICK
    n_rounds = args.rounds or (2 if quick else rounds(11))
    leaves = args.leaves or (QUICK_LEAVES if quick else LEAVES)
    events = CompileEvents()
    warm_up()
    results = run(leaves, kernel_paths(tuple(args.paths)), n_rounds, events)
    save("packed_layers", {"rounds": n_rounds, **results})
    sys.stdout.flush()


if __name__ == "__main__":
    main()
