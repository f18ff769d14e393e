"""Polyak step sizes: SGD whose learning rate comes from the loss value.

`eqxopt.PolyakSGD` sets each step's size to `(f - f_min) / |g|**2` (capped at
`max_learning_rate`), so it needs the loss as well as the gradient. Both come
from one `eqx.filter_value_and_grad` call, and the loss goes to `step` (or
`update`) as the keyword `value=`:

    loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
    model, state = opt.step(grads, state, model, value=loss)

The loss may be the JAX array it is or a Python number: `step` turns numbers
into arrays, so a new loss never recompiles.

This script fits a student MLP to a teacher MLP's outputs (a problem the student
can fit exactly, so `f_min = 0` is right), with PolyakSGD and, for comparison,
plain SGD at a few fixed learning rates, all full batch for the same number of
steps (measured here: PolyakSGD about 2e-5, the best SGD rate about 1e-4, and
SGD at rate 2 diverges). It prints the final losses and exits with status 1 if
PolyakSGD does not reach a loss below 1e-3.

    python examples/polyak_sgd.py [--steps N]
"""

import argparse
import sys

import equinox as eqx
import jax
import jax.numpy as jnp

import eqxopt

TARGET_LOSS = 1e-3


def make_problem(seed: int = 0):
    """Inputs, a teacher's targets and a fresh student model."""
    k_x, k_teacher, k_student = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(k_x, (256, 4))
    teacher = eqx.nn.MLP(4, 1, 8, 1, activation=jnp.tanh, key=k_teacher)
    y = jax.vmap(teacher)(x)
    student = eqx.nn.MLP(4, 1, 32, 2, activation=jnp.tanh, key=k_student)
    return x, y, student


def train(opt: eqxopt.AbstractTransform, steps: int, *, polyak: bool) -> float:
    """Full-batch training; returns the final mean squared error."""
    x, y, model = make_problem()

    def loss_fn(m):
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)

    value_and_grad = eqx.filter_jit(eqx.filter_value_and_grad(loss_fn))
    state = opt.init(model)
    for _ in range(steps):
        loss, grads = value_and_grad(model)
        extra = {"value": loss} if polyak else {}
        model, state = opt.step(grads, state, model, **extra)
    return float(loss_fn(model))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    args = parser.parse_args(argv)

    # The cap is only a safety net here: the Polyak rate needs no tuning.
    polyak = eqxopt.PolyakSGD(max_learning_rate=100.0, f_min=0.0)
    results = {"PolyakSGD": train(polyak, args.steps, polyak=True)}
    for lr in (0.1, 0.5, 2.0):
        results[f"SGD(learning_rate={lr})"] = train(
            eqxopt.SGD(lr), args.steps, polyak=False
        )
    width = max(map(len, results))
    print(f"final training loss after {args.steps} full-batch steps:")
    for name, loss in results.items():
        print(f"  {name:<{width}}  {loss:.3e}")
    ok = results["PolyakSGD"] < TARGET_LOSS
    print(
        ("ok" if ok else "FAILED") + f": PolyakSGD loss below {TARGET_LOSS:g}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
