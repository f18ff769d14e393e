"""Case 6: whole train steps (forward, backward and the optimizer step in one `jit`) of
Equinox models, eqxopt's recommended way against optax's documented way.

Variants, interleaved in one process (one call of each per round, medians):

- `eqxopt helper`: `eqxopt.make_train_step(loss_fn, opt)` (donates model and state,
  `opt.step(..., donate=True)` inside).
- `eqxopt by hand`: `eqx.filter_jit(donate="all-except-first")` around
  `eqx.filter_value_and_grad` and `opt.step(grads, state, model, donate=True)`, the
  optimizer passed as the first (not donated) argument.
- `eqxopt native` / `eqxopt xla`: the hand-written step traced with eqxopt's native
  kernels forced on / off (`set_native_kernels`), whatever the default is.
- `optax`: `eqx.filter_jit(donate="all")`, `tx.update(grads, opt_state,
  eqx.filter(model, eqx.is_array))`, `eqx.apply_updates`, as optax's and Equinox's
  docs show.

Reports examples (or tokens) per second, the ratios eqxopt / optax (of wall-clock
time, and of the process's CPU time, which other jobs on a shared machine move less),
XLA's memory analysis of each compiled step (temporaries; parameter-sized copies in
its HLO), and a table of issue 15's targets per model.
`--quick` (or EQXOPT_BENCH_QUICK=1): two rounds of every model (every target in one
run; the compiles take most of it).
"""

import argparse
import os
import re
import statistics
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import eqxopt
from _common import QUICK, Stepper, interleaved, rounds, save, table

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


_OFF = ("0", "false", "no", "off")


def variants(cfg: dict) -> dict:
    """name -> (call(carry) -> carry, carry, lower(carry) -> compiled)."""
    model, loss_fn, batch = cfg["model"], cfg["loss"], cfg["batch"]
    opt = eqxopt.AdamW(LR, weight_decay=1e-4)
    tx = optax.adamw(LR, weight_decay=1e-4)
    out = {}
    # The switch as the environment left it (README's EQXOPT_NATIVE spellings).
    default = os.environ.get("EQXOPT_NATIVE", "1").lower() not in _OFF

    if hasattr(eqxopt, "make_train_step"):
        helper = eqxopt.make_train_step(loss_fn, opt)
        out["eqxopt helper"] = (
            lambda c: helper(c[0], c[1], *batch)[:2],
            (fresh(model), opt.init(model)),
            lambda c: helper.lower(c[0], c[1], *batch).compile(),
        )
    for name, native in (
        ("eqxopt by hand", None),
        ("eqxopt native", True),
        ("eqxopt xla", False),
    ):
        step = hand_written(loss_fn)
        if native is not None:
            eqxopt.set_native_kernels(native)
        carry = (fresh(model), opt.init(model))
        # Trace (and compile) now, under the switch; later calls reuse the program.
        carry = step(opt, *carry, batch)[:2]
        compiled = step.lower(opt, *carry, batch).compile()
        eqxopt.set_native_kernels(default)
        out[name] = (
            lambda c, step=step: step(opt, *c, batch)[:2],
            carry,
            lambda c, compiled=compiled: compiled,
        )
    ostep = optax_step(loss_fn, tx)
    out["optax"] = (
        lambda c: ostep(*c, batch)[:2],
        (fresh(model), tx.init(eqx.filter(model, eqx.is_array))),
        lambda c: ostep.lower(*c, batch).compile(),
    )
    return out


def target_rows(results: dict) -> list[tuple]:
    """One row per model: what issue 15's targets ask for (>= 1.0x optax's
    throughput, the helper within 5% of the best step by hand, peak memory no
    higher than optax's, no copy of a weight)."""
    rows = []
    for model, r in results.items():
        ratio, memory = r["ratio_vs_optax"], r["memory"]
        if "eqxopt helper" not in ratio:
            continue
        by_hand = {
            k: v for k, v in ratio.items() if k not in ("eqxopt helper", "optax")
        }
        best = max(by_hand, key=by_hand.__getitem__)
        cpu = r["cpu_ratio_vs_optax"]
        best_cpu = max(cpu[k] for k in by_hand)
        helper = memory["eqxopt helper"]
        rows.append(
            (
                model,
                f"{ratio['eqxopt helper']:.2f}",
                f"{cpu['eqxopt helper']:.2f}",
                f"{by_hand[best]:.2f} ({best.removeprefix('eqxopt ')})",
                f"{ratio['eqxopt helper'] / by_hand[best]:.2f}"
                f" (CPU time {cpu['eqxopt helper'] / best_cpu:.2f})",
                f"{helper['peak_MB'] / memory['optax']['peak_MB']:.3f}",
                f"{helper['weight_copies']} ({memory['optax']['weight_copies']})",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument(
        "--only", default="", help="run the models whose name contains this"
    )
    args = parser.parse_args()
    quick = args.quick or QUICK
    n_rounds = args.rounds or (2 if quick else rounds(15))
    results = {}
    rows, mem_rows = [], []
    for cfg in configs():
        if args.only not in cfg["name"]:
            continue
        model = cfg["model"]
        n_params = sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_array)))
        found = variants(cfg)
        memory = {}
        for name, (_, carry, lower) in found.items():
            compiled = lower(carry)
            compiled = getattr(compiled, "compiled", compiled)  # eqx.filter_jit's
            analysis = compiled.memory_analysis()
            # Live at once: the arguments, new outputs not written over an
            # argument, and the temporaries (deterministic: XLA's buffer assignment).
            peak = (
                analysis.argument_size_in_bytes
                + analysis.output_size_in_bytes
                - analysis.alias_size_in_bytes
                + analysis.temp_size_in_bytes
            )
            memory[name] = {
                "peak_bytes": int(peak),
                "temp_bytes": int(analysis.temp_size_in_bytes),
                "peak_MB": peak / 1e6,
                "temp_MB": analysis.temp_size_in_bytes / 1e6,
                "output_MB": analysis.output_size_in_bytes / 1e6,
                "aliased_MB": analysis.alias_size_in_bytes / 1e6,
                "weight_copies": weight_copies(compiled.as_text()),
            }
        steppers = {
            name: CpuStepper(fn, carry) for name, (fn, carry, _) in found.items()
        }
        times = interleaved(steppers, n_rounds, warmup=2)
        for s in steppers.values():
            s.cpu = s.cpu[-n_rounds:]  # the timed rounds, not the warm-up
        rate = {name: cfg["examples"] / t for name, t in times.items()}
        ref = steppers["optax"]
        ratio = {name: round_ratios(ref.times, s.times) for name, s in steppers.items()}
        cpu_ratio = {name: round_ratios(ref.cpu, s.cpu) for name, s in steppers.items()}
        for name in found:
            rows.append(
                (
                    cfg["name"],
                    name,
                    f"{rate[name]:.4g} {cfg['unit']}",
                    f"{times[name] * 1e3:.2f} ms",
                    f"{ratio[name]:.2f}",
                    f"{statistics.median(steppers[name].cpu) * 1e3:.2f} ms",
                    f"{cpu_ratio[name]:.2f}",
                )
            )
            m = memory[name]
            mem_rows.append(
                (
                    cfg["name"],
                    name,
                    f"{m['peak_MB']:.1f}",
                    f"{m['peak_MB'] / memory['optax']['peak_MB']:.3f}",
                    f"{m['temp_MB']:.2f}",
                    f"{m['temp_MB'] / memory['optax']['temp_MB']:.2f}"
                    if memory["optax"]["temp_MB"]
                    else "-",
                    m["weight_copies"],
                )
            )
        results[cfg["name"]] = {
            "params": int(n_params),
            "leaves": len(jax.tree.leaves(eqx.filter(model, eqx.is_array))),
            "unit": cfg["unit"],
            "rate": rate,
            "step_ms": {k: v * 1e3 for k, v in times.items()},
            "ratio_vs_optax": ratio,
            "cpu_ms": {k: statistics.median(s.cpu) * 1e3 for k, s in steppers.items()},
            "cpu_ratio_vs_optax": cpu_ratio,
            "memory": memory,
        }
    table(
        f"Train step, {n_rounds} interleaved rounds (ratio: eqxopt / optax throughput,"
        " median over rounds; CPU: process CPU time per step, all threads)",
        rows,
        ("model", "variant", "throughput", "step", "ratio", "CPU", "CPU ratio"),
    )
    table(
        "Train step, the targets (recommended: the helper; best by hand: the fastest"
        " hand-written variant; memory and copies of the helper's compiled step)",
        target_rows(results),
        (
            "model",
            "helper / optax",
            "helper / optax, CPU time",
            "best by hand / optax",
            "helper / best by hand",
            "peak / optax",
            "copies of inputs (optax)",
        ),
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
    save("train_step", {"rounds": n_rounds, **results})
    sys.stdout.flush()


if __name__ == "__main__":
    main()
