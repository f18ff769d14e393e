"""Case 4: a loop that changes the learning rate every step. Counts XLA compiles
after the first step for eqxopt (a new `AdamW(lr)` each step), optax (a new
`optax.adamw(lr)` each step under `jax.jit`, the usual pattern) and
`optax.inject_hyperparams` (the learning rate set in the state each step)."""

import jax
import jax.numpy as jnp
import optax

import eqxopt
from _common import CompileCounter, save, table

STEPS = 8


def main():
    params = {"w": jnp.ones((64, 64)), "b": jnp.zeros(64)}
    grads = jax.tree.map(lambda x: x * 0.1 + 0.01, params)
    lrs = [1e-3 * (1 + i) for i in range(STEPS)]
    counter = CompileCounter()
    counts = {}

    # eqxopt: the optimizer is rebuilt with each value; its hyperparameters are data.
    p, state = params, eqxopt.AdamW(lrs[0]).init(params)
    p, state = eqxopt.AdamW(lrs[0]).step(grads, state, p)
    with counter:
        for lr in lrs[1:]:
            p, state = eqxopt.AdamW(lr).step(grads, state, p)
        jax.block_until_ready(p)
    counts["eqxopt AdamW(lr).step"] = counter.count

    # optax: the learning rate is baked into the jitted closure.
    def optax_step(lr):
        tx = optax.adamw(lr)

        @jax.jit
        def step(p, s, g):
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s

        return step

    p, s = params, optax.adamw(lrs[0]).init(params)
    p, s = optax_step(lrs[0])(p, s, grads)
    with counter:
        for lr in lrs[1:]:
            p, s = optax_step(lr)(p, s, grads)
        jax.block_until_ready(p)
    counts["optax.adamw(lr) under jax.jit"] = counter.count

    # optax.inject_hyperparams: the learning rate lives in the state.
    tx = optax.inject_hyperparams(optax.adamw)(learning_rate=lrs[0])

    @jax.jit
    def inject_step(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    p, s = params, tx.init(params)
    p, s = inject_step(p, s, grads)
    with counter:
        for lr in lrs[1:]:
            s.hyperparams["learning_rate"] = jnp.asarray(lr, jnp.float32)
            p, s = inject_step(p, s, grads)
        jax.block_until_ready(p)
    counts["optax.inject_hyperparams"] = counter.count

    table(
        f"Case 4: XLA compiles in {STEPS - 1} steps after the first, "
        "new learning rate each step",
        [(k, v) for k, v in counts.items()],
        ("variant", "compiles"),
    )
    save("recompiles", {"steps_after_first": STEPS - 1, "compiles": counts})
    return counts


if __name__ == "__main__":
    main()
