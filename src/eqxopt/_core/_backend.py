"""The one point where a backend plugs into the engine.

Everything in the core runs on XLA's own code, on every platform. A backend is an
optional, faster way to run some of it on one platform: eqxopt's native CPU kernels
(`eqxopt._native`) register themselves here when `eqxopt` is imported, and nothing
in the core imports them. The core consults the registered backend at four places,
each with the facts it needs passed as arguments:

- an entry point (`update`/`step`) tracing its transform: `placement` (read from
  the concrete inputs before the call; static data of the compiled step) and
  `tracing` (a context for the trace, told whether the outputs may overwrite the
  inputs: a donated call);
- the per-leaf engine (`map_leaves`): `leaf_kernels`, which runs an element-wise
  rule on the leaves it takes and leaves the others to XLA's code;
- `Packed`: `split` and `concat` of its flat buffers;
- `make_train_step`: `train_step`, the compiler options and trace context of a
  whole train step.

A backend answers `None` wherever it has nothing better, and must give the results
XLA's code gives (to rounding). Without a backend registered, or with it switched
off (`set_native_kernels(False)`, `EQXOPT_NATIVE=0`), every step runs XLA's code.
"""

import abc
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

logger = logging.getLogger("eqxopt")


class NotLowered(Exception):
    """A backend cannot run a rule (or a leaf); the message says why."""


class LeafResult(NamedTuple):
    """One leaf's results from a backend's kernels: its update and its new
    parameter, one of them `None` (the update where the kernel applied it), and
    its new moments, stored as the old ones were."""

    update: Any
    param: Any
    moments: list[Any]


class AbstractLeafKernels(abc.ABC):
    """A backend's kernels for one call of `map_leaves`: the engine offers each leaf
    (`takes`, then `add`) and collects the results of every leaf taken (`finish`)."""

    @abc.abstractmethod
    def refusal(self, g: Any, p: Any, old: Sequence[Any]) -> str | None:
        """`None` if these kernels would run the leaf with gradient `g`, parameter
        `p` and moments `old` (shapes, dtypes and placement; the rule is checked by
        `add`), else why not, in words."""

    @abc.abstractmethod
    def add(self, index: int, g: Any, p: Any, old: Sequence[Any], flag: tuple) -> None:
        """Takes leaf `index` (its rule's extra arguments: `flag`, `()` or one
        value); raises `NotLowered`, having taken nothing, if it cannot run it."""

    @abc.abstractmethod
    def finish(self) -> dict[int, LeafResult]:
        """The results of every leaf taken, by index."""


@dataclasses.dataclass(frozen=True)
class EntryTrace:
    """What an entry point tells the backend of the trace it is making.

    - `in_place`: the call is donated, so its outputs may overwrite its inputs.
    - `grads_given`: the gradients are inputs of the program being compiled (not
      computed inside it, as in a train step), so no kernel needs to wait for them.
    - `placement`: what the backend's `placement` returned for this call.
    - `inputs`: the entry's `(grads, params, state)` in this trace.
    """

    in_place: bool
    grads_given: bool
    placement: Hashable | None
    inputs: tuple[Any, Any, Any]


class TrainStepPlan(NamedTuple):
    """How a backend wants a whole train step compiled: `compiler_options` for
    `jax.jit` (hashable items) and `tracing`, a context the step is traced in."""

    compiler_options: tuple[tuple[str, Any], ...]
    tracing: Callable[[], contextlib.AbstractContextManager]


class AbstractBackend(abc.ABC):
    """A faster way to run parts of the engine on one platform; see the module
    docstring. Register one with `register`."""

    @abc.abstractmethod
    def usable(self) -> bool:
        """Whether the backend is switched on and can run here (platform, JAX
        version, what it needs built)."""

    def why_unusable(self) -> str:
        """Why `usable()` is false, in words."""
        return "it is off"

    @abc.abstractmethod
    def set_enabled(self, enabled: bool) -> None:
        """Switches the backend on or off (`set_native_kernels`)."""

    def placement(self, leaves: Sequence[Any], shardings: Sequence[Any]) -> Any:
        """For a donated call: static data about where its input `leaves` live
        (`shardings`: each leaf's concrete sharding, `None` for a tracer), which
        keys the compiled step and reaches `tracing` as `EntryTrace.placement`;
        hashable and a pytree without leaves, or `None`."""
        del leaves, shardings
        return None

    def typed_placement(self, leaves: Sequence[Any], mesh: Any) -> Any:
        """As `placement`, for a donated call inside a user's own `jit` on a mesh of
        Explicit axes (`mesh`), from the types of its traced input `leaves`; the
        step then runs with those axes made Auto (`_placement.on_auto_axes`)."""
        del leaves, mesh
        return None

    def tracing(self, trace: EntryTrace) -> contextlib.AbstractContextManager:
        """The context in which an entry traces its transform."""
        del trace
        return contextlib.nullcontext()

    def leaf_kernels(
        self, rule: Callable[..., Any], n_moments: int, apply: bool, grads: list[Any]
    ) -> AbstractLeafKernels | None:
        """Kernels for one call of `map_leaves` of an element-wise `rule` over
        `n_moments` moments (`apply`: the kernels also add each update to its
        parameter), or `None`. `grads`: each leaf's gradient as the program being
        traced has it."""
        del rule, n_moments, apply, grads
        return None

    def split(self, flat: Any, shapes: tuple[tuple[int, ...], ...]) -> list | None:
        """`Packed`'s `flat` buffer cut into pieces of `shapes`, or `None`."""
        del flat, shapes
        return None

    def concat(self, parts: list[Any]) -> Any:
        """The 1-D concatenation of `parts` for `pack`, or `None`."""
        del parts
        return None

    def train_step(self, model: list[Any], others: list[Any]) -> TrainStepPlan | None:
        """A plan for compiling `make_train_step`'s step of these model arrays and
        other array inputs (optimizer, batch), or `None`."""
        del model, others
        return None


_registered: list[AbstractBackend] = []
# Called whenever a backend is registered or switched: compiled steps traced with
# the backend in one state must trace again.
_on_change: list[Callable[[], None]] = []


def register(backend: AbstractBackend) -> None:
    """Makes `backend` the engine's backend (one at a time)."""
    if not isinstance(backend, AbstractBackend):
        raise TypeError(f"expected an AbstractBackend, got {type(backend).__name__}")
    _registered[:] = [backend]
    changed()


def on_change(callback: Callable[[], None]) -> None:
    """Calls `callback()` whenever the backend is registered or switched."""
    _on_change.append(callback)


def changed() -> None:
    """Tells every `on_change` callback that the backend changed."""
    for callback in _on_change:
        callback()


def active() -> AbstractBackend | None:
    """The registered backend if it is usable now, else `None`."""
    if _registered and _registered[0].usable():
        return _registered[0]
    return None


def registered() -> AbstractBackend | None:
    """The registered backend, usable or not."""
    return _registered[0] if _registered else None


def set_native_kernels(enabled: bool) -> None:
    """Turns eqxopt's native CPU kernels on (the default) or off.

    With them on, donated steps (`donate=True`) of element-wise optimizer rules on
    float32 leaves run as one compiled C loop per leaf (single pass, in place,
    multi-threaded for large leaves) when the default JAX backend is the CPU: on
    the device that holds the parameters, or on each device's shard of parameters
    sharded over a mesh (`NamedSharding`), with no gather. With them off, XLA's own
    per-leaf code runs, as it always does on GPUs and TPUs. Results agree to
    rounding. eqxopt's own compiled steps are dropped, so the next
    `opt.step`/`opt.update` traces again; a step inside your own `jax.jit` keeps the
    code it was compiled with until that function traces again. The environment
    variable `EQXOPT_NATIVE=0` (or `false`/`no`/`off`) sets the default to off.
    Where the kernels are not installed, this does nothing.

    **Arguments:**

    - `enabled`: a bool.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    backend = registered()
    if backend is not None:
        backend.set_enabled(enabled)


def native_kernels_available() -> bool:
    """Whether steps traced now would use the native CPU kernels: they are
    installed and switched on, this JAX is one they were tested with, the default
    backend is the CPU, and the kernels could be built (this builds them on first
    call: a few seconds, once per machine). Where a step's parameters live decides
    the rest, step by step: on one device or sharded alike over a mesh of CPU
    devices, the kernels run there; mixed placements run XLA's code."""
    return active() is not None


_reported: set[tuple[int, str]] = set()
# While `explain_kernels` traces a step: per leaf the engine runs, `(rule name, the
# parameter (a tracer), None or why XLA's code runs it)`.
recording: list[list[tuple[str, Any, str | None]]] = []


def report(rule: Callable[..., Any], p: Any, why: str | None) -> None:
    """Tells `explain_kernels` (while it records) how the engine ran the leaf of
    parameter `p` for a rule: on the backend's kernels (`why` is `None`) or XLA's
    code, and why; a rule the kernels cannot run is logged too, once per rule and
    reason (logger `"eqxopt"`, level DEBUG)."""
    name = rule_name(rule)
    for log in recording:
        log.append((name, p, why))
    if why is None or why.startswith(_NOT_ELEMENTWISE):
        return
    key = (id(getattr(rule, "func", rule)), why)
    if key not in _reported:
        _reported.add(key)
        logger.debug("the native kernels do not run %s: %s", name, why)


_NOT_ELEMENTWISE = "the rule is not declared element-wise"
NOT_ELEMENTWISE = (
    f"{_NOT_ELEMENTWISE} (it may read whole leaves: norms, factored or matrix "
    "statistics)"
)


def rule_name(rule: Callable[..., Any]) -> str:
    """A rule's name for messages: `AdamW.leaf` for an optimizer's `leaf`."""
    func = getattr(rule, "func", rule)
    owner = getattr(func, "__self__", None)
    if owner is not None:
        return f"{type(owner).__name__}.{func.__name__}"
    return getattr(func, "__qualname__", repr(func))
