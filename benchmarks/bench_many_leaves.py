"""Case 2: many leaves. AdamW on 2000 leaves of 1000 floats, and on a
transformer-shaped tree (12 blocks of attention/MLP weights, biases and norm scales,
plus embeddings: 148 leaves, 24.4M parameters), as a tree and packed
(`eqxopt.pack`), on each path eqxopt's steps can run (its native CPU kernels, XLA's
own code), against optax under `jax.jit`.

Compile cost is split into tracing + lowering to StableHLO and the XLA backend
compile, read from JAX's own compile events during the first call (so nothing is
compiled twice), each after a full garbage collection. Each path is a phase (the
switch drops eqxopt's compiled steps): its variants' first calls, then interleaved
calls of its variants and optax; step / optax is the median of the per-round
ratios.
"""

import statistics

import jax
import jax.numpy as jnp
import numpy as np
import optax

import eqxopt
from _common import (
    CompileEvents,
    Stepper,
    first_call_ratios,
    interleaved,
    kernel_path,
    kernel_paths,
    ms,
    rounds,
    save,
    table,
    warm_up,
)

LR, WD = 1e-3, 1e-2


def many_leaves(n=2000, size=1000):
    rng = np.random.default_rng(0)
    return {
        f"w{i:04d}": jnp.asarray(rng.normal(size=size), jnp.float32) for i in range(n)
    }


def transformer(blocks=12, d=384, vocab=8192, seq=512):
    rng = np.random.default_rng(0)

    def w(*shape):
        return jnp.asarray(rng.normal(size=shape) * 0.02, jnp.float32)

    tree = {
        "embed": w(vocab, d),
        "pos": w(seq, d),
        "ln_f": {"scale": w(d), "bias": w(d)},
    }
    tree["blocks"] = [
        {
            "ln1": {"scale": w(d), "bias": w(d)},
            "attn": {
                "qkv": w(d, 3 * d),
                "qkv_b": w(3 * d),
                "out": w(d, d),
                "out_b": w(d),
            },
            "ln2": {"scale": w(d), "bias": w(d)},
            "mlp": {
                "up": w(d, 4 * d),
                "up_b": w(4 * d),
                "down": w(4 * d, d),
                "down_b": w(d),
            },
        }
        for _ in range(blocks)
    ]
    return tree


def optax_step(tx, donate):
    def step(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    return jax.jit(step, donate_argnums=(0, 1) if donate else ())


def run_tree(label, params, donated, events, n_rounds, paths):
    grads = jax.tree.map(lambda x: x * 0.01, params)
    opt = eqxopt.AdamW(LR, weight_decay=WD)
    tx = optax.adamw(LR, weight_decay=WD)
    copy = lambda: jax.tree.map(lambda x: jnp.array(x, copy=True), params)  # noqa: E731
    packed_grads = eqxopt.pack(grads)
    suffixes = {False: ""} | ({True: " donate"} if donated else {})
    compile_rows, steps, ratios = {}, {}, {}
    # optax first (its programs keep their code whatever the path), then each path:
    # switching it drops eqxopt's compiled steps, so each phase compiles its own.
    references = {}
    for donate, suffix in suffixes.items():
        f = optax_step(tx, donate)
        args = (copy(), tx.init(params), grads)
        _, compile_rows["optax jit" + suffix] = events.measure(
            lambda f=f, args=args: f(*args)
        )
        references[donate] = Stepper(
            lambda s, f=f: f(s[0], s[1], grads), (copy(), tx.init(params))
        )
    reference_times = {donate: [] for donate in suffixes}
    for path in paths:
        with kernel_path(path):
            steppers, which = {}, {}
            for donate, suffix in suffixes.items():
                # The same parameters packed into one buffer (eqxopt.pack).
                name = f"eqxopt packed {path}{suffix}"
                pp, ps = eqxopt.pack(copy()), opt.init(eqxopt.pack(params))
                _, compile_rows[name] = events.measure(
                    lambda pp=pp, ps=ps, d=donate: opt.step(
                        packed_grads, ps, pp, donate=d
                    )
                )
                steppers[name] = Stepper(
                    lambda s, d=donate: opt.step(packed_grads, s[1], s[0], donate=d),
                    (eqxopt.pack(copy()), opt.init(eqxopt.pack(params))),
                )
                name = f"eqxopt step {path}{suffix}"
                st, p0 = opt.init(params), copy()
                _, compile_rows[name] = events.measure(
                    lambda st=st, p0=p0, d=donate: opt.step(grads, st, p0, donate=d)
                )
                steppers[name] = Stepper(
                    lambda s, d=donate: opt.step(grads, s[1], s[0], donate=d),
                    (copy(), opt.init(params)),
                )
                which.update({n: donate for n in list(steppers)[-2:]})
            for donate, suffix in suffixes.items():
                steppers["optax jit" + suffix] = references[donate]
            med = interleaved(steppers, n_rounds)
            for name, donate in which.items():
                ref = references[donate].times
                steps[name] = med[name]
                ratios[name] = statistics.median(
                    t / r for t, r in zip(steppers[name].times, ref)
                )
            for donate in suffixes:
                reference_times[donate] += references[donate].times
    for donate, suffix in suffixes.items():
        steps["optax jit" + suffix] = statistics.median(reference_times[donate])
        ratios["optax jit" + suffix] = 1.0
    n_leaves = len(jax.tree.leaves(params))
    n_params = sum(x.size for x in jax.tree.leaves(params))
    rows = []
    compile_ratios = {}
    for name, t in steps.items():
        ref = "optax jit" + (" donate" if name.endswith(" donate") else "")
        c, cref = compile_rows[name], compile_rows[ref]
        compile_ratios[name] = first_call_ratios(c, cref)
        rows.append(
            (
                name,
                ms(t),
                ratios[name],
                c["trace_s"] + c["lower_s"],
                c["compile_s"],
                compile_ratios[name]["compile"],
                compile_ratios[name]["first_call"],
            )
        )
    table(
        f"Case 2: {label} ({n_leaves} leaves, {n_params / 1e6:.1f}M params), AdamW"
        " (step / optax: the median of the per-round ratios, in the path's rounds)",
        rows,
        (
            "variant",
            "step ms",
            "step / optax",
            "trace+lower s",
            "compile s",
            "compile / optax",
            "first call / optax",
        ),
    )
    return {
        "leaves": n_leaves,
        "params": int(n_params),
        "paths": list(paths),
        "step_ms": {k: ms(v) for k, v in steps.items()},
        "step_vs_optax": ratios,
        "compile": compile_rows,
        "compile_vs_optax": compile_ratios,
    }


def main():
    events = CompileEvents()
    warm_up()
    paths = kernel_paths()
    results = {
        "many_2000x1000": run_tree(
            "2000 x 1000 leaves", many_leaves(), False, events, rounds(11), paths
        ),
        "transformer": run_tree(
            "transformer-shaped tree", transformer(), True, events, rounds(11), paths
        ),
    }
    save("many_leaves", results)
    return results


if __name__ == "__main__":
    main()
