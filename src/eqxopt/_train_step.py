"""`make_train_step`: a whole compiled train step (loss, gradients, optimizer step)
written the fast way: one `eqx.filter_jit` donating the model and the state, with
`step(..., donate=True)` inside."""

import contextlib
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from ._core import _backend, _placement
from ._core._backend import TrainStepPlan
from ._core._base import AbstractTransform, Supplied, checked_transform
from ._core._checks import check_bool
from ._core._compile import FilteredJit
from ._core._packed import Packed
from ._core._types import Params, State


class TrainStep(eqx.Module):
    """A compiled train step made by `eqxopt.make_train_step`; call it as
    `step(model, state, *batch)`.

    **Fields:**

    - `loss_fn`: static: `loss_fn(model, *batch) -> loss` (or `(loss, aux)`).
    - `opt`: the optimizer it steps with when called without `opt=`.
    - `has_aux`: static: whether `loss_fn` returns `(loss, aux)`.
    - `per_example_axes`: static: for an optimizer that takes per-example
      gradients, the batch axis of each batch argument (`None`: not batched), else
      `None`.
    """

    loss_fn: Callable[..., Any] = eqx.field(static=True)
    opt: AbstractTransform
    has_aux: bool = eqx.field(static=True)
    per_example_axes: tuple[int | None, ...] | int | None = eqx.field(
        static=True, default=None
    )

    def __call__(
        self,
        model: Params,
        state: State,
        *batch: Any,
        opt: AbstractTransform | None = None,
    ) -> tuple[Any, ...]:
        """One train step.

        **Arguments:**

        - `model`: the model (any pytree, or an `eqxopt.Packed`); donated: its arrays
          are overwritten, use the returned model instead.
        - `state`: the optimizer state; donated likewise.
        - `*batch`: the rest of `loss_fn`'s arguments (not donated). Arrays are
          traced; other values (Python numbers, strings) are static, as with
          `eqx.filter_jit`: a new value compiles again.
        - `opt`: an optimizer to use instead of `self.opt` for this call, such as
          the same optimizer with a new learning rate. One with the same structure
          (same class and fields, other values) reuses the compiled step.

        **Returns:** `(model, state, loss)`, or `(model, state, loss, aux)` with
        `has_aux=True`.
        """
        compiled, args = self._call(model, state, batch, opt)
        # An offloaded state is not donated, nor then the model: JAX pairs
        # donated buffers with outputs by shape and dtype, not memory kind.
        return compiled(*args, donate=not args[1].state_in_host_memory())

    def lower(
        self,
        model: Params,
        state: State,
        *batch: Any,
        opt: AbstractTransform | None = None,
    ) -> jax.stages.Lowered:
        """The program `__call__` runs, lowered (`jax.jit`'s `lower`): `.compile()`
        it to read XLA's memory analysis (`.memory_analysis()`) or optimized HLO
        (`.as_text()`).

        **Arguments:** as `__call__`.
        """
        compiled, args = self._call(model, state, batch, opt)
        return compiled.lower(*args, donate=not args[1].state_in_host_memory())

    def _call(
        self, model: Any, state: Any, batch: tuple, opt: AbstractTransform | None
    ) -> tuple[FilteredJit, tuple]:
        # The compiled step and its arguments: the model and the state last, the
        # ones it donates.
        opt = self.opt if opt is None else checked_transform("opt", opt)
        plan = None
        backend = _backend.active()
        if backend is not None:
            plan = backend.train_step(_arrays(model), _arrays((opt, batch)))
        # Read as `update`/`step` read it: the program places its outputs like these
        # inputs, which a trace cannot see on an Auto mesh.
        inputs = _placement.read(None, model, state, donated=False)
        key = _TrainKey(
            self.loss_fn,
            self.has_aux,
            self.per_example_axes,
            plan,
            _placement.signature(inputs),
            backend,
        )
        options = () if plan is None else plan.compiler_options
        return _compiled(options), (key, opt, batch, model, state)


def make_train_step(
    loss_fn: Callable[..., Any],
    opt: AbstractTransform,
    *,
    has_aux: bool = False,
    per_example_axes: tuple[int | None, ...] | int | None = None,
) -> TrainStep:
    """A compiled train step, `step(model, state, *batch) -> (model, state, loss)`:
    the loss and its gradients with respect to the model's float arrays
    (`eqx.filter_value_and_grad`), then `opt.step(grads, state, model,
    donate=True)`, in one `eqx.filter_jit` that donates the model and the state,
    so the optimizer writes them in place.

    The optimizer's arrays (learning rate, schedule values, ...) are arguments of
    the compiled program, never constants: `train_step(model, state, x, y,
    opt=new_opt)` with an optimizer of the same structure and other values, or a
    new `make_train_step(loss_fn, new_opt)`, reuses the compiled step. It compiles
    again for a new `loss_fn` object, another tree structure or other shapes.

    With the native CPU kernels, a model that is large against its batch (such as a
    transformer stepped on a few tokens) is compiled with XLA:CPU's scheduler for
    the least memory, which makes each large gradient just before its in-place
    update (the default schedule makes every gradient as early as it can, and
    holds several large ones at once); the results are the same.

    **Arguments:**

    - `loss_fn`: `loss_fn(model, *batch)` returning a scalar loss, or `(loss, aux)`
      with `has_aux=True`. Only the model is differentiated. With an
      `eqxopt.Packed` model, `loss_fn` gets the unpacked tree (`model.unpack()`),
      the gradients come back packed and the step runs on the packed buffers.
    - `opt`: the optimizer (any eqxopt transform; an optax one goes in as
      `eqxopt.from_optax(tx)`). Transforms that need more than the gradients
      declare what (`eqxopt.extend.Supplied`, in their `keywords`) and get it from
      the step: the loss (`PolyakSGD`, `Momo`, `ReduceOnPlateau` in a `Chain`,
      ...), the loss on the batch as a function of the parameters (`LBFGS`'s
      linesearch, `Sophia`) or its gradient (`SAM`), or the loss function's aux
      (`QKClip`, `MuonClip`: the largest attention logits).
    - `has_aux`: whether `loss_fn` returns `(loss, aux)`; `aux` is then returned
      as the step's last output.
    - `per_example_axes`: for an optimizer that takes per-example gradients
      (`DPSGD`, a `Chain` starting with `DifferentiallyPrivateAggregate`), the
      batch axis of each batch argument (an int for all of them, or one int or
      `None` per argument, as `jax.vmap`'s `in_axes`): the step then computes one
      gradient per example, `loss_fn` seeing each example as a batch of one, and
      returns the mean of their losses (and, with `has_aux`, their `aux`
      stacked). Required for such an optimizer and refused for any other, both
      when the step is made.

    **Returns:** a `TrainStep`: call it as `step(model, state, *batch, opt=None)`.
    The model and state passed in are donated (their buffers are reused for the
    results): use the ones it returns. Each comes back placed as it went in (a
    ZeRO-1 state split over a mesh axis, the parameters replicated), and an
    `eqx.error_if` in `loss_fn` raises `eqx.EquinoxRuntimeError`, as from
    `eqx.filter_jit`.

    **Example:**

    ```python
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import eqxopt

    model = eqx.nn.MLP(2, 1, width_size=16, depth=1, key=jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (32, 2))
    y = x.sum(axis=1, keepdims=True)


    def loss_fn(model, x, y):
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)


    opt = eqxopt.AdamW(1e-2)
    train_step = eqxopt.make_train_step(loss_fn, opt)
    state = opt.init(model)
    first = loss_fn(model, x, y)
    for _ in range(50):
        model, state, loss = train_step(model, state, x, y)  # use the returned ones
    assert loss < first
    # another learning rate, the same compiled step
    model, state, loss = train_step(model, state, x, y, opt=eqxopt.AdamW(1e-3))
    ```
    """
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    checked_transform("opt", opt)
    name = type(opt).__name__
    if opt.takes_per_example_grads():
        if per_example_axes is None:
            raise TypeError(
                f"{name} takes per-example gradients: give make_train_step the batch "
                "axis of each batch argument, per_example_axes=0 (or one int or None "
                "per argument), and the step computes one gradient per example"
            )
    elif per_example_axes is not None:
        raise ValueError(
            f"per_example_axes is for optimizers that take per-example gradients "
            f"(DPSGD, ...); {name} takes the batch's gradient"
        )
    wants_aux = [k for k, v in opt.wanted_keywords().items() if v is Supplied.AUX]
    if wants_aux and not has_aux:
        raise TypeError(
            f"{name} reads {', '.join(wants_aux)} from the loss function's aux: "
            "have loss_fn return (loss, aux) and pass has_aux=True"
        )
    return TrainStep(
        loss_fn,
        opt,
        check_bool("has_aux", has_aux),
        _checked_axes(per_example_axes),
    )


def _checked_axes(axes: Any) -> tuple[int | None, ...] | int | None:
    if axes is None or (isinstance(axes, int) and not isinstance(axes, bool)):
        return axes
    if isinstance(axes, (tuple, list)) and all(
        a is None or (isinstance(a, int) and not isinstance(a, bool)) for a in axes
    ):
        return tuple(axes)
    raise TypeError(
        "per_example_axes must be an int or a tuple of one int or None per batch "
        f"argument, got {axes!r}"
    )


@dataclasses.dataclass(frozen=True)
class _TrainKey:
    """What selects a train step's program besides its arrays (a static argument):
    the loss function, whether it returns aux, the per-example axes, the backend's
    plan for compiling it, where the model and state live
    (`_placement.signature`) and the backend in use."""

    loss_fn: Callable[..., Any]
    has_aux: bool
    per_example_axes: Any
    plan: TrainStepPlan | None
    placement: Any
    backend: Any


def _arrays(tree: Any) -> list[Any]:
    return [x for x in jax.tree.leaves(tree) if eqx.is_array(x)]


def _loss_of(loss_fn: Callable[..., Any], model: Any) -> Callable[..., Any]:
    if isinstance(model, Packed):
        return lambda packed, *batch: loss_fn(packed.unpack(), *batch)
    return loss_fn


def _keywords(
    opt: AbstractTransform,
    loss: Any,
    grads: Any,
    loss_at: Callable[[Any], Any],
    aux: Any,
) -> dict[str, Any]:
    """What the step passes to `opt.step` besides the gradients: each keyword some
    transform in `opt` wants (`wanted_keywords`) that the step has in hand, by
    what it is (`Supplied`). The functions take and ignore further arguments (a
    linesearch passes its data keywords on)."""

    def loss_fn(params: Any, *args: Any, **kwargs: Any) -> Any:
        del args, kwargs
        return loss_at(params)

    def grad_fn(params: Any, *args: Any, **kwargs: Any) -> Any:
        del args, kwargs
        return eqx.filter_grad(loss_at)(params)

    in_hand = {
        Supplied.LOSS: loss,
        Supplied.GRADIENT: grads,
        Supplied.LOSS_FUNCTION: loss_fn,
        Supplied.GRAD_FUNCTION: grad_fn,
        Supplied.AUX: aux,
    }
    return {
        key: in_hand[what]
        for key, what in opt.wanted_keywords().items()
        if what in in_hand
    }


def _value_and_grads(key: _TrainKey, loss_of: Callable, model: Any, batch: tuple):
    """The loss (and aux) and the gradients: of the batch's loss, or one per
    example (`per_example_axes`), each example seen by `loss_fn` as a batch of
    one."""
    value_and_grad = eqx.filter_value_and_grad(loss_of, has_aux=key.has_aux)
    if key.per_example_axes is None:
        return value_and_grad(model, *batch)
    axes = key.per_example_axes
    if isinstance(axes, int):
        axes = (axes,) * len(batch)
    if len(axes) != len(batch):
        raise TypeError(
            f"per_example_axes gives {len(axes)} axes for {len(batch)} batch arguments"
        )

    def one(model: Any, *example: Any) -> Any:
        example = tuple(
            x
            if a is None
            else jax.tree.map(functools.partial(jnp.expand_dims, axis=a), x)
            for x, a in zip(example, axes)
        )
        return value_and_grad(model, *example)

    value, grads = eqx.filter_vmap(one, in_axes=(None, *axes))(model, *batch)
    if key.has_aux:
        return (jnp.mean(value[0]), value[1]), grads
    return jnp.mean(value), grads


def _step(key: _TrainKey, opt: AbstractTransform, batch: tuple, model, state):
    loss_of = _loss_of(key.loss_fn, model)
    value, grads = _value_and_grads(key, loss_of, model, batch)
    loss = value[0] if key.has_aux else value

    def loss_at(params: Any) -> Any:
        out = loss_of(params, *batch)
        return out[0] if key.has_aux else out

    extra = _keywords(opt, loss, grads, loss_at, value[1] if key.has_aux else None)
    tracing = contextlib.nullcontext() if key.plan is None else key.plan.tracing()
    with tracing:
        new_model, new_state = opt.step(grads, state, model, donate=True, **extra)
    # Each output where its input was (ZeRO-1 on an Auto mesh: the parameters stay
    # replicated), as `update`/`step` place theirs.
    on_model, on_state = key.placement or (None, None)
    new_model = _placement.keep(new_model, model, on_model)
    new_state = _placement.keep(new_state, state, on_state)
    if key.has_aux:
        return new_model, new_state, loss, value[1]
    return new_model, new_state, value


@functools.lru_cache(maxsize=8)
def _compiled(options: tuple[tuple[str, Any], ...]) -> FilteredJit:
    """The compiled train step for a backend's compiler options (the model and the
    state, its last two arguments, donated)."""
    return FilteredJit(_step, donate_from=2, compiler_options=options, held=0)
