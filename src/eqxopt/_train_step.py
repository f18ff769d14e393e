"""`make_train_step`: a whole compiled train step (loss, gradients, optimizer step)
written the fast way: model and state donated, `step(..., donate=True)` inside."""

import contextlib
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax

from ._core import _backend, _dispatch, _placement
from ._core._backend import TrainStepPlan
from ._core._base import AbstractTransform, checked_transform
from ._core._checks import check_bool
from ._core._packed import Packed


class TrainStep(eqx.Module):
    """A compiled train step made by `eqxopt.make_train_step`; call it as
    `step(model, state, *batch)`.

    **Fields:**

    - `loss_fn`: static: `loss_fn(model, *batch) -> loss` (or `(loss, aux)`).
    - `opt`: the optimizer it steps with when called without `opt=`.
    - `has_aux`: static: whether `loss_fn` returns `(loss, aux)`.
    """

    loss_fn: Callable[..., Any] = eqx.field(static=True)
    opt: AbstractTransform
    has_aux: bool = eqx.field(static=True)

    def __call__(
        self,
        model: Any,
        state: Any,
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
        with _quiet_callback_failures():
            return _dispatch.call(*self._call(model, state, batch, opt))

    def lower(
        self,
        model: Any,
        state: Any,
        *batch: Any,
        opt: AbstractTransform | None = None,
    ) -> Any:
        """The program `__call__` runs, lowered (`jax.jit`'s `lower`): `.compile()`
        it to read XLA's memory analysis (`.memory_analysis()`) or optimized HLO
        (`.as_text()`).

        **Arguments:** as `__call__`.
        """
        return _dispatch.lower(*self._call(model, state, batch, opt))

    def _call(
        self, model: Any, state: Any, batch: tuple, opt: AbstractTransform | None
    ) -> tuple[Any, ...]:
        # The arguments of `_dispatch.call`: the optimizer first (usually the same
        # object call after call), the model and the state donated.
        opt = self.opt if opt is None else checked_transform("opt", opt)
        plan = None
        backend = _backend.active()
        if backend is not None:
            plan = backend.train_step(_arrays(model), _arrays((opt, batch)))
        # Read as `update`/`step` read it: the program places its outputs like these
        # inputs, which a trace cannot see on an Auto mesh.
        inputs = _placement.read(None, model, state, donated=False)
        key = _TrainKey(self.loss_fn, self.has_aux, plan, _placement.signature(inputs))
        options = () if plan is None else plan.compiler_options
        return _step, key, (opt, batch, model, state), (2, 3), options


def make_train_step(
    loss_fn: Callable[..., Any], opt: AbstractTransform, *, has_aux: bool = False
) -> TrainStep:
    """A compiled train step, `step(model, state, *batch) -> (model, state, loss)`:
    the loss and its gradients with respect to the model's float arrays
    (`eqx.filter_value_and_grad`), then `opt.step(grads, state, model,
    donate=True)`, in one `jit` that donates the model and the state, so the
    optimizer writes them in place.

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
      `eqxopt.from_optax(tx)`). Transforms that need more than the gradients get
      it from the step: the loss as `value=` (`PolyakSGD`, `Momo`, `MomoAdam`,
      `ReduceOnPlateau` in a `Chain`, ...) and the loss (or its gradient) on the
      batch as a function of the parameters for `LBFGS`'s `value_fn=`,
      `Sophia`'s `obj_fn=` and `SAM`'s `grad_fn=`.
    - `has_aux`: whether `loss_fn` returns `(loss, aux)`; `aux` is then returned
      as the step's last output.

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
    return TrainStep(loss_fn, opt, check_bool("has_aux", has_aux))


class _TrainKey(NamedTuple):
    """What selects a train step's program besides its arguments: the loss
    function, whether it returns aux, the backend's plan for compiling it, and
    where the model and state live (`_placement.signature`)."""

    loss_fn: Callable[..., Any]
    has_aux: bool
    plan: TrainStepPlan | None
    placement: Any


def _arrays(tree: Any) -> list[Any]:
    return [x for x in jax.tree.leaves(tree) if eqx.is_array(x)]


def _loss_of(loss_fn: Callable[..., Any], model: Any) -> Callable[..., Any]:
    if isinstance(model, Packed):
        return lambda packed, *batch: loss_fn(packed.unpack(), *batch)
    return loss_fn


def _keywords(
    opt: AbstractTransform, loss: Any, loss_at: Callable[[Any], Any]
) -> dict[str, Any]:
    """What the step passes to `opt.step` besides the gradients: each keyword that
    some transform in `opt` takes (`takes_keyword`) and that the step has in hand,
    the loss (`value=`) or the loss on this batch as a function of the parameters
    (`loss_at`, for a linesearch or a second gradient). The functions take and
    ignore further arguments: a transform that takes every keyword (`LBFGS`
    passes its data keywords on to `value_fn`) may hand them the others."""

    def loss_fn(params: Any, *args: Any, **kwargs: Any) -> Any:
        del args, kwargs
        return loss_at(params)

    def grad_fn(params: Any, *args: Any, **kwargs: Any) -> Any:
        del args, kwargs
        return eqx.filter_grad(loss_at)(params)

    supplied = {
        "value": lambda: loss,  # Momo, PolyakSGD, ReduceOnPlateau, LBFGS, ...
        "value_fn": lambda: loss_fn,  # LBFGS's linesearch
        "obj_fn": lambda: loss_fn,  # Sophia's Hessian estimate
        "grad_fn": lambda: grad_fn,  # SAM's gradient at the perturbed parameters
    }
    return {k: make() for k, make in supplied.items() if opt.takes_keyword(k)}


def _step(key: _TrainKey, opt: AbstractTransform, batch: tuple, model, state):
    loss_of = _loss_of(key.loss_fn, model)
    value, grads = eqx.filter_value_and_grad(loss_of, has_aux=key.has_aux)(
        model, *batch
    )
    loss = value[0] if key.has_aux else value

    def loss_at(params: Any) -> Any:
        out = loss_of(params, *batch)
        return out[0] if key.has_aux else out

    extra = _keywords(opt, loss, loss_at)
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


@contextlib.contextmanager
def _quiet_callback_failures() -> Any:
    # JAX logs a failed host callback with its traceback before the call raises;
    # for an `eqx.error_if` the call raises `eqx.EquinoxRuntimeError` with the
    # message instead (`raise_equinox_error`), so the log is dropped, as
    # `eqx.filter_jit` drops it.
    _callback_logger.addFilter(_drop_callback_failure)
    try:
        yield
    finally:
        _callback_logger.removeFilter(_drop_callback_failure)


_callback_logger = logging.getLogger("jax._src.callback")


def _drop_callback_failure(record: logging.LogRecord) -> bool:
    return record.getMessage() != "jax.pure_callback failed"
