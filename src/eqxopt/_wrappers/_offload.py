"""Optimizer state held in host memory between steps (JAX's memory kinds)."""

from typing import Any

import jax

from .._core._base import AbstractTransform, Grads, Params, State, Updates
from .._core._jax_api import is_tracer
from .._core._placement import place_state
from ._wrapper import AbstractSingleWrapper, inner_field

# Page-locked host memory, which an accelerator copies from directly.
_HOST = "pinned_host"
_SPACES = {_HOST: "Host", "device": "Device"}


def _to(memory_kind: str, x: Any) -> Any:
    if not isinstance(x, jax.Array) or x.ndim == 0:
        # Scalars (step counters, statistics) stay in device memory: they are
        # small, and a donated step pairs its buffers with its outputs by shape
        # and dtype, which would give Equinox's 0-d device output a host buffer.
        return x
    return _move(memory_kind, x)


def _move(memory_kind: str, x: Any) -> Any:
    """`x` moved to `memory_kind`: under a trace, a transfer inside the compiled
    step (XLA schedules it beside the compute); eagerly, a `device_put` keeping
    `x`'s devices and layout over them."""
    if not isinstance(x, jax.Array):
        return x
    if is_tracer(x):
        return jax.device_put(x, getattr(jax.memory.Space, _SPACES[memory_kind]))
    return jax.device_put(x, x.sharding.with_memory_kind(memory_kind))


class OffloadState(AbstractSingleWrapper):
    r"""Keeps `inner`'s state in host memory between steps and streams it through
    the accelerator in the step (as torchao's `CPUOffloadOptimizer` and
    bitsandbytes' paged optimizers do for torch): the state's arrays live in the
    host memory kind of the parameters' devices (`pinned_host`), are copied to
    device memory inside the compiled step, updated there, and written back.
    Device memory then holds the state only while a step runs, leaf by leaf as XLA
    schedules the copies beside the compute. The numbers are `inner`'s exactly.

    It pays off where device memory is scarce and the step's compute hides the
    copies (large models on GPUs and TPUs); on a CPU, host and device memory are
    the same RAM, and the state simply carries the `pinned_host` memory kind.
    `step(..., donate=True)` donates as usual; `update(..., donate=True)` and
    `make_train_step`'s steps donate nothing while the state is offloaded (JAX
    pairs donated buffers with outputs by shape and dtype, not memory kind), so
    the parameters are written to new buffers there. Scalars (step counters)
    stay in device memory. A
    bf16 run with a float32 master copy in the state (`StochasticRounding`,
    `KahanSummation` compensations, `MultiSteps`' accumulator) offloads that too.

    **Arguments:**

    - `inner`: the optimizer whose state is offloaded (any eqxopt transform).

    **Example:**

    ```python
    import jax
    import jax.numpy as jnp
    import eqxopt

    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    opt = eqxopt.OffloadState(eqxopt.AdamW(1e-3))
    state = opt.init(params)
    assert state.mu["w"].sharding.memory_kind == "pinned_host"
    params, state = opt.step(jax.tree.map(jnp.ones_like, params), state, params)
    ```
    """

    inner: AbstractTransform = inner_field()

    reads_params = None  # `inner`'s reads are its own (`params_needed`)
    reduces_over = "nothing"  # it moves the state, leaf by leaf

    def state_in_host_memory(self) -> bool:
        return True

    def init(self, params: Params) -> State:
        # Placed as `inner`'s own state would be (`place_state`), then moved: JAX
        # names the device that has no such memory.
        state = place_state(self.inner.init(params), params)
        return jax.tree.map(lambda x: _to(_HOST, x), state)

    def transform(
        self, grads: Grads, state: State, params: Params, **extra: Any
    ) -> tuple[Updates, State]:
        self.check_keywords(extra)
        on_device = jax.tree.map(lambda x: _to("device", x), state)
        updates, new = self.inner.transform(grads, on_device, params, **extra)
        return updates, jax.tree.map(lambda x: _to(_HOST, x), new)

    def transform_step(
        self, grads: Grads, state: State, params: Params, **extra: Any
    ) -> tuple[Params, State]:
        # `inner`'s own step, so a per-leaf optimizer keeps its fused pass.
        self.check_keywords(extra)
        on_device = jax.tree.map(lambda x: _to("device", x), state)
        new_params, new = self.inner.transform_step(grads, on_device, params, **extra)
        return new_params, jax.tree.map(lambda x: _to(_HOST, x), new)
