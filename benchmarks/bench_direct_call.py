"""Case 15: the cost of a direct `opt.step` (outside the user's own `jit`) of AdamW
on an Equinox MLP, against optax under `jax.jit` and `eqx.filter_jit` of the same
`opt.step`, on a 6-leaf MLP and a 200-leaf one (100 layers); its first call
(trace, lowering and XLA's compile) against optax's; its trace and lowering with
the annotations checked by jaxtyping and beartype against without; and the Python
calls a first and a later `opt.step` make (cProfile).

Each per-call figure is the median over interleaved rounds of the mean of a burst
of calls (waited for at the end of the burst, as a training loop waits for its
loss). The first calls are repeated with JAX's caches cleared before each,
interleaved with optax's (`repeated_compiles`).

Usage: `python benchmarks/bench_direct_call.py` (`EQXOPT_NATIVE=0` for XLA's path;
a direct non-donated step runs XLA's code either way).
"""

import cProfile
import pstats
import statistics
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import eqxopt
from _common import CompileEvents, repeated_compiles, rounds, save, table

LR = 1e-3


def mlp(depth: int) -> eqx.nn.MLP:
    return eqx.nn.MLP(16, 16, 32, depth, key=jax.random.key(0))


def burst(fn, carry, n):
    start = time.perf_counter()
    for _ in range(n):
        carry = fn(carry)
    jax.block_until_ready(carry)
    return (time.perf_counter() - start) / n, carry


def variants(model):
    """`name -> (step(carry) -> carry, first carry)` for each way of stepping."""
    params, static = eqx.partition(model, eqx.is_array)
    grads = jax.tree.map(lambda x: 0.01 * jnp.ones_like(x), params)
    opt = eqxopt.AdamW(LR)
    tx = optax.adamw(LR)

    @jax.jit
    def optax_step(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    filter_step = eqx.filter_jit(lambda o, g, s, m: o.step(g, s, m))
    model_grads = eqx.combine(grads, jax.tree.map(lambda _: None, static))
    return {
        "eqxopt opt.step": (
            lambda c: opt.step(model_grads, c[1], c[0]),
            (model, opt.init(model)),
        ),
        "eqx.filter_jit(opt.step)": (
            lambda c: filter_step(opt, model_grads, c[1], c[0]),
            (model, opt.init(model)),
        ),
        "optax jax.jit step": (
            lambda c: optax_step(c[0], c[1], grads),
            (params, tx.init(params)),
        ),
    }


def per_call(label, model, n_calls):
    fns = variants(model)
    carries = {}
    for name, (fn, c0) in fns.items():
        _, carries[name] = burst(fn, c0, 3)
    times = {name: [] for name in fns}
    for _ in range(rounds(15)):
        for name, (fn, _) in fns.items():
            t, carries[name] = burst(fn, carries[name], n_calls)
            times[name].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    optax_t = med["optax jax.jit step"]
    filter_t = med["eqx.filter_jit(opt.step)"]
    table(
        f"Case 15: direct-call cost per step, {label}",
        [(k, v * 1e6, v / optax_t, v / filter_t) for k, v in med.items()],
        ("variant", "us per call", "/ optax jax.jit", "/ eqx.filter_jit"),
    )
    return {
        "us": {k: v * 1e6 for k, v in med.items()},
        "vs_optax_jit": med["eqxopt opt.step"] / optax_t,
        "vs_filter_jit": med["eqxopt opt.step"] / filter_t,
    }


def first_calls(label, model, events):
    params, static = eqx.partition(model, eqx.is_array)
    grads = jax.tree.map(lambda x: 0.01 * jnp.ones_like(x), params)
    model_grads = eqx.combine(grads, jax.tree.map(lambda _: None, static))
    opt = eqxopt.AdamW(LR)
    state = opt.init(model)
    tx = optax.adamw(LR)
    optax_state = tx.init(params)

    def optax_first():
        @jax.jit
        def optax_step(p, s, g):
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s

        return optax_step(params, optax_state, grads)

    def eqxopt_first():
        return opt.step(model_grads, state, model)

    out = repeated_compiles(
        {"eqxopt": eqxopt_first, "optax": optax_first}, events, rounds(7)
    )
    ratio = out["eqxopt"]["vs_optax"]
    print(
        f"{label}: first call {out['eqxopt']['total_s'] * 1e3:.0f} ms, "
        f"{ratio['total']:.2f}x optax's (trace+lower {ratio['trace_lower']:.2f}x, "
        f"compile {ratio['compile']:.2f}x)"
    )
    return out


def checking_overhead(label, model, events):
    """Trace + lowering of a first `opt.step` with the annotations checked
    (jaxtyping and beartype, the default) and with them off
    (`jaxtyping_disable`), JAX's caches cleared before each, interleaved."""
    import jaxtyping

    from eqxopt._core import _compile

    params, static = eqx.partition(model, eqx.is_array)
    grads = eqx.combine(
        jax.tree.map(lambda x: 0.01 * jnp.ones_like(x), params),
        jax.tree.map(lambda _: None, static),
    )
    opt = eqxopt.AdamW(LR)
    state = opt.init(model)
    times = {"checked": [], "unchecked": []}
    for _ in range(rounds(9)):
        for name in times:
            jaxtyping.config.update("jaxtyping_disable", name == "unchecked")
            jax.clear_caches()
            _compile.clear_caches()
            try:
                _, phases = events.measure(lambda: opt.step(grads, state, model))
            finally:
                jaxtyping.config.update("jaxtyping_disable", False)
            times[name].append(phases["trace_s"] + phases["lower_s"])
    ratios = [c / u for c, u in zip(times["checked"], times["unchecked"])]
    ratio = statistics.median(ratios)
    print(
        f"{label}: trace + lower with the annotations checked "
        f"{statistics.median(times['checked']) * 1e3:.0f} ms, without "
        f"{statistics.median(times['unchecked']) * 1e3:.0f} ms: {ratio:.2f}x"
    )
    return {
        "checked_ms": statistics.median(times["checked"]) * 1e3,
        "unchecked_ms": statistics.median(times["unchecked"]) * 1e3,
        "ratio": ratio,
    }


def python_calls(model):
    """Function calls (cProfile) of a first `opt.step` and of a later one."""
    params, static = eqx.partition(model, eqx.is_array)
    grads = eqx.combine(
        jax.tree.map(lambda x: 0.01 * jnp.ones_like(x), params),
        jax.tree.map(lambda _: None, static),
    )
    opt = eqxopt.AdamW(LR)
    state = opt.init(model)
    jax.clear_caches()
    counts = {}
    for name in ("first", "later"):
        profile = cProfile.Profile()
        profile.enable()
        model2, state2 = opt.step(grads, state, model)
        profile.disable()
        jax.block_until_ready((model2, state2))
        counts[name] = pstats.Stats(profile).total_calls  # pyright: ignore
    print(f"Python calls: first opt.step {counts['first']}, later {counts['later']}")
    return counts


def main():
    events = CompileEvents()
    results = {}
    for label, depth, n_calls in [
        ("6-leaf MLP", 2, 300),
        ("200-leaf MLP", 99, 20),
    ]:
        model = mlp(depth)
        results[label] = {
            "per_call": per_call(label, model, n_calls),
            "first_call": first_calls(label, model, events),
            "checking": checking_overhead(label, model, events),
        }
    results["python_calls"] = python_calls(mlp(2))
    save("direct_call", results)
    return results


if __name__ == "__main__":
    main()
