"""Case 6: whole train steps (forward, backward and the optimizer step in one `jit`) of
Equinox models, eqxopt's recommended way against optax's documented way, on each
path eqxopt's steps can run: its native CPU kernels and XLA's own code (what GPUs
and TPUs run).

Variants, per path (`native`, `xla`):

- `eqxopt helper <path>`: `eqxopt.make_train_step(loss_fn, opt)` (donates model and
  state, `opt.step(..., donate=True)` inside).
- `eqxopt by hand <path>`: `eqx.filter_jit(donate="all-except-first")` around
  `eqx.filter_value_and_grad` and `opt.step(grads, state, model, donate=True)`, the
  optimizer passed as the first (not donated) argument.
- `optax`: `eqx.filter_jit(donate="all")`, `tx.update(grads, opt_state,
  eqx.filter(model, eqx.is_array))`, `eqx.apply_updates`, as optax's and Equinox's
  docs show.

Each path is a phase (switching the kernels drops eqxopt's compiled steps): the
first call of each of its variants, then interleaved rounds (one call of each per
round, medians) of its variants and optax, so that every ratio to optax comes from
rounds under the same load. The native path runs where the kernels do (the CPU,
with a C++ compiler, unless `EQXOPT_NATIVE=0`); `--paths xla` runs XLA's code only.

Reports examples (or tokens) per second, the ratios to optax (of throughput, and of
the process's CPU time, which other jobs on a shared machine move less), the first
call's trace + lowering and backend compile against optax's (the first call, and
the medians of `--compiles` repeats of it with JAX's caches cleared, interleaved
with optax's: one first call moves by 10% or more on a shared machine), XLA's
memory analysis of each compiled step (peak, temporaries; parameter-sized copies
in its HLO), and a table of the targets per model and path.
`--quick` (or EQXOPT_BENCH_QUICK=1): two rounds of every model (every target in one
run; the compiles take most of it).
"""

import argparse
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import eqxopt
from _common import (
    PATHS,
    QUICK,
    CompileEvents,
    Stepper,
    first_call_ratios,
    interleaved,
    kernel_path,
    kernel_paths,
    memory,
    repeated_compiles,
    rounds,
    save,
    table,
    trace_and_lower,
    warm_up,
)

# ------------------------------------------------------------------------- models


class Block(eqx.Module):
    ln1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    ln2: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, width: int, heads: int, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.ln1 = eqx.nn.LayerNorm(width)
        self.attn = eqx.nn.MultiheadAttention(heads, width, key=k1)
        self.ln2 = eqx.nn.LayerNorm(width)
        self.up = eqx.nn.Linear(width, 4 * width, key=k2)
        self.down = eqx.nn.Linear(4 * width, width, key=k3)

    def __call__(self, x):
        h = jax.vmap(self.ln1)(x)
        mask = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), bool))
        x = x + self.attn(h, h, h, mask=mask)
        h = jax.vmap(self.ln2)(x)
        return x + jax.vmap(lambda v: self.down(jax.nn.gelu(self.up(v))))(h)


class TransformerLM(eqx.Module):
    """Embeddings, blocks of causal multi-head attention + MLP with layer norms, a
    final layer norm and an unembedding: 52 leaves with 4 blocks."""

    embed: eqx.nn.Embedding
    blocks: list
    ln: eqx.nn.LayerNorm
    unembed: eqx.nn.Linear

    def __init__(self, vocab: int, width: int, depth: int, heads: int, key):
        keys = jax.random.split(key, depth + 2)
        self.embed = eqx.nn.Embedding(vocab, width, key=keys[0])
        self.blocks = [Block(width, heads, k) for k in keys[1:-1]]
        self.ln = eqx.nn.LayerNorm(width)
        self.unembed = eqx.nn.Linear(width, vocab, use_bias=False, key=keys[-1])

    def __call__(self, tokens):
        x = jax.vmap(self.embed)(tokens)
        for block in self.blocks:
            x = block(x)
        return jax.vmap(lambda v: self.unembed(self.ln(v)))(x)


def lm_loss(model, tokens):
    logits = jax.vmap(model)(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


class CNN(eqx.Module):
    layers: list

    def __init__(self, key):
        k = jax.random.split(key, 4)
        self.layers = [
            eqx.nn.Conv2d(1, 32, 3, key=k[0]),
            jax.nn.relu,
            eqx.nn.Conv2d(32, 64, 3, key=k[1]),
            jax.nn.relu,
            eqx.nn.MaxPool2d(2, 2),
            jnp.ravel,
            eqx.nn.Linear(64 * 12 * 12, 128, key=k[2]),
            jax.nn.relu,
            eqx.nn.Linear(128, 10, key=k[3]),
        ]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def classify_loss(model, x, y):
    logits = jax.vmap(model)(x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def configs() -> list[dict]:
    key = jax.random.key(0)
    k1, k2 = jax.random.split(key)
    out = []

    def lm(name, width, batch, seq, heads):
        model = TransformerLM(256, width, 4, heads, k1)
        tokens = jax.random.randint(k2, (batch, seq + 1), 0, 256)
        return dict(
            name=name,
            model=model,
            loss=lm_loss,
            batch=(tokens,),
            examples=batch * seq,
            unit="tokens/s",
        )

    out.append(lm("transformer 3.3M, 16x128 tokens", 256, 16, 128, 4))
    out.append(lm("transformer 28.7M (width 768), 1x16 tokens", 768, 1, 16, 12))
    out.append(
        dict(
            name="CNN 1.2M, batch 64 of 28x28",
            model=CNN(k1),
            loss=classify_loss,
            batch=(
                jax.random.normal(k2, (64, 1, 28, 28)),
                jax.random.randint(k2, (64,), 0, 10),
            ),
            examples=64,
            unit="examples/s",
        )
    )
    out.append(
        dict(
            name="MLP 32 layers of 64, batch 256",
            model=eqx.nn.MLP(64, 10, 64, 32, key=k1),
            loss=classify_loss,
            batch=(
                jax.random.normal(k2, (256, 64)),
                jax.random.randint(k2, (256,), 0, 10),
            ),
            examples=256,
            unit="examples/s",
        )
    )
    return out


# ----------------------------------------------------------------------- variants

LR = 1e-3


def fresh(tree):
    return jax.tree.map(
        lambda x: jnp.array(x, copy=True) if eqx.is_array(x) else x, tree
    )


def hand_written(loss_fn):
    """The step README shows for eqxopt."""

    @eqx.filter_jit(donate="all-except-first")
    def step(opt, model, state, batch):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, *batch)
        model, state = opt.step(grads, state, model, donate=True)
        return model, state, loss

    return step


def optax_step(loss_fn, tx):
    """The step optax's and Equinox's docs show."""

    @eqx.filter_jit(donate="all")
    def step(model, opt_state, batch):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, *batch)
        updates, opt_state = tx.update(
            grads, opt_state, eqx.filter(model, eqx.is_array)
        )
        return eqx.apply_updates(model, updates), opt_state, loss

    return step


def weight_copies(hlo: str) -> int:
    """Copies, in the compiled program, of an input array of 2+ dimensions (a weight
    matrix, moment or batch; not a layout change of some result), counting a copy of
    such a copy too."""
    params = set(re.findall(r"(%\S+) = \S+ parameter\(", hlo))
    found = re.findall(r"(%\S+) = f32\[\d+(?:,\d+)+\]\{[^}]*\} copy\((%[^)]+)\)", hlo)
    copies = 0
    for name, operand in found:  # in program order: a copy follows what it copies
        if operand in params:
            params.add(name)
            copies += 1
    return copies


class CpuStepper(Stepper):
    """A `Stepper` that also records the process's CPU time per call (all threads):
    the work a step costs, which other jobs on a shared machine move far less than
    its wall-clock time."""

    def __init__(self, fn, state):
        super().__init__(fn, state)
        self.cpu: list[float] = []

    def run(self) -> float:
        start = time.process_time()
        elapsed = super().run()
        self.cpu.append(time.process_time() - start)
        return elapsed


def round_ratios(reference: list[float], times: list[float]) -> float:
    """The ratio of each round (same load for both), then the median: steadier than
    the ratio of medians on a machine whose load drifts."""
    return statistics.median(o / t for o, t in zip(reference, times))


class Variant(NamedTuple):
    """One way to run a train step: `call(carry) -> carry` (the carry: model and
    optimizer state), the first `carry`, and `lower(carry)`: the compiled program
    `call` runs (for XLA's memory analysis and its HLO)."""

    call: Callable[[Any], Any]
    carry: Any
    lower: Callable[[Any], Any]


KINDS = ("helper", "by hand")


def eqxopt_variants(
    cfg: dict, opt, path: str, kinds: Sequence[str] = KINDS
) -> dict[str, Variant]:
    """eqxopt's variants of one model on `path` (built and run inside
    `kernel_path(path)`): `kinds` of `KINDS`."""
    model, loss_fn, batch = cfg["model"], cfg["loss"], cfg["batch"]

    def helper() -> Variant:
        step = eqxopt.make_train_step(loss_fn, opt)
        return Variant(
            lambda c: step(c[0], c[1], *batch)[:2],
            (fresh(model), opt.init(model)),
            lambda c: step.lower(c[0], c[1], *batch).compile(),
        )

    def by_hand() -> Variant:
        step = hand_written(loss_fn)
        return Variant(
            lambda c: step(opt, *c, batch)[:2],
            (fresh(model), opt.init(model)),
            lambda c: step.lower(opt, *c, batch).compile(),
        )

    builders = {"helper": helper, "by hand": by_hand}
    return {f"eqxopt {kind} {path}": builders[kind]() for kind in kinds}


def optax_variant(cfg: dict, tx) -> Variant:
    model, batch = cfg["model"], cfg["batch"]
    step = optax_step(cfg["loss"], tx)
    return Variant(
        lambda c: step(*c, batch)[:2],
        (fresh(model), tx.init(eqx.filter(model, eqx.is_array))),
        lambda c: step.lower(*c, batch).compile(),
    )


def _analysis(compiled) -> dict:
    text = getattr(compiled, "compiled", compiled).as_text()
    return {**memory(compiled), "weight_copies": weight_copies(text)}


def run_paths(
    reference: Variant,
    variants_for: Callable[[str], dict[str, Variant]],
    paths: Sequence[str],
    n_rounds: int,
    events: CompileEvents,
    compiles: int = 0,
) -> dict[str, dict]:
    """Every path's phase: the first call of each of its variants (`variants_for(
    path)`) and XLA's memory analysis of its program, then interleaved rounds of the
    path's variants and the reference (optax, first called before the others),
    then (with `compiles`) that many interleaved repeats of every first call
    (`repeated_compiles`: `compiles` per variant, and the reference's per path as
    `compiles <path>`).

    Returns, per variant (and `"optax"` for the reference): `path`, `first_call`
    (JAX's compile events and the whole call, seconds), `first_call_vs_optax`
    (variant / optax), `memory` (XLA's memory analysis and copies of inputs),
    `step_s` and `cpu_s` (medians per call), `ratio` and `cpu_ratio` (optax's time /
    the variant's, the median of the per-round ratios in the path's phase: above 1
    is faster than optax)."""
    out: dict[str, dict] = {}
    carry, first = events.measure(lambda: reference.call(reference.carry))
    optax_record = {
        "path": "-",
        "first_call": first,
        "first_call_vs_optax": first_call_ratios(first, first),
        "memory": _analysis(reference.lower(carry)),
    }
    reference_times: list[float] = []
    reference_cpu: list[float] = []
    for path in paths:
        with kernel_path(path):
            found = variants_for(path)
            steppers = {}
            for name, variant in found.items():
                after, first_call = events.measure(
                    lambda variant=variant: variant.call(variant.carry)
                )
                out[name] = {
                    "path": path,
                    "first_call": first_call,
                    "first_call_vs_optax": first_call_ratios(first_call, first),
                    "memory": _analysis(variant.lower(after)),
                }
                steppers[name] = CpuStepper(variant.call, after)
            steppers["optax"] = CpuStepper(reference.call, carry)
            interleaved(steppers, n_rounds, warmup=2)
            for s in steppers.values():
                s.cpu = s.cpu[-n_rounds:]  # the timed rounds, not the warm-up
            ref = steppers.pop("optax")
            carry = ref.state
            for name, s in steppers.items():
                out[name].update(
                    step_s=statistics.median(s.times),
                    cpu_s=statistics.median(s.cpu),
                    ratio=round_ratios(ref.times, s.times),
                    cpu_ratio=round_ratios(ref.cpu, s.cpu),
                )
            reference_times += ref.times
            reference_cpu += ref.cpu
            if compiles:
                lowers = {
                    name: lambda v=found[name], s=s: v.lower(s.state)
                    for name, s in steppers.items()
                }
                lowers["optax"] = lambda carry=carry: reference.lower(carry)
                repeated = repeated_compiles(lowers, events, compiles)
                for name in steppers:
                    out[name]["compiles"] = repeated[name]
                optax_record[f"compiles {path}"] = repeated["optax"]
    optax_record.update(
        step_s=statistics.median(reference_times),
        cpu_s=statistics.median(reference_cpu),
        ratio=1.0,
        cpu_ratio=1.0,
    )
    out["optax"] = optax_record
    return out


def target_rows(results: dict) -> list[tuple]:
    """One row per model and path: the helper against optax (throughput and CPU
    time: at least 1.0; first call: at most 1.0; peak memory: at most 1.0; no copy
    of an input), and against the step by hand on its path (within 5%)."""
    rows = []
    for model, r in results.items():
        variants = r["variants"]
        optax_copies = variants["optax"]["memory"]["weight_copies"]
        optax_peak = variants["optax"]["memory"]["peak_MB"]
        for path in r["paths"]:
            helper = variants[f"eqxopt helper {path}"]
            by_hand = variants.get(f"eqxopt by hand {path}")
            first = helper["first_call_vs_optax"]
            repeated = helper.get("compiles")
            rows.append(
                (
                    model,
                    path,
                    f"{helper['ratio']:.2f}",
                    f"{helper['cpu_ratio']:.2f}",
                    "-"
                    if by_hand is None
                    else f"{helper['ratio'] / by_hand['ratio']:.2f}"
                    f" (CPU time {helper['cpu_ratio'] / by_hand['cpu_ratio']:.2f})",
                    f"{first['first_call']:.2f} (compile {first['compile']:.2f})",
                    "-"
                    if repeated is None
                    else f"{repeated['vs_optax']['total']:.2f}"
                    f" (compile {repeated['vs_optax']['compile']:.2f})",
                    f"{helper['memory']['peak_MB'] / optax_peak:.3f}",
                    f"{helper['memory']['weight_copies']} ({optax_copies})",
                )
            )
    return rows


def first_call_row(
    model: str, variant: str, seconds: tuple, ratios: tuple
) -> tuple[str, ...]:
    """A row of a first-call table (`FIRST_CALL_HEADER`): seconds and ratios to
    optax of trace + lowering, compile and the whole call."""
    return (model, variant, *(f"{x:.2f}" for x in (*seconds, *ratios)))


FIRST_CALL_HEADER = (
    "model",
    "variant",
    "trace+lower s",
    "compile s",
    "first call s",
    "trace+lower / optax",
    "compile / optax",
    "first call / optax",
)

TARGET_HEADER = (
    "model",
    "path",
    "helper / optax",
    "helper / optax, CPU time",
    "helper / by hand",
    "first call / optax",
    "first call / optax, median of repeats",
    "peak / optax",
    "copies of inputs (optax)",
)


def run(
    cfgs: list[dict],
    paths: Sequence[str],
    n_rounds: int,
    events: CompileEvents,
    kinds: Sequence[str] = KINDS,
    compiles: int = 0,
) -> dict:
    """Every model of `cfgs` on `paths` (eqxopt's `kinds` of variants), with the
    tables (with `compiles`, that many repeats of every first call); the results
    per model."""
    results = {}
    rows, first_rows, repeat_rows, mem_rows = [], [], [], []
    for cfg in cfgs:
        model = cfg["model"]
        arrays = jax.tree.leaves(eqx.filter(model, eqx.is_array))
        opt = eqxopt.AdamW(LR, weight_decay=1e-4)
        tx = optax.adamw(LR, weight_decay=1e-4)
        found = run_paths(
            optax_variant(cfg, tx),
            lambda path, cfg=cfg, opt=opt: eqxopt_variants(cfg, opt, path, kinds),
            paths,
            n_rounds,
            events,
            compiles,
        )
        optax_memory = found["optax"]["memory"]
        for name, v in found.items():
            rows.append(
                (
                    cfg["name"],
                    name,
                    f"{cfg['examples'] / v['step_s']:.4g} {cfg['unit']}",
                    f"{v['step_s'] * 1e3:.2f} ms",
                    f"{v['ratio']:.2f}",
                    f"{v['cpu_s'] * 1e3:.2f} ms",
                    f"{v['cpu_ratio']:.2f}",
                )
            )
            c, cr = v["first_call"], v["first_call_vs_optax"]
            first_rows.append(
                first_call_row(
                    cfg["name"],
                    name,
                    (trace_and_lower(c), c["compile_s"], c["first_call_s"]),
                    (cr["trace_lower"], cr["compile"], cr["first_call"]),
                )
            )
            if "compiles" in v:
                rc, rr = v["compiles"], v["compiles"]["vs_optax"]
                repeat_rows.append(
                    first_call_row(
                        cfg["name"],
                        name,
                        (rc["trace_lower_s"], rc["compile_s"], rc["total_s"]),
                        (rr["trace_lower"], rr["compile"], rr["total"]),
                    )
                )
            m = v["memory"]
            mem_rows.append(
                (
                    cfg["name"],
                    name,
                    f"{m['peak_MB']:.1f}",
                    f"{m['peak_MB'] / optax_memory['peak_MB']:.3f}",
                    f"{m['temp_MB']:.2f}",
                    f"{m['temp_MB'] / optax_memory['temp_MB']:.2f}"
                    if optax_memory["temp_MB"]
                    else "-",
                    m["weight_copies"],
                )
            )
        results[cfg["name"]] = {
            "params": int(sum(x.size for x in arrays)),
            "leaves": len(arrays),
            "unit": cfg["unit"],
            "paths": list(paths),
            "variants": found,
        }
    table(
        f"Train step, {n_rounds} interleaved rounds per path (ratio: eqxopt / optax"
        " throughput, median over rounds; CPU: process CPU time per step, all"
        " threads)",
        rows,
        ("model", "variant", "throughput", "step", "ratio", "CPU", "CPU ratio"),
    )
    table(
        "Train step, the first call (trace + lowering to StableHLO, XLA's compile,"
        " the whole call; seconds, and / optax)",
        first_rows,
        FIRST_CALL_HEADER,
    )
    if repeat_rows:
        table(
            f"Train step, the first call repeated {compiles} times per path,"
            " interleaved with optax's, JAX's caches cleared before each (medians;"
            " ratios: the median of each repeat's ratio to optax's)",
            repeat_rows,
            FIRST_CALL_HEADER,
        )
    table(
        "Train step, XLA memory analysis of the compiled step",
        mem_rows,
        (
            "model",
            "variant",
            "peak MB",
            "peak / optax",
            "temp MB",
            "temp / optax",
            "copies of inputs",
        ),
    )
    table(
        "Train step, the targets (the helper, make_train_step, per path; by hand: the"
        " step written out with eqx.filter_jit on the same path)",
        target_rows(results),
        TARGET_HEADER,
    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument(
        "--compiles",
        type=int,
        default=None,
        help="repeats of every first call, caches cleared (default 5; 1 quick)",
    )
    parser.add_argument(
        "--only", default="", help="run the models whose name contains this"
    )
    parser.add_argument(
        "--paths",
        nargs="+",
        choices=PATHS,
        default=list(PATHS),
        help="eqxopt's paths to measure (native: where the kernels can run)",
    )
    args = parser.parse_args()
    quick = args.quick or QUICK
    n_rounds = args.rounds or (2 if quick else rounds(15))
    paths = kernel_paths(tuple(args.paths))
    events = CompileEvents()
    warm_up()
    cfgs = [cfg for cfg in configs() if args.only in cfg["name"]]
    compiles = args.compiles if args.compiles is not None else (1 if quick else 5)
    results = run(cfgs, paths, n_rounds, events, compiles=compiles)
    save("train_step", {"rounds": n_rounds, "compiles": compiles, **results})
    sys.stdout.flush()


if __name__ == "__main__":
    main()
