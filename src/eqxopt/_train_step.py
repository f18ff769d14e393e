"""`make_train_step`: a whole compiled train step (loss, gradients, optimizer step)
written the fast way: model and state donated, `step(..., donate=True)` inside."""

from collections.abc import Callable
from typing import Any

import equinox as eqx

from ._core._base import AbstractTransform
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
        return _compiled(self._front(opt, batch), model, state)

    def lower(
        self,
        model: Any,
        state: Any,
        *batch: Any,
        opt: AbstractTransform | None = None,
    ) -> Any:
        """The program `__call__` runs, lowered (`eqx.filter_jit`'s `lower`):
        `.compile()` it to read XLA's memory analysis or optimized HLO.

        **Arguments:** as `__call__`.
        """
        lower = _compiled.lower  # pyright: ignore[reportFunctionMemberAccess]
        return lower(self._front(opt, batch), model, state)

    def _front(self, opt: AbstractTransform | None, batch: tuple) -> tuple:
        # The compiled program's first, undonated argument.
        return (self.opt if opt is None else opt, self.loss_fn, self.has_aux, batch)


def make_train_step(
    loss_fn: Callable[..., Any], opt: AbstractTransform, *, has_aux: bool = False
) -> TrainStep:
    """A compiled train step, `step(model, state, *batch) -> (model, state, loss)`:
    the loss and its gradients with respect to the model's float arrays
    (`eqx.filter_value_and_grad`), then `opt.step(grads, state, model,
    donate=True)`, in one `jit` that donates the model and the state, so the
    optimizer writes them in place.

    ```python
    train_step = eqxopt.make_train_step(loss_fn, opt)
    state = opt.init(model)
    for x, y in batches:
        model, state, loss = train_step(model, state, x, y)
    ```

    The optimizer's arrays (learning rate, schedule values, ...) are arguments of
    the compiled program, never constants: `train_step(model, state, x, y,
    opt=new_opt)` with an optimizer of the same structure and other values, or a
    new `make_train_step(loss_fn, new_opt)`, reuses the compiled step. It compiles
    again for a new `loss_fn` object, another tree structure or other shapes.

    **Arguments:**

    - `loss_fn`: `loss_fn(model, *batch)` returning a scalar loss, or `(loss, aux)`
      with `has_aux=True`. Only the model is differentiated. With an
      `eqxopt.Packed` model, `loss_fn` gets the unpacked tree (`model.unpack()`),
      the gradients come back packed and the step runs on the packed buffers.
    - `opt`: the optimizer (any eqxopt transform).
    - `has_aux`: whether `loss_fn` returns `(loss, aux)`; `aux` is then returned
      as the step's last output.

    **Returns:** a `TrainStep`: call it as `step(model, state, *batch, opt=None)`.
    The model and state passed in are donated (their buffers are reused for the
    results): use the ones it returns.
    """
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    if not isinstance(opt, AbstractTransform):
        raise TypeError(
            f"opt must be an eqxopt transform (such as eqxopt.AdamW(...)), "
            f"got {type(opt).__name__}"
        )
    return TrainStep(loss_fn, opt, check_bool("has_aux", has_aux))


def _loss_of(loss_fn: Callable[..., Any], model: Any) -> Callable[..., Any]:
    if isinstance(model, Packed):
        return lambda packed, *batch: loss_fn(packed.unpack(), *batch)
    return loss_fn


# One compiled program per (loss_fn, has_aux, structure and shapes of everything);
# the first argument (optimizer and batch) is not donated, model and state are.
@eqx.filter_jit(donate="all-except-first")
def _compiled(front: tuple, model: Any, state: Any) -> tuple[Any, ...]:
    opt, loss_fn, has_aux, batch = front
    value_and_grad = eqx.filter_value_and_grad(
        _loss_of(loss_fn, model), has_aux=has_aux
    )
    value, grads = value_and_grad(model, *batch)
    model, state = opt.step(grads, state, model, donate=True)
    if has_aux:
        loss, aux = value
        return model, state, loss, aux
    return model, state, value
