"""Case 2: many leaves. AdamW on 2000 leaves of 1000 floats, and on a
transformer-shaped tree (12 blocks of attention/MLP weights, biases and norm scales,
plus embeddings: 148 leaves, 24.4M parameters).

Compile cost is split into tracing + lowering to StableHLO and the XLA backend
compile, read from JAX's own compile events during the first call (so nothing is
compiled twice), each after a full garbage collection. Step times are medians of
interleaved calls.
"""

import gc
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax

import eqxopt
from _common import Stepper, interleaved, ms, rounds, save, table

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


class CompileEvents:
    """Sums JAX's compile-phase durations while active."""

    NAMES: ClassVar[dict[str, str]] = {
        "/jax/core/compile/jaxpr_trace_duration": "trace_s",
        "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
        "/jax/core/compile/backend_compile_duration": "compile_s",
    }

    def __init__(self):
        self.active = False
        self.totals = dict.fromkeys(self.NAMES.values(), 0.0)
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        if self.active and event in self.NAMES:
            self.totals[self.NAMES[event]] += duration_secs

    def measure(self, fn):
        # A full collection of Python's garbage (the earlier variants' traces) would
        # land in whichever variant happened to trigger it: half a second after
        # the 2000-leaf case, more than a whole trace.
        gc.collect()
        self.totals = dict.fromkeys(self.NAMES.values(), 0.0)
        self.active = True
        try:
            jax.block_until_ready(fn())
        finally:
            self.active = False
        return dict(self.totals)


def optax_step(tx, donate):
    def step(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    return jax.jit(step, donate_argnums=(0, 1) if donate else ())


def xla_only_step(opt, donate):
    """eqxopt's step with the native kernels off, as XLA compiled it: a `jax.jit`
    traced while they are off keeps that code afterwards."""

    def step(p, s, g):
        return opt.step(g, s, p)

    return jax.jit(step, donate_argnums=(0, 1) if donate else ())


def run_tree(label, params, donated, events, n_rounds):
    grads = jax.tree.map(lambda x: x * 0.01, params)
    opt = eqxopt.AdamW(LR, weight_decay=WD)
    tx = optax.adamw(LR, weight_decay=WD)
    copy = lambda: jax.tree.map(lambda x: jnp.array(x, copy=True), params)  # noqa: E731
    steppers, compile_rows = {}, {}
    variants = [(False, "")] + ([(True, " donate")] if donated else [])
    packed_grads = eqxopt.pack(grads)
    for donate, suffix in variants:
        # The same parameters packed into one buffer (eqxopt.pack, opt-in layout).
        name = "eqxopt packed" + suffix
        pp, ps = eqxopt.pack(copy()), opt.init(eqxopt.pack(params))
        compile_rows[name] = events.measure(
            lambda pp=pp, ps=ps, d=donate: opt.step(packed_grads, ps, pp, donate=d)
        )
        steppers[name] = Stepper(
            lambda s, d=donate: opt.step(packed_grads, s[1], s[0], donate=d),
            (eqxopt.pack(copy()), opt.init(eqxopt.pack(params))),
        )
        # XLA's own code for the same tree step (native kernels off).
        name = "eqxopt step xla" + suffix
        eqxopt.set_native_kernels(False)
        try:
            f = xla_only_step(opt, donate)
            os0, p1 = opt.init(params), copy()
            compile_rows[name] = events.measure(
                lambda f=f, os0=os0, p1=p1: f(p1, os0, grads)
            )
        finally:
            eqxopt.set_native_kernels(True)
        steppers[name] = Stepper(
            lambda s, f=f: f(s[0], s[1], grads), (copy(), opt.init(params))
        )
        name = "eqxopt step" + suffix
        st, p0 = opt.init(params), copy()
        compile_rows[name] = events.measure(
            lambda st=st, p0=p0, d=donate: opt.step(grads, st, p0, donate=d)
        )
        steppers[name] = Stepper(
            lambda s, d=donate: opt.step(grads, s[1], s[0], donate=d),
            (copy(), opt.init(params)),
        )
        f = optax_step(tx, donate)
        os0, p1 = tx.init(params), copy()
        compile_rows["optax jit" + suffix] = events.measure(
            lambda f=f, os0=os0, p1=p1: f(p1, os0, grads)
        )
        steppers["optax jit" + suffix] = Stepper(
            lambda s, f=f: f(s[0], s[1], grads), (copy(), tx.init(params))
        )
    med = interleaved(steppers, n_rounds)
    n_leaves = len(jax.tree.leaves(params))
    n_params = sum(x.size for x in jax.tree.leaves(params))
    rows = []
    for name, t in med.items():
        ref = "optax jit" + (" donate" if name.endswith(" donate") else "")
        c, cref = compile_rows[name], compile_rows[ref]
        rows.append(
            (
                name,
                ms(t),
                t / med[ref],
                c["trace_s"] + c["lower_s"],
                c["compile_s"],
                c["compile_s"] / cref["compile_s"],
                (c["trace_s"] + c["lower_s"] + c["compile_s"])
                / (cref["trace_s"] + cref["lower_s"] + cref["compile_s"]),
            )
        )
    table(
        f"Case 2: {label} ({n_leaves} leaves, {n_params / 1e6:.1f}M params), AdamW",
        rows,
        (
            "variant",
            "step ms",
            "step / optax",
            "trace+lower s",
            "compile s",
            "compile / optax",
            "all compile / optax",
        ),
    )
    return {
        "leaves": n_leaves,
        "params": int(n_params),
        "step_ms": {k: ms(v) for k, v in med.items()},
        "compile": compile_rows,
    }


def main():
    events = CompileEvents()
    # A first use on a new machine builds the native kernels (about 5 s, plus a
    # fraction of a second per optimizer rule; cached on disk after that): do it
    # before timing, as every later run would find them built.
    warm = {"w": jnp.ones(3)}
    opt = eqxopt.AdamW(LR, weight_decay=WD)
    jax.block_until_ready(opt.step(warm, opt.init(warm), warm))
    results = {
        "many_2000x1000": run_tree(
            "2000 x 1000 leaves", many_leaves(), False, events, rounds(11)
        ),
        "transformer": run_tree(
            "transformer-shaped tree", transformer(), True, events, rounds(11)
        ),
    }
    save("many_leaves", results)
    return results


if __name__ == "__main__":
    main()
