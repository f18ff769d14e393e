"""Case 5: memory of the compiled step, from XLA's memory analysis: bytes of
temporaries, of outputs, and of outputs written into donated inputs (aliased), for
AdamW on one 16M-float32 leaf and on the transformer-shaped tree, with and without
donation, eqxopt (the program `opt.step` runs, `opt.step.lower`, on each path: its
native CPU kernels and XLA's own code) vs optax."""

import jax
import jax.numpy as jnp
import optax

import eqxopt
from _common import kernel_path, kernel_paths, save, table
from bench_many_leaves import transformer

LR, WD = 1e-3, 1e-2
MB = 2**20


def analysis(compiled):
    m = compiled.memory_analysis()
    return {
        "temp_MB": m.temp_size_in_bytes / MB,
        "output_MB": m.output_size_in_bytes / MB,
        "aliased_MB": m.alias_size_in_bytes / MB,
    }


def main():
    results = {}
    rows = []
    for label, params in [
        ("one 16M leaf", jnp.zeros(16_000_000, jnp.float32)),
        ("transformer tree", transformer()),
    ]:
        grads = params
        opt = eqxopt.AdamW(LR, weight_decay=WD)
        tx = optax.adamw(LR, weight_decay=WD)
        param_mb = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params)) / MB

        def optax_step(p, s, g, tx=tx):
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s

        for donate in (False, True):
            d = " donate" if donate else ""
            found = {}
            for path in kernel_paths():
                with kernel_path(path):
                    lowered = opt.step.lower(
                        grads, opt.init(params), params, donate=donate
                    )
                    found[f"eqxopt step {path}{d}"] = analysis(lowered.compile())
            found[f"optax jit{d}"] = analysis(
                jax.jit(optax_step, donate_argnums=(0, 1) if donate else ())
                .lower(params, tx.init(params), grads)
                .compile()
            )
            for name, r in found.items():
                results[f"{label}, {name}"] = r
                rows.append(
                    (
                        label,
                        name,
                        param_mb,
                        r["temp_MB"],
                        r["output_MB"],
                        r["aliased_MB"],
                    )
                )
    table(
        "Case 5: compiled step memory (XLA memory analysis), AdamW",
        rows,
        ("tree", "variant", "params MB", "temporaries MB", "outputs MB", "aliased MB"),
    )
    save("memory", results)
    return results


if __name__ == "__main__":
    main()
