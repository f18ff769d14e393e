"""Case 14: population training. N = 8 digits CNNs (`examples/train_digits.py`'s
`CNN`, 1 x 8 x 8 images, batches of 32) with AdamW at 8 learning rates
(`eqxopt.population`), trained in one compiled step mapped over the models
(`eqx.filter_vmap` inside `eqx.filter_jit`, models and states donated) against the
same 8 models trained one after another (one compiled step per model, the same
program for all 8, each with its own optimizer, model and state).

Reports the time per model step (a population step / 8, and 8 sequential steps / 8),
the medians over interleaved rounds (one population step and one pass over the 8
sequential models per round), their ratio, and each variant's first call.

    python benchmarks/bench_population.py            # 30 rounds
    python benchmarks/bench_population.py --quick    # 3 rounds

Results go to benchmarks/results.json under "population" (`EQXOPT_BENCH_RESULTS`
for another file).
"""

import argparse
import pathlib
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import eqxopt
from _common import (
    CompileEvents,
    Stepper,
    interleaved,
    save,
    table,
    warm_up,
)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
from train_digits import CNN, load_data, loss_fn

MEMBERS = 8
BATCH = 32
LEARNING_RATES = np.geomspace(1e-4, 1e-2, MEMBERS).tolist()


def adamw(learning_rate):
    return eqxopt.AdamW(learning_rate, weight_decay=1e-2)


@eqx.filter_jit(donate="all-except-first")
def population_step(opts, models, states, x, y):
    """One step of every member: its own batch, gradients and optimizer."""

    def one(opt, model, state, x, y):
        grads = eqx.filter_grad(loss_fn)(model, x, y)
        return opt.step(grads, state, model, donate=True)

    return eqx.filter_vmap(one)(opts, models, states, x, y)


@eqx.filter_jit(donate="all-except-first")
def single_step(opt, model, state, x, y):
    grads = eqx.filter_grad(loss_fn)(model, x, y)
    return opt.step(grads, state, model, donate=True)


def member(tree, i):
    return jax.tree.map(lambda a: a[i] if eqx.is_array(a) else a, tree)


def run(n_rounds: int) -> dict:
    data = load_data()
    rng = np.random.default_rng(0)
    index = rng.integers(0, len(data.y_train), (MEMBERS, BATCH))
    x = jnp.asarray(data.x_train[index])  # (8, 32, 1, 8, 8): a batch per member
    y = jnp.asarray(data.y_train[index])

    opts = eqxopt.population(adamw, learning_rate=LEARNING_RATES)
    keys = jax.random.split(jax.random.key(0), MEMBERS)
    models = eqx.filter_vmap(CNN)(keys)
    states = eqx.filter_vmap(lambda opt, m: opt.init(m))(opts, models)
    size = sum(a.size for a in jax.tree.leaves(eqx.filter(models, eqx.is_array)))
    alone = [adamw(lr) for lr in LEARNING_RATES]
    # Copies: the population's own arrays are donated by its step.
    singles = [
        jax.tree.map(lambda a: jnp.copy(a) if eqx.is_array(a) else a, member(models, i))
        for i in range(MEMBERS)
    ]
    single_states = [opt.init(m) for opt, m in zip(alone, singles)]

    def population(s):
        return population_step(opts, *s, x, y)

    def sequential(s):
        return [single_step(alone[i], *s[i], x[i], y[i]) for i in range(MEMBERS)]

    events = CompileEvents()
    first = {}
    pop_state, first["population"] = events.measure(
        lambda: population((models, states))
    )
    seq_state, first["sequential"] = events.measure(
        lambda: sequential(list(zip(singles, single_states)))
    )
    steppers = {
        "population": Stepper(population, pop_state),
        "sequential": Stepper(sequential, seq_state),
    }
    medians = interleaved(steppers, n_rounds)
    per_model_ms = {k: 1e3 * t / MEMBERS for k, t in medians.items()}
    return {
        "members": MEMBERS,
        "batch": BATCH,
        "params_per_model": size // MEMBERS,
        "rounds": n_rounds,
        "native_kernels": eqxopt.native_kernels_available(),
        "per_model_step_ms": per_model_ms,
        "sequential_over_population": per_model_ms["sequential"]
        / per_model_ms["population"],
        "first_call_s": {k: v["first_call_s"] for k, v in first.items()},
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    n_rounds = args.rounds or (3 if args.quick else 30)
    warm_up()
    result = run(n_rounds)
    ms = result["per_model_step_ms"]
    table(
        f"Case 14: {MEMBERS} digits CNNs, AdamW at {MEMBERS} learning rates, "
        f"batch {BATCH} each: ms per model step (median of {n_rounds} rounds)",
        [
            ("one vmapped step of the population / 8", ms["population"]),
            ("8 sequential steps / 8", ms["sequential"]),
            ("sequential / population", result["sequential_over_population"]),
        ],
        ("variant", "ms per model step"),
    )
    save("population", {"quick": args.quick, **result})
    return result


if __name__ == "__main__":
    main()
