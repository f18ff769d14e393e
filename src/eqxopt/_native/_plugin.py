"""The native CPU kernels as the engine's backend (`eqxopt._core._backend`).

The entry points tell the backend, for each trace, whether its outputs may overwrite
its inputs (`tracing`); only such in-place steps run the kernels, since a step into
new buffers is bound by their allocation (page faults on every new page), which
XLA's passes pay no worse. The trace's facts are kept for the engine's calls of
`leaf_kernels` within it.
"""

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from .._core import _backend, _storage
from .._core._backend import EntryTrace, LeafResult, NotLowered, TrainStepPlan
from . import _ffi, _fused, _quantized, _shard

_trace: contextvars.ContextVar[EntryTrace | None] = contextvars.ContextVar(
    "eqxopt_native_trace", default=None
)

# Model elements per element of the other inputs (the batch, mostly) from which the
# large gradients, not the activations, set a train step's peak memory.
_GRADIENTS_DOMINATE = 10_000

# XLA:CPU's scheduler that orders a program for the least memory (the default
# orders it for the most concurrency), as a compile option: its newer spelling, then
# the older one (JAX 0.4.38 knows only that one).
_LOW_MEMORY_SCHEDULES = (
    {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"},
    {"xla_cpu_enable_concurrency_optimized_scheduler": False},
)


@functools.cache
def low_memory_schedule() -> tuple[tuple[str, Any], ...]:
    """`compiler_options` (for `jax.jit`, as items) that make XLA:CPU schedule for
    the least memory, in the spelling this XLA takes (tried once on a tiny
    program); `()` where it takes neither."""
    for options in _LOW_MEMORY_SCHEDULES:
        try:
            jax.jit(lambda x: x + 1, compiler_options=options).lower(
                np.float32(0)
            ).compile()
        except Exception:  # this XLA has no such option
            continue
        return tuple(options.items())
    return ()


class _LeafKernels(_backend.AbstractLeafKernels):
    """The kernels of one `map_leaves` call: `_quantized.Kernels` for leaves with
    8-bit/4-bit moments, `_fused.Kernels` for the others. A rule the plain kernels
    cannot run on one leaf runs XLA's code on every later leaf too (the leaves
    already taken keep their kernels)."""

    def __init__(self, plain: _fused.Kernels, quantized: _quantized.Kernels):
        self.plain = plain
        self.quantized = quantized
        self.plain_open = True

    def _for(self, old: Sequence[Any]) -> Any:
        return self.quantized if any(map(_storage.is_quantized, old)) else self.plain

    def refusal(self, g: Any, p: Any, old: Sequence[Any]) -> str | None:
        kernels = self._for(old)
        if kernels is self.quantized:
            if kernels.takes(g, p, old):
                return None
            return (
                "the kernels take float32 gradients and parameters whose stored "
                "moments are Blockwise8bit, Blockwise4bit, Companded8bit or "
                "ErrorCorrectedBf16 and the others float32"
            )
        if not self.plain_open:
            return "the rule could not run on the kernels for an earlier leaf"
        if kernels.takes(g, p, old):
            return None
        dtypes = {np.dtype(x.dtype).name for x in (g, p, *old)}
        if dtypes != {"float32"}:
            found = ", ".join(sorted(dtypes))
            return f"the kernels take float32 leaves and moments (this leaf: {found})"
        return (
            "the kernels do not take this leaf's placement (its moments or gradient "
            "are sharded unlike it, it is inside a shard_map, or its sharding is "
            "not known inside a jit on an Auto mesh)"
        )

    def add(self, index: int, g: Any, p: Any, old: Sequence[Any], flag: tuple) -> None:
        kernels = self._for(old)
        try:
            kernels.add(index, g, p, old, flag)
        except NotLowered:
            if kernels is self.plain:
                self.plain_open = False
            raise

    def finish(self) -> dict[int, LeafResult]:
        return {**self.plain.finish(), **self.quantized.finish()}


class NativeBackend(_backend.AbstractBackend):
    """eqxopt's native CPU kernels (`_ffi`, `_fused`, `_quantized`, `_shard`)."""

    def usable(self) -> bool:
        return _ffi.usable()

    def why_unusable(self) -> str:
        return _ffi.why_unusable()

    def set_enabled(self, enabled: bool) -> None:
        _ffi.set_enabled(enabled)

    def placement(self, leaves: Sequence[Any], shardings: Sequence[Any]) -> Any:
        return _shard.placement(leaves, shardings)

    def typed_placement(self, leaves: Sequence[Any], mesh: Any) -> Any:
        return _shard.typed_placement(leaves, mesh)

    @contextlib.contextmanager
    def tracing(self, trace: EntryTrace) -> Iterator[None]:
        token = _trace.set(trace)
        try:
            yield
        finally:
            _trace.reset(token)

    def leaf_kernels(
        self, rule: Callable[..., Any], n_moments: int, apply: bool, grads: list[Any]
    ) -> _LeafKernels | None:
        trace = _trace.get()
        if trace is None or not trace.in_place:
            return None
        # The gradients computed in this program, for the kernels to wait for
        # (`_fused.waits`): none where they were passed in.
        computed = [None] * len(grads) if trace.grads_given else grads
        locator = _fused.locator(trace.placement, trace.inputs)
        return _LeafKernels(
            _fused.Kernels(rule, n_moments, apply, computed, locator),
            _quantized.Kernels(rule, n_moments, apply, computed),
        )

    def split(self, flat: Any, shapes: tuple[tuple[int, ...], ...]) -> list | None:
        return _ffi.split(flat, shapes)

    def concat(self, parts: list[Any]) -> Any:
        return _ffi.concat(parts)

    def train_step(self, model: list[Any], others: list[Any]) -> TrainStepPlan | None:
        """A step of a model that is large against its batch (such as a transformer
        stepped on a few tokens), where some leaf gets a kernel call of its own, is
        compiled with XLA:CPU's scheduler for the least memory, which makes each
        large gradient just before its in-place update.

        Each such call writes its weight in place, so the weight's buffer stays
        taken until the call, and the default schedule (the most concurrency: every
        gradient as soon as it can be made) holds two of the largest gradients at
        once, where optax's update reuses a weight's buffer for its gradient. The
        low-memory schedule also costs some of the concurrency, which a step of
        much activation work (a CNN on a batch of images, a transformer on many
        tokens) loses more of than it gains in memory; a model of small leaves gains
        nothing (its calls take many leaves each)."""
        sizes = [x.size for x in model]
        if (
            sizes
            and _fused.runs_alone(max(sizes))
            and sum(sizes) >= _GRADIENTS_DOMINATE * sum(x.size for x in others)
        ):
            return TrainStepPlan(low_memory_schedule(), _fused.small_waits)
        return None
