"""Case 3: the cost of calling `opt.step` / `opt.update` directly (not inside the
user's own `jit`), on a tiny tree (2 leaves of 4 floats) and on a 500-leaf tree of
4 floats each, against a `jax.jit`-compiled optax step and an `eqx.filter_jit`-wrapped
eqxopt step. Each figure is the median over rounds of the mean of a burst of calls
(the burst is waited for at its end, as a training loop would)."""

import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import eqxopt
from _common import ms, rounds, save, table

LR = 1e-3


def burst(fn, state, n):
    start = time.perf_counter()
    for _ in range(n):
        state = fn(state)
    jax.block_until_ready(state)
    return (time.perf_counter() - start) / n, state


def run_case(label, n_leaves, n_calls):
    params = {f"w{i}": jnp.full((4,), 1.0 + i) for i in range(n_leaves)}
    grads = jax.tree.map(lambda x: x * 0.1, params)
    opt = eqxopt.AdamW(LR)
    tx = optax.adamw(LR)

    @jax.jit
    def optax_step(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    filter_step = eqx.filter_jit(lambda o, g, s, p: o.step(g, s, p))
    fns = {
        "eqxopt opt.step": (
            lambda s: opt.step(grads, s[1], s[0]),
            (params, opt.init(params)),
        ),
        "eqx.filter_jit(opt.step)": (
            lambda s: filter_step(opt, grads, s[1], s[0]),
            (params, opt.init(params)),
        ),
        "optax jax.jit step": (
            lambda s: optax_step(s[0], s[1], grads),
            (params, tx.init(params)),
        ),
    }
    # opt.update alone (the updates are not applied: this measures the call).
    fns["eqxopt opt.update"] = (
        lambda s: (s[0], opt.update(grads, s[1], s[0])[1]),
        (params, opt.init(params)),
    )
    states = {}
    for name, (fn, s0) in fns.items():
        _, states[name] = burst(fn, s0, 3)  # compile and warm up
    times = {name: [] for name in fns}
    for _ in range(rounds(11)):
        for name, (fn, _) in fns.items():
            t, states[name] = burst(fn, states[name], n_calls)
            times[name].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    ref = med["optax jax.jit step"]
    table(
        f"Case 3: direct-call cost per step, {label}",
        [(k, v * 1e6, v / ref) for k, v in med.items()],
        ("variant", "us per call", "/ optax jax.jit step"),
    )
    return {k: ms(v) for k, v in med.items()}


def main():
    results = {}
    for label, n_leaves, n_calls in [
        ("tiny tree (2 leaves)", 2, 500),
        ("500 leaves", 500, 20),
    ]:
        results[label] = run_case(label, n_leaves, n_calls)
    save("overhead", results)
    return results


if __name__ == "__main__":
    main()
