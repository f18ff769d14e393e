"""A small transformer trained with Shampoo or SOAP under FSDP on 8 devices.

    python examples/fsdp_preconditioned.py [--steps 40]
                                           [--optimizer shampoo|soap]

Every matrix whose first dimension the device count divides is split along it
over a mesh axis "fsdp" (FSDP), the batch too; the rest is replicated.
`opt.init` places the optimizer's state by its parameters: the moments like
them, and the preconditioner (SOAP's statistics and eigenbases, Shampoo's
factors and roots) split over the same devices, so each holds about 1/8 of it.
Each step recomputes the eigenbases or roots of every matrix once on the mesh
(each matrix on one device, in turn) rather than on every device. The script
prints what each device holds, from the arrays' shards and from XLA's memory
analysis of the compiled step, then trains, and trains the same steps on one
device for comparison. With Shampoo the losses agree to float32 rounding (the
devices sum in another order). SOAP's agree to about 1e-3 from its first update
on: that update is Adam's first step in a new eigenbasis, about `lr * sign` of
each rotated coordinate, and rounding moves the eigenvectors of close
eigenvalues, so the signs of coordinates near zero differ (as they would between
two machines).

On a CPU, 8 devices come from
`XLA_FLAGS=--xla_force_host_platform_device_count=8`, which must be set before
JAX starts (this script sets it when it is absent). On GPUs or TPUs, drop that
and build the mesh over `jax.devices()`.
"""

import os

if "xla_force_host_platform_device_count" not in os.environ.get(
    "XLA_FLAGS", ""
):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + " --xla_force_host_platform_device_count=8"
    ).strip()

import argparse
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import eqxopt

# Small enough to train in seconds on a CPU.
VOCAB, WIDTH, HEADS, LAYERS, HIDDEN = 64, 64, 4, 2, 64
HALF, BATCH = 16, 16  # a sequence is HALF random tokens, then the same again


def init_params(key: jax.Array) -> dict[str, Any]:
    def dense(key, n_in, n_out):
        return jax.random.normal(key, (n_in, n_out)) / np.sqrt(n_in)

    keys = iter(jax.random.split(key, 1 + 6 * LAYERS))
    layers = []
    for _ in range(LAYERS):
        layers.append(
            {
                "q": dense(next(keys), WIDTH, WIDTH),
                "k": dense(next(keys), WIDTH, WIDTH),
                "v": dense(next(keys), WIDTH, WIDTH),
                "o": dense(next(keys), WIDTH, WIDTH),
                "up": dense(next(keys), WIDTH, HIDDEN),
                "down": dense(next(keys), HIDDEN, WIDTH),
                "norm1": jnp.ones(WIDTH),
                "norm2": jnp.ones(WIDTH),
            }
        )
    return {
        "embed": jax.random.normal(next(keys), (VOCAB, WIDTH)) * 0.1,
        "layers": layers,
        "norm": jnp.ones(WIDTH),
    }


def norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    return (
        scale
        * x
        * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
    )


def positions(length: int) -> jax.Array:
    # Fixed sinusoidal position encodings (Vaswani et al., 2017).
    angle = np.arange(length)[:, None] / 10000 ** (
        np.arange(0, WIDTH, 2) / WIDTH
    )
    return jnp.asarray(np.concatenate([np.sin(angle), np.cos(angle)], axis=1))


def logits(params: dict[str, Any], tokens: jax.Array) -> jax.Array:
    length = tokens.shape[1]
    x = params["embed"][tokens] + positions(length)
    causal = jnp.tril(jnp.ones((length, length), bool))
    for layer in params["layers"]:
        h = norm(x, layer["norm1"])
        q, k, v = (
            (h @ layer[n]).reshape(*h.shape[:2], HEADS, -1)
            for n in ("q", "k", "v")
        )
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        attended = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(h.shape)
        x = x + attended @ layer["o"]
        h = norm(x, layer["norm2"])
        x = x + jax.nn.gelu(h @ layer["up"]) @ layer["down"]
    return norm(x, params["norm"]) @ params["embed"].T


def loss_fn(params: dict[str, Any], tokens: jax.Array) -> jax.Array:
    # Next-token loss on the repeated half, which attention can copy.
    out = logits(params, tokens[:, :-1])[:, HALF - 1 :]
    target = tokens[:, HALF:]
    picked = jnp.take_along_axis(jax.nn.log_softmax(out), target[..., None], -1)
    return -jnp.mean(picked)


def batches(steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    halves = [rng.integers(0, VOCAB, (BATCH, HALF)) for _ in range(steps)]
    return [np.concatenate([h, h], axis=1).astype(np.int32) for h in halves]


def make_optimizer(name: str) -> Any:
    if name == "soap":
        return eqxopt.SOAP(3e-3, precondition_frequency=10, weight_decay=0.0)
    return eqxopt.Shampoo(3e-3, precondition_frequency=10, eps=1e-6)


def preconditioner_fields(opt: Any) -> tuple[str, ...]:
    return ("gg", "q") if isinstance(opt, eqxopt.SOAP) else ("factors", "roots")


def held(tree: Any) -> tuple[int, int]:
    """The bytes of `tree`'s arrays: all of them, and the most on one device."""
    leaves = jax.tree.leaves(tree)
    per_device: dict[Any, int] = {}
    for x in leaves:
        for shard in x.addressable_shards:
            per_device[shard.device] = (
                per_device.get(shard.device, 0) + shard.data.nbytes
            )
    return sum(x.nbytes for x in leaves), max(per_device.values())


def kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


def train(opt: Any, data: list[np.ndarray], param_where: Any, batch_where: Any):
    params = jax.device_put(init_params(jax.random.key(0)), param_where)
    state = opt.init(params)

    @jax.jit
    def step(params, state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        params, state = opt.step(grads, state, params)
        return params, state, loss

    tokens = jax.device_put(data[0], batch_where)
    compiled = step.lower(params, state, tokens).compile()
    losses = []
    for batch in data:
        params, state, loss = step(
            params, state, jax.device_put(batch, batch_where)
        )
        losses.append(float(loss))
    return params, state, losses, compiled


def main(steps: int = 40, optimizer: str = "shampoo") -> dict[str, Any]:
    devices = jax.devices()
    assert len(devices) >= 8, f"8 devices needed, found {len(devices)}"
    mesh = jax.make_mesh(
        (8,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,)
    )
    opt = make_optimizer(optimizer)
    data = batches(steps)

    def fsdp(x):  # split along the first dimension where 8 divides it
        split = x.ndim >= 2 and x.shape[0] % 8 == 0
        return NamedSharding(mesh, P("fsdp") if split else P())

    shapes = jax.eval_shape(init_params, jax.random.key(0))
    params, state, losses, compiled = train(
        opt, data, jax.tree.map(fsdp, shapes), NamedSharding(mesh, P("fsdp"))
    )
    one = devices[0]
    _, one_state, one_losses, one_compiled = train(opt, data, one, one)

    fields = preconditioner_fields(opt)
    precond = [getattr(state, f) for f in fields]
    one_precond = [getattr(one_state, f) for f in fields]
    whole, most = held(precond)
    state_whole, state_most = held(state)
    params_whole, params_most = held(params)
    figures = {
        "preconditioner_per_device": most / whole,
        "state_per_device": state_most / state_whole,
        "params_per_device": params_most / params_whole,
        "one_device_preconditioner": held(one_precond)[1] / whole,
    }
    name = type(opt).__name__
    print(f"{name} under FSDP on 8 devices, {steps} steps")
    print(
        f"  preconditioner ({', '.join(fields)}): {kib(most)} per device of "
        f"{kib(whole)} ({most / whole:.3f}; one device holds all of it)"
    )
    print(
        f"  whole optimizer state: {kib(state_most)} per device of "
        f"{kib(state_whole)} ({state_most / state_whole:.3f})"
    )
    print(
        f"  parameters: {kib(params_most)} per device of {kib(params_whole)} "
        f"({params_most / params_whole:.3f})"
    )
    for label, c in (("8 devices", compiled), ("1 device", one_compiled)):
        memory = c.memory_analysis()
        if memory is not None:  # XLA's figures for one device's program
            arguments, temporaries = (
                kib(memory.argument_size_in_bytes),
                kib(memory.temp_size_in_bytes),
            )
            print(
                f"  compiled step, {label}: arguments {arguments}, "
                f"temporaries {temporaries} per device"
            )
    # The two runs round differently (sums over devices in another order), and
    # training amplifies that over the steps: compare the first ten losses.
    gap = max(abs(a - b) for a, b in zip(losses[:10], one_losses[:10]))
    print(
        f"  loss {losses[0]:.4f} -> {losses[-1]:.4f} (one device: "
        f"{one_losses[0]:.4f} -> {one_losses[-1]:.4f}; largest gap over the "
        f"first 10 steps {gap:.1e})"
    )
    figures.update(losses=losses, one_device_losses=one_losses)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--optimizer", choices=("shampoo", "soap"), default="shampoo"
    )
    args = parser.parse_args()
    main(args.steps, args.optimizer)
