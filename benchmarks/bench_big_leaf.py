"""Case 1: one big leaf (16M float32), AdamW and SGD-momentum.

eqxopt `opt.step` (plain and `donate=True`) vs optax under `jax.jit` (with and
without donating params and state), torch.optim `fused=True` and `foreach=True`, and
the memory floor: a donated jitted op moving the same bytes per parameter as the
optimizer must (AdamW: read p, g, mu, nu and write p, mu, nu = 28 bytes; SGD with
momentum: read p, g, v and write p, v = 20 bytes), on one core (XLA's code) and on
all cores (the same op as eqxopt's native loop, and as torch in-place ops).
"""

import os
import sys
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
from jaxtyping import Array, Int

import eqxopt
from _common import Stepper, interleaved, ms, rounds, save, table
from eqxopt._core._fields import learning_rate_field
from eqxopt._core._leafwise import AbstractLeafwiseOptimizer

N = 16_000_000
# run_all.py runs this case a second time with XLA's CPU multi-output fusion turned
# on (a process-wide flag: XLA_FLAGS=--xla_backend_extra_options=
# xla_cpu_use_multi_output_fusion), which fuses the mu and nu updates into one pass.
MOF = "xla_cpu_use_multi_output_fusion" in os.environ.get("XLA_FLAGS", "")
MOF_NOTE = " (XLA multi-output fusion on)" if MOF else ""
LR, WD, MOMENTUM = 1e-3, 1e-2, 0.9
# An untimed pause before each call: without it, the variant placed after a
# non-donated one (which allocates new 64 MB outputs and frees the old ones) ran
# slower than in any other place of the round (a transient its predecessor leaves,
# most likely the freeing), which alone put AdamW donated (placed there) above the
# all-cores floor.
SETTLE_S = 0.1


def optax_step(tx, donate):
    def step(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    return jax.jit(step, donate_argnums=(0, 1) if donate else ())


def floor_fn(n_moments):
    def floor(p, g, moments, c):
        return p + c * g, tuple(m * c for m in moments)

    return jax.jit(floor, donate_argnums=(0, 2))


class _FloorState(eqx.Module):
    step: Int[Array, ""]
    m0: Any
    m1: Any = None


class _FloorRule(AbstractLeafwiseOptimizer):
    """The floor's arithmetic as a built-in element-wise optimizer (the engine's
    private per-leaf base: a transform written with the public `map_leaves` adds
    the update to the parameter in a second pass, outside the kernel), so that a
    donated `step` runs it as eqxopt's native loop in one pass over the same bytes
    on every core: `p + c * g`, each moment times `c`."""

    learning_rate: Any = learning_rate_field()
    n_moments: int = eqx.field(static=True)
    state_type = _FloorState
    elementwise = True

    @property
    def moments(self):  # pyright: ignore
        return ("m0", "m1")[: self.n_moments]

    def leaf(self, h, t, g, p, *moments):
        c = h.learning_rate
        return (c * g, *(m * c for m in moments))


def threaded_floor_steppers(p0, g0, n_moments, copy) -> dict:
    """The memory floor on all cores: the floor's op as eqxopt's native loop (one
    pass), and as torch in-place ops (one multi-threaded pass per array written)."""
    c = 0.999
    out = {}
    if eqxopt.native_kernels_available():
        rule = _FloorRule(jnp.float32(c), n_moments)
        state = rule.init(copy())

        def native(s, rule=rule):
            return rule.step(g0, s[1], s[0], donate=True)

        out["memory floor, all cores (native loop)"] = Stepper(native, (copy(), state))
    tp = torch.from_numpy(np.array(p0))
    tg = torch.from_numpy(np.array(g0))
    tm = [torch.zeros(N) for _ in range(n_moments)]

    def torch_floor(_):
        tp.add_(tg, alpha=c)
        for m in tm:
            m.mul_(c)
        return None

    out[
        f"memory floor, all cores (torch in-place, {torch.get_num_threads()} threads)"
    ] = Stepper(torch_floor, None)
    return out


def torch_stepper(kind, opt_name, p0, g0):
    tp = torch.nn.Parameter(torch.from_numpy(np.array(p0)))
    tp.grad = torch.from_numpy(np.array(g0))
    fused, foreach = kind == "fused", kind == "foreach"
    if opt_name == "adamw":
        topt = torch.optim.AdamW(
            [tp], lr=LR, weight_decay=WD, fused=fused, foreach=foreach
        )
    else:
        topt = torch.optim.SGD(
            [tp], lr=LR, momentum=MOMENTUM, fused=fused, foreach=foreach
        )

    def run(_):
        topt.step()
        return None

    return Stepper(run, None)


def main() -> dict:
    rng = np.random.default_rng(0)
    p0 = jnp.asarray(rng.normal(size=N), jnp.float32)
    g0 = jnp.asarray(rng.normal(size=N), jnp.float32)
    results: dict[str, Any] = {"threads": torch.get_num_threads()}
    for name, opt, tx, n_mom in [
        (
            "adamw",
            eqxopt.AdamW(LR, weight_decay=WD),
            optax.adamw(LR, weight_decay=WD),
            2,
        ),
        (
            "sgd_momentum",
            eqxopt.SGD(LR, momentum=MOMENTUM),
            optax.sgd(LR, momentum=MOMENTUM),
            1,
        ),
    ]:
        copy = lambda: jnp.array(p0, copy=True)  # noqa: E731
        steppers = {}

        def eqx_plain(s, opt=opt):
            return opt.step(g0, s[1], s[0])

        def eqx_donated(s, opt=opt):
            return opt.step(g0, s[1], s[0], donate=True)

        steppers["eqxopt step"] = Stepper(eqx_plain, (copy(), opt.init(p0)))
        steppers["eqxopt step donate"] = Stepper(
            eqx_donated, (copy(), opt.init(copy()))
        )
        # XLA's own code for the same step (native kernels off while it compiles).
        eqxopt.set_native_kernels(False)
        try:
            xla_step = jax.jit(
                lambda p, s, opt=opt: opt.step(g0, s, p), donate_argnums=(0, 1)
            )
            xla_state = (copy(), opt.init(copy()))
            xla_state = xla_step(*xla_state)
        finally:
            eqxopt.set_native_kernels(True)
        steppers["eqxopt step donate, xla"] = Stepper(
            lambda s, f=xla_step: f(s[0], s[1]), xla_state
        )
        for donate in (False, True):
            f = optax_step(tx, donate)
            steppers[f"optax jit{' donate' if donate else ''}"] = Stepper(
                lambda s, f=f: f(s[0], s[1], g0), (copy(), tx.init(copy()))
            )
        fl = floor_fn(n_mom)
        c = jnp.float32(0.999)
        steppers["memory floor"] = Stepper(
            lambda s, fl=fl, c=c: fl(s[0], g0, s[1], c),
            (copy(), tuple(jnp.zeros(N) for _ in range(n_mom))),
        )
        steppers.update(threaded_floor_steppers(p0, g0, n_mom, copy))
        for kind in ("fused", "foreach") if not MOF else ():
            try:
                steppers[f"torch {kind}"] = torch_stepper(kind, name, p0, g0)
            except (RuntimeError, TypeError) as e:  # not every torch build has both
                print(f"torch {kind} {name} unavailable: {e}", file=sys.stderr)
        med = interleaved(steppers, rounds(15), settle=SETTLE_S)
        ref = med["optax jit donate"]
        floors = [k for k in med if "native loop" in k]
        ref_all = med[floors[0]] if floors else float("nan")
        rows = [
            (k, ms(v), v / ref, v / med["memory floor"], v / ref_all)
            for k, v in med.items()
        ]
        table(
            f"Case 1{MOF_NOTE}: one 16M-float32 leaf, {name} step "
            "(median of interleaved runs)",
            rows,
            (
                "variant",
                "ms",
                "/ optax jit donate",
                "/ memory floor",
                "/ floor on all cores",
            ),
        )
        results[name] = {k: ms(v) for k, v in med.items()}
    save("big_leaf_multi_output_fusion" if MOF else "big_leaf", results)
    return results


if __name__ == "__main__":
    main()
