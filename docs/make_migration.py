"""The tables of the two migration guides, as data: docs/migrating-optax.md and
docs/migrating-torch.md show them, and tests/test_migration.py checks every row:
each eqxopt name resolves, each ported call gives optax's (or torch's) numbers over
3 steps with the row's arguments (or differs where the row says so), a positional
port gives optax's numbers or raises `TypeError`, a "missing" row fails once eqxopt
has the name, and every name of `optax.__all__`, `optax.contrib`,
`torch.optim.__all__` and `torch.optim.lr_scheduler.__all__` has a row.

Run from the repository root: `python docs/make_migration.py` rewrites each table
of the two pages (between `<!-- table: NAME -->` and `<!-- end table -->`); the rest
of each page is written by hand. The test checks that the pages are current.
"""

import dataclasses
import functools
import inspect
import pathlib
import re
from typing import Any

import eqxopt

DOCS = pathlib.Path(__file__).resolve().parent
PAGES = {"optax": DOCS / "migrating-optax.md", "torch": DOCS / "migrating-torch.md"}


class _Default:
    """In a row's arguments: optax's default for that position (a value that has
    no short spelling, such as `sophia`'s Hessian estimator)."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _Default()


@dataclasses.dataclass(frozen=True)
class Inner:
    """In a row's arguments: an inner optimizer, `optax.<optax>(*args)` on optax's
    side and `eqxopt.<eqxopt>(*args)` on eqxopt's."""

    optax: str
    eqxopt: str
    args: tuple = ()


@dataclasses.dataclass(frozen=True)
class Port:
    """An optimizer, transform or schedule checked by its numbers.

    `optax.<optax>(*args, **kwargs)` (`args`: as many as optax's signature takes
    by position; `kwargs`: its keyword-only ones, if the row sets any) against
    `eqxopt.<eqxopt>` built from the same arguments by name (optax's names;
    eqxopt's spelling where the class's `renamed_arguments` gives one; an optax
    argument eqxopt has not must be at optax's default), over 3 steps. And the
    positional port: `eqxopt.<eqxopt>(*args[:k])` for each `k` gives
    `optax.<optax>(*args[:k])`'s numbers or raises `TypeError`.

    - `extra`: what `update` needs beyond the gradients: `"value"` (the loss),
      `"lbfgs"` (the loss and the loss function), `"obj_fn"` (the loss function);
      `"per_example"`: the gradients come as a batch of per-example ones.
    - `differs`: where optax's numbers differ on purpose, why (then they must
      differ, and the positional port is checked against the keyword one).
    """

    optax: str
    eqxopt: str
    args: tuple
    note: str = ""
    kwargs: dict = dataclasses.field(default_factory=dict)
    rtol: float = 2e-5
    atol: float = 2e-6
    extra: str | None = None
    differs: str | None = None


@dataclasses.dataclass(frozen=True)
class Call:
    """A row of two calls, checked by their numbers where `values` binds the names
    they use (each side is evaluated; both must be transforms, or schedules), else
    by the eqxopt names in `names` resolving. `covers`: the names of the other
    library the row stands for (in the tables that list every name)."""

    theirs: str
    ours: str
    values: dict | None = None
    names: tuple[str, ...] = ()
    covers: tuple[str, ...] = ()
    note: str = ""
    differs: str | None = None
    steps: int = 3
    # What a torch scheduler row compares: the group's `"lr"`, or its `"momentum"`
    # (torch's momentum cycling, against the eqxopt schedule passed as momentum).
    reads: str = "lr"


@dataclasses.dataclass(frozen=True)
class Row:
    """A row checked by its names: `names` (of the other library) it covers; `ours`,
    the eqxopt side in markdown; every name in `resolves` is a public eqxopt name
    (`X`, or `X.attribute`)."""

    names: tuple[str, ...]
    ours: str
    resolves: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Missing:
    """Names eqxopt has no equivalent of (checked: no public eqxopt name spells one
    of them, case and underscores aside); `note` says what to use instead."""

    names: tuple[str, ...]
    note: str = ""


def every_other_step(step: Any) -> Any:
    """A predicate of the step count for the conditional wrappers' rows."""
    return step % 2 == 0


def sgd(lr: float = 0.1) -> Inner:
    return Inner("sgd", "SGD", (lr,))


# ------------------------------------------------------------------- optax rows

OPTAX_CALLS = [
    Call(
        "tx = optax.adamw(lr, b1, b2, eps, weight_decay=wd)",
        "opt = eqxopt.AdamW(lr, b1, b2, eps, weight_decay=wd)",
        values=dict(lr=1e-2, b1=0.8, b2=0.99, eps=1e-6, wd=0.05),
        note="optax's fifth positional argument is `eps_root`: eqxopt takes the "
        "first four positionally and the rest by keyword",
    ),
    Call(
        "tx.init(eqx.filter(model, eqx.is_array))",
        "opt.init(model)",
        names=("AbstractTransform.init",),
    ),
    Call(
        "updates, state = tx.update(grads, state, params)",
        "updates, state = opt.update(grads, state, params)",
        names=("AbstractTransform.update",),
        note="`params` may be left out where the transform reads none, as in optax",
    ),
    Call(
        "optax.apply_updates(params, updates)",
        "eqxopt.apply_updates(params, updates)",
        names=("apply_updates", "AbstractTransform.step"),
        note="or both at once: `params, state = opt.step(grads, state, params)`",
    ),
    Call(
        "state[0].mu, state[-1].count",
        "state.mu, state.step",
        names=("AdamState.mu", "AdamState.step"),
    ),
    Call(
        "optax.inject_hyperparams(optax.adamw)(learning_rate=lr)",
        "eqxopt.AdamW(lr)",
        names=("AdamW",),
        note="every hyperparameter is already an input of the compiled step",
    ),
]

OPTAX_OPTIMIZERS = [
    Port("adabelief", "AdaBelief", (1e-2, 0.8, 0.99, 1e-8, 1e-12)),
    Port("adadelta", "Adadelta", (0.5, 0.8, 1e-5, 0.05, None)),
    Port(
        "adafactor",
        "Adafactor",
        (0.05, 2, 0.7, 0, True, 0.5, 0.9, DEFAULT, 0.01, 1e-30, True, None),
    ),
    Port("adagrad", "Adagrad", (0.1, 0.2, 1e-6)),
    Port(
        "adam",
        "Adam",
        (1e-2, 0.8, 0.99, 1e-6, 0.0, None),
        kwargs=dict(nesterov=True),
    ),
    Port("adamax", "Adamax", (1e-2, 0.8, 0.99, 1e-6)),
    Port("adamaxw", "AdamaxW", (1e-2, 0.8, 0.99, 1e-6, 0.05, None)),
    Port(
        "adamw",
        "AdamW",
        (1e-2, 0.8, 0.99, 1e-6, 0.0, None, 0.05, None),
        note="`mask=` as optax's",
    ),
    Port("adan", "Adan", (1e-2, 0.9, 0.9, 0.95, 1e-6, 1e-8, 0.05, None)),
    Port("amsgrad", "AMSGrad", (1e-2, 0.8, 0.99, 1e-6, 0.0, None, True, True)),
    Port("fromage", "Fromage", (0.05, 1e-5)),
    Port("lamb", "LAMB", (1e-2, 0.8, 0.99, 1e-6, 0.0, 0.05, None)),
    Port("lars", "LARS", (0.1, 0.05, True, 0.01, 0.0, True, 0.8, False)),
    Port(
        "lbfgs",
        "LBFGS",
        (1.0, 5, True, DEFAULT),
        note="the same zoom linesearch; the loss function goes to `update`/`step` "
        "as `value_fn=`",
        extra="lbfgs",
    ),
    Port("lion", "Lion", (1e-2, 0.8, 0.95, None, 0.05, None)),
    Port(
        "nadam",
        "NAdam",
        (1e-2, 0.8, 0.99, 1e-6, 0.0, None),
        note="default `momentum_decay=inf` is optax's constant momentum",
    ),
    Port("nadamw", "NAdamW", (1e-2, 0.8, 0.99, 1e-6, 0.0, None, 0.05, None)),
    Port(
        "noisy_sgd",
        "NoisySGD",
        (0.05, 0.02, 0.6, 3),
        note="the same key gives the same noise",
    ),
    Port(
        "dpsgd",
        "DPSGD",
        (0.05, 1.0, 0.5, 3, 0.8, True),
        note="per-example gradients; the same seed gives the same noise",
        extra="per_example",
    ),
    Port("novograd", "NovoGrad", (1e-2, 0.8, 0.3, 1e-6, 0.0, 0.05)),
    Port(
        "optimistic_adam_v2",
        "OptimisticAdam",
        (1e-2,),
        kwargs=dict(alpha=0.8, beta=0.5, b1=0.8, b2=0.99, eps=1e-6),
    ),
    Port("optimistic_gradient_descent", "OptimisticGradientDescent", (0.05, 0.8, 0.5)),
    Port(
        "polyak_sgd",
        "PolyakSGD",
        (0.5, 0.8, 0.1, 1e-3, "sps"),
        note="the loss as `value=`",
        extra="value",
        differs="for `scaling` other than 1 (its default), where optax also divides "
        "the rate by `scaling**2` (it takes the norm of the scaled gradient); "
        "eqxopt keeps `scaling` a plain factor on the step, as optax documents it",
    ),
    Port(
        "radam",
        "RAdam",
        (0.05, 0.8, 0.99, 1e-6, 0.0, 5.0),
        note="matches torch's float64 `rho_t`; optax to rtol 3e-4",
        rtol=3e-4,
    ),
    Port("rmsprop", "RMSProp", (1e-2, 0.8, 1e-6, 0.1, True, True, 0.5, True, True)),
    Port(
        "rprop",
        "Rprop",
        (1e-2, 0.4, 1.3, 1e-5, 10.0),
        note="as torch's",
        differs="optax's update lags one step (optax PR 1725)",
    ),
    Port("sgd", "SGD", (0.05, 0.8, True, None)),
    Port("sign_sgd", "SignSGD", (1e-2,)),
    Port("signum", "Signum", (1e-2, 0.8, None)),
    Port("sm3", "SM3", (0.05, 0.8)),
    Port("yogi", "Yogi", (1e-2, 0.8, 0.99, 1e-2)),
    Port(
        "contrib.ademamix",
        "AdEMAMix",
        (1e-2, 0.8, 0.99, 0.999, 4.0, 1e-6, 0.0, None, 0.05, None),
    ),
    Port(
        "contrib.acprop",
        "ACProp",
        (1e-2, 0.8, 0.99, 1e-6, 1e-8, 0.05, None),
    ),
    Port(
        "contrib.adopt",
        "ADOPT",
        (1e-2, 0.8, 0.99, 1e-6, None),
        kwargs=dict(nesterov=True, use_clipping=True),
    ),
    Port(
        "contrib.cocob",
        "COCOB",
        (1.0, 50.0, 1e-8, 0.0, None),
        atol=1e-5,
    ),
    Port(
        "contrib.dadapt_adamw",
        "DAdaptAdamW",
        (1.0, (0.8, 0.99), 1e-8, 1e-2, 0.05),
    ),
    Port(
        "contrib.differentially_private_aggregate",
        "DifferentiallyPrivateAggregate",
        (1.0, 0.5, 3),
        note="per-example gradients; `key=` is `seed=`, the same noise",
        extra="per_example",
    ),
    Port(
        "contrib.dpsgd",
        "DPSGD",
        (0.05, 1.0, 0.5, 3, 0.8, True),
        note="per-example gradients; the same seed gives the same noise",
        extra="per_example",
    ),
    Port("contrib.dog", "DoG", (1.0, ("heuristic", 1e-2), 1e-8, 0.05, None)),
    Port("contrib.dowg", "DoWG", (1.0, 1e-2, 1e-4, 0.05, None)),
    Port(
        "contrib.galore",
        "GaLore",
        (1e-2, 2, 2, 0.5, None, 0.05, None, None),
        note="its default `scale_by_adam` base and 2-D leaves",
    ),
    Port("contrib.madgrad", "MADGRAD", (0.05, 0.8, 0.05, 1e-6)),
    Port(
        "contrib.momo",
        "Momo",
        (0.5, 0.8, 0.0, 0.05, False),
        note="the loss as `value=`",
        extra="value",
    ),
    Port(
        "contrib.momo_adam",
        "MomoAdam",
        (0.05, 0.8, 0.99, 1e-6, 0.0, 0.05, False),
        note="the loss as `value=`",
        extra="value",
    ),
    Port(
        "contrib.muon",
        "Muon",
        (0.05, (3.4445, -4.775, 2.0315), 4, 0.9, 1e-7, 0.05, None, None),
        kwargs=dict(adam_b1=0.8, adam_b2=0.99, adam_weight_decay=0.01),
        note="AdamW for the leaves that are not matrices, as optax's",
    ),
    Port(
        "contrib.prodigy",
        "Prodigy",
        (1.0, (0.8, 0.99), None, 1e-8, 1e-2, 0.5, 0.05, False),
    ),
    Port(
        "contrib.simplified_ademamix",
        "SimplifiedAdEMAMix",
        (1e-2, 0.8, 0.99, 2.0, 1e-6, 0.0, 0.05, None),
    ),
    Port(
        "contrib.schedule_free",
        "ScheduleFree",
        (Inner("adam", "Adam", (0.05, 0.0)), 0.05, 0.8, 2.0, None),
    ),
    Port(
        "contrib.schedule_free_adamw",
        "ScheduleFreeAdamW",
        (0.05, None, 0.8, 0.99, 1e-6, 0.05, 2.0, None),
    ),
    Port(
        "contrib.schedule_free_sgd",
        "ScheduleFreeSGD",
        (0.5, None, 0.8, 0.05, 2.0, None),
    ),
    Port(
        "contrib.sophia",
        "Sophia",
        (0.05, 0.8, 0.95, 1e-8, 0.01, None, 0.05, 0.5, 2, DEFAULT, None, False, 0),
        note="the Hutchinson estimate with the loss as `obj_fn=`, or `hessian=`",
        extra="obj_fn",
    ),
]

OPTAX_OPTIMIZER_ROWS = [
    Port(
        "optimistic_adam",
        "OptimisticAdamV1",
        (0.05, 0.5, 0.8, 0.99, 1e-6),
        note="the deprecated form; also `OptimisticAdam(1.0, alpha=lr, beta=optimism)`",
    ),
    Row(
        ("contrib.sam",),
        "`SAM(inner, rho)`: one `update`/`step` per training step, given the "
        "gradient at `p` and `grad_fn=` for the one at the perturbed point (optax's "
        "default loop calls `update` twice per step, the second time with that "
        "gradient; its `opaque_mode=True` `grad_fn(params, i)` goes in as "
        "`grad_fn=grad_fn, fn_args=(0,)`); the ascent step is a normalised SGD step",
        ("SAM",),
    ),
    Row(
        ("contrib.schedule_free_eval_params",),
        "`opt.eval_params(state, params)` (`ScheduleFree`, `ScheduleFreeSGD`, "
        "`ScheduleFreeAdamW`)",
        ("ScheduleFree.eval_params", "ScheduleFreeSGD.eval_params"),
    ),
    Row(
        ("contrib.mechanize",),
        "`Mechanic(inner)`",
        ("Mechanic",),
    ),
]

OPTAX_SCHEDULES = [
    Port("constant_schedule", "Constant", (0.3,)),
    Port("linear_schedule", "Linear", (0.5, 0.1, 10, 2)),
    Port("polynomial_schedule", "Polynomial", (0.5, 0.1, 2.0, 10, 2)),
    Port(
        "piecewise_constant_schedule",
        "PiecewiseConstant",
        (0.5, {3: 0.5, 7: 0.1}),
    ),
    Port(
        "piecewise_interpolate_schedule",
        "PiecewiseInterpolate",
        ("cosine", 0.5, {3: 0.5, 7: 0.1}),
    ),
    Port(
        "exponential_decay",
        "ExponentialDecay",
        (0.5, 3, 0.5, 2, True, 0.05),
        note="raises on `transition_steps <= 0` and `decay_rate == 0`, which optax "
        "turns into a constant",
    ),
    Port("cosine_decay_schedule", "CosineDecay", (0.5, 10, 0.1, 1.5)),
    Port("warmup_constant_schedule", "WarmupConstant", (0.1, 0.5, 4)),
    Port(
        "warmup_exponential_decay_schedule",
        "WarmupExponentialDecay",
        (0.1, 0.5, 3, 4, 0.5, 1, False, 0.05),
    ),
    Port("linear_onecycle_schedule", "LinearOneCycle", (20, 0.5, 0.3, 0.8, 20.0, 1e3)),
    Port("cosine_onecycle_schedule", "CosineOneCycle", (20, 0.5, 0.3, 20.0, 1e3)),
]

OPTAX_SCHEDULE_ROWS = [
    Call(
        "optax.warmup_cosine_decay_schedule(0.0, peak, warmup, total, end)",
        "eqxopt.WarmupCosine(peak, end, warmup, total)",
        values=dict(peak=0.5, end=0.05, warmup=4, total=12),
        note="the warmup starts at 0; by keyword: `peak_lr`, `min_lr`, "
        "`warmup_steps`, `total_steps`",
        covers=("warmup_cosine_decay_schedule",),
        steps=16,
    ),
    Call(
        "optax.sgdr_schedule([dict(init_value=0.0, peak_value=peak, warmup_steps=w, "
        "decay_steps=n, end_value=end)] * 2)",
        "eqxopt.SGDR([dict(init_value=0.0, peak_value=peak, warmup_steps=w, "
        "decay_steps=n, end_value=end)] * 2)",
        values=dict(peak=0.5, w=2, n=6, end=0.05),
        covers=("sgdr_schedule",),
        steps=14,
    ),
    Call(
        "optax.join_schedules([optax.constant_schedule(a), "
        "optax.constant_schedule(b)], [n])",
        "eqxopt.Join([eqxopt.Constant(a), eqxopt.Constant(b)], [n])",
        values=dict(a=0.5, b=0.1, n=4),
        covers=("join_schedules",),
        steps=8,
    ),
    Row(
        ("contrib.reduce_on_plateau",),
        "`ReduceOnPlateau` (a transform fed the loss with `value=`; the same "
        "arguments)",
        ("ReduceOnPlateau",),
    ),
    Row(
        ("inject_hyperparams", "inject_stateful_hyperparams"),
        "not needed: every hyperparameter is already dynamic, and any can be a "
        "schedule",
    ),
]

OPTAX_TRANSFORMS = [
    Port("clip", "ClipByValue", (0.3,)),
    Port(
        "clip_by_global_norm",
        "ClipByGlobalNorm",
        (0.5,),
        note="state `.norm` is the norm before clipping",
    ),
    Port("clip_by_block_rms", "ClipByBlockRMS", (0.3,)),
    Port("adaptive_grad_clip", "AdaptiveGradClip", (0.1, 1e-3, None)),
    Port(
        "add_decayed_weights",
        "AddDecayedWeights",
        (0.1, None),
        note="coupled L2; `DecoupledWeightDecay` after an optimizer",
    ),
    Port(
        "add_noise",
        "AddNoise",
        (0.1, 0.55, 3),
        note="the same noise for the same seed (`seed=`, an int)",
    ),
    Port("centralize", "Centralize", ()),
    Port(
        "apply_if_finite",
        "SkipNonFinite",
        (sgd(), 3),
        note="or `apply_if_finite`, the same",
    ),
    Port("zero_nans", "ZeroNans", ()),
    Port(
        "MultiSteps",
        "MultiSteps",
        (sgd(), 2, True, None, DEFAULT),
    ),
    Port("trace", "Trace", (0.8, True, None), note="or `SGD(lr, momentum=...)`"),
    Port("scale_by_adam", "ScaleByAdam", (0.8, 0.99, 1e-6, 0.0, None)),
    Port("scale_by_rms", "ScaleByRms", (0.8, 1e-6, 0.1, True, True)),
    Port("scale_by_adamax", "ScaleByAdamax", (0.8, 0.99, 1e-6), note="or `Adamax`"),
    Port(
        "scale_by_amsgrad",
        "ScaleByAmsgrad",
        (0.8, 0.99, 1e-6, 1e-9, None, True, False),
        note="or `AMSGrad`",
    ),
    Port("scale_by_adadelta", "ScaleByAdadelta", (0.8, 1e-5), note="or `Adadelta`"),
    Port(
        "scale_by_adan",
        "ScaleByAdan",
        (0.9, 0.9, 0.95, 1e-6, 1e-8),
        note="or `Adan`",
    ),
    Port(
        "scale_by_belief",
        "ScaleByBelief",
        (0.8, 0.99, 1e-8, 1e-12),
        kwargs=dict(nesterov=True),
        note="or `AdaBelief`",
    ),
    Port(
        "scale_by_lion",
        "ScaleByLion",
        (0.8, 0.95, None),
        kwargs=dict(mode="smooth", smooth_beta=2.0),
        note='or `Lion` (the `"hard"` mode)',
    ),
    Port(
        "scale_by_novograd",
        "ScaleByNovograd",
        (0.8, 0.3, 1e-6, 0.0, 0.05, None),
        note="or `NovoGrad`",
    ),
    Port(
        "scale_by_radam",
        "ScaleByRadam",
        (0.8, 0.99, 1e-6, 0.0, 5.0),
        note="or `RAdam`; `rho_t` without float32 cancellation",
    ),
    Port("scale_by_rss", "ScaleByRss", (0.5, 1e-6), note="or `Adagrad`"),
    Port(
        "scale_by_yogi",
        "ScaleByYogi",
        (0.8, 0.99, 1e-3, 0.0, 1e-4),
        note="or `Yogi`",
    ),
    Port(
        "scale_by_rprop",
        "ScaleByRprop",
        (1e-2, 0.4, 1.3, 1e-5, 10.0),
        note="as `Rprop`'s",
        differs="optax's update lags one step (optax PR 1725)",
    ),
    Port("scale_by_sm3", "ScaleBySm3", (0.8, 0.95, 1e-6)),
    Port("scale_by_stddev", "ScaleByStddev", (0.8, 1e-6, 0.1, True, True)),
    Port("scale_by_factored_rms", "ScaleByFactoredRms", (True, 0.7, 0, 2, 1e-20)),
    Port("scale_by_param_block_norm", "ScaleByParamBlockNorm", (0.01,)),
    Port("scale_by_param_block_rms", "ScaleByParamBlockRms", (0.01,)),
    Port("scale_by_optimistic_gradient", "ScaleByOptimisticGradient", (0.8, 0.5)),
    Port("scale_by_polyak", "ScaleByPolyak", (0.1, 0.5, 1e-3, "sps+"), extra="value"),
    Port(
        "scale_by_distance_over_gradients",
        "ScaleByDistanceOverGradients",
        (1e-4, 1e-6, DEFAULT, 0.5),
        note="layer-wise DoG; `DoG` for the whole-model one",
    ),
    Port(
        "scale_by_lbfgs",
        "ScaleByLBFGS",
        (4, False),
        note="optax's sign, `+H g` (a descent step needs `ScaleByLearningRate` "
        "after it); `LBFGS(learning_rate, linesearch=False)` is the chain with "
        "`ScaleByLearningRate`, and returns `-learning_rate * H g`",
    ),
    Port("scale_by_sign", "ScaleBySign", ()),
    Port("scale_by_trust_ratio", "ScaleByTrustRatio", (0.0, 0.5, 0.0)),
    Port(
        "scale_by_learning_rate",
        "ScaleByLearningRate",
        (0.1,),
        kwargs=dict(flip_sign=True),
        note="multiplies by `-lr`, a number or a schedule; `flip_sign=False` by `+lr`",
    ),
    Port("identity", "Identity", ()),
    Port(
        "scale_by_backtracking_linesearch",
        "ScaleByBacktrackingLinesearch",
        (3, 1e-4, 0.8, 1.5, 1.0, 0.0, 0.0, False),
        note="the loss function as `value_fn=` (with `value=`, `grad=` where "
        "known), as `LBFGS`'s; `verbose` is left out: `state.decrease_error` says "
        "how the search ended",
        extra="lbfgs",
    ),
    Port(
        "keep_params_nonnegative",
        "KeepParamsNonnegative",
        (),
        note="the last link, after the learning rate",
    ),
    Port("normalize_by_update_norm", "NormalizeByUpdateNorm", (-0.05, 1e-3)),
    Port(
        "contrib.split_real_and_imaginary",
        "SplitRealAndImaginary",
        (Inner("adam", "Adam", (0.05,)),),
        note="complex leaves as `RealImaginaryPair`s of real ones for `inner`",
    ),
    Port(
        "ema",
        "EMA",
        (0.8, True, None),
        note="an average of the updates; `ParamEMA(inner, decay)` keeps one of the "
        "parameters",
    ),
]

OPTAX_TRANSFORM_ROWS = [
    Row(
        ("chain", "named_chain"),
        '`Chain(*links, names=...)`; state indexed by name: `state["AdamW"]`',
        ("Chain",),
    ),
    Row(
        ("partition", "multi_transform"),
        "`Partition(transforms, labels)` (`param_labels=` is `labels=`)",
        ("Partition",),
    ),
    Row(("masked",), "`Masked(inner, mask)`", ("Masked",)),
    Row(
        ("freeze", "set_to_zero"),
        "`Freeze(inner, frozen)` (frozen leaves: no update and no state)",
        ("Freeze",),
    ),
    Row(("selective_transform",), "`Partition` or `Freeze`", ("Partition", "Freeze")),
    Row(
        ("transforms.unitwise_clip", "transforms.unitwise_norm"),
        "inside `AdaptiveGradClip`; not public",
        ("AdaptiveGradClip",),
    ),
    Row(
        ("per_example_global_norm_clip", "per_example_layer_norm_clip"),
        "`per_example_global_norm_clip`, `per_example_layer_norm_clip` (the same "
        "arguments and results; any tree of per-example gradients)",
        ("per_example_global_norm_clip", "per_example_layer_norm_clip"),
    ),
    Row(
        ("differentially_private_aggregate",),
        "`DifferentiallyPrivateAggregate(l2_norm_clip, noise_multiplier, seed)` "
        "(as `contrib.differentially_private_aggregate`)",
        ("DifferentiallyPrivateAggregate",),
    ),
    Row(("global_norm",), "`global_norm`", ("global_norm",)),
    Call(
        "optax.MultiSteps(optax.sgd(lr), k, "
        "should_skip_update_fn=optax.skip_not_finite)",
        "eqxopt.MultiSteps(eqxopt.SGD(lr), k, "
        "should_skip_update_fn=eqxopt.skip_not_finite)",
        values=dict(lr=0.1, k=2),
        covers=("skip_not_finite",),
        note="the same predicate and `skip_state`; as a wrapper of any optimizer: "
        "`SkipNonFinite(inner)`",
    ),
    Call(
        "optax.MultiSteps(optax.sgd(lr), k, should_skip_update_fn=partial("
        "optax.skip_large_updates, max_squared_norm=m))",
        "eqxopt.MultiSteps(eqxopt.SGD(lr), k, should_skip_update_fn=partial("
        "eqxopt.skip_large_updates, max_squared_norm=m))",
        values=dict(lr=0.1, k=2, m=40.0, partial=functools.partial),
        covers=("skip_large_updates",),
        note="`eqxopt.skip_large_updates` for `optax.skip_large_updates`, its bound "
        "bound with `functools.partial`; as a wrapper of any optimizer: "
        "`SkipLargeUpdates(inner, max_squared_norm)`",
    ),
    Row(
        ("apply_every",),
        "`MultiSteps(inner, every_k, mean=False)` (sums gradients for `inner`, where "
        "`apply_every` sums the updates)",
        ("MultiSteps",),
    ),
    Row(
        ("microbatch",),
        "`microbatch(fn, num_microbatches, batch_argnums)` (a `lax.scan` over "
        "slices, results averaged); or `MultiSteps` across calls",
        ("microbatch",),
    ),
    Row(
        ("lookahead",),
        "`Lookahead(inner, sync_period, alpha)` (the slow weights live in the state, "
        "not in a `LookaheadParams`)",
        ("Lookahead",),
    ),
    Call(
        "optax.snapshot(name, optax.tree.norm)",
        "eqxopt.Snapshot(name, eqxopt.tree_norm)",
        values=dict(name="norm"),
        covers=("snapshot",),
        note="read it with `eqxopt.tree_get(state, name)`",
    ),
    Call(
        "optax.monitor({name: optax.measure_with_ema(optax.tree.norm, decay)})",
        "eqxopt.MeasureWithEMA(eqxopt.tree_norm, decay)",
        values=dict(name="norm", decay=0.8),
        covers=("measure_with_ema",),
        note="a link of its own that passes the updates on; the average is "
        "`state.measurement`",
    ),
    Row(
        ("monitor",),
        "`Monitor(inner)` records gradient and update norms in the state; states are "
        'named, so read `state["ClipByGlobalNorm"].norm` and the like; '
        "`hyperparameters(opt, state)` for the values in use",
        ("Monitor", "hyperparameters"),
    ),
    Call(
        "optax.conditionally_transform(optax.sgd(lr), fn)",
        "eqxopt.ConditionallyTransform(eqxopt.SGD(lr), fn)",
        values=dict(lr=0.1, fn=every_other_step),
        covers=("conditionally_transform",),
        note="`fn(step) -> bool`, static: one function, not a new lambda each time",
    ),
    Call(
        "optax.conditionally_mask(optax.sgd(lr), fn)",
        "eqxopt.ConditionallyMask(eqxopt.SGD(lr), fn)",
        values=dict(lr=0.1, fn=every_other_step),
        covers=("conditionally_mask",),
        note="zero updates at the steps not taken",
    ),
    Call(
        "optax.contrib.normalize()",
        "eqxopt.NormalizeByUpdateNorm(eps=0.0)",
        values={},
        covers=("contrib.normalize",),
        note="`normalize_by_update_norm` with `scale_factor=1`, `eps=0`",
    ),
    Row(
        ("flatten",),
        "`pack` (flat buffers per dtype, for the parameters themselves)",
        ("pack",),
    ),
    Row(
        ("stateless",),
        "`Stateless(fn)` (pass one function, not a new lambda per optimizer)",
        ("Stateless",),
    ),
    Row(
        ("stateless_with_tree_map",),
        "`Stateless(functools.partial(jax.tree.map, f))`",
        ("Stateless",),
    ),
    Row(
        ("scale_by_schedule",),
        "`ScaleByLearningRate(schedule, flip_sign=False)`",
        ("ScaleByLearningRate",),
    ),
    Row(
        ("scale",),
        "`ScaleByLearningRate(c, flip_sign=False)` for `c >= 0`, "
        "`ScaleByLearningRate(-c)` for `c < 0`",
        ("ScaleByLearningRate",),
    ),
    Row(
        (
            "contrib.scale_by_acprop",
            "contrib.scale_by_ademamix",
            "contrib.scale_by_adopt",
            "contrib.scale_by_cocob",
            "contrib.scale_by_galore",
            "contrib.scale_by_madgrad",
            "contrib.scale_by_muon",
            "contrib.scale_by_simplified_ademamix",
        ),
        "not separate building blocks: each optimizer is one fused per-leaf rule "
        "(one pass over the data); use the optimizer, or "
        "`from_optax(optax.scale_by_...)`",
        ("from_optax",),
    ),
    Row(
        ("scale_by_zoom_linesearch",),
        "`LBFGS`'s own linesearch: its options go to `LBFGS` (`max_linesearch_steps`, "
        "`max_learning_rate`, `tol`, `increase_factor`, `slope_rtol`, `curv_rtol`, "
        "`approx_dec_rtol`, `stepsize_precision`); `LBFGS(linesearch=optax."
        "scale_by_zoom_linesearch(...))` is refused, naming them",
        ("LBFGS",),
    ),
    Row(
        ("value_and_grad_from_state",),
        "`LBFGS.value_and_grad(state, params, fn, **data)`",
        ("LBFGS.value_and_grad",),
    ),
    Row(
        ("scale_gradient",),
        "`scale_gradient(inputs, scale)` (float leaves of a whole model; a traced "
        "scale)",
        ("scale_gradient",),
    ),
    Row(
        ("apply_updates",),
        "`apply_updates` (keeps each parameter's dtype)",
        ("apply_updates",),
    ),
    Row(
        ("incremental_update", "periodic_update"),
        "`incremental_update(new, old, step_size)`, `periodic_update(new, old, "
        "steps, update_period)` (target networks; whole Equinox models too)",
        ("incremental_update", "periodic_update"),
    ),
    Row(("init_empty_state",), "`EmptyState()`", ("EmptyState",)),
    Row(
        ("with_extra_args_support",),
        "not needed: `Chain` passes keywords such as `value=` to the links that "
        "take them",
        ("Chain",),
    ),
    Row(("tree_map_params",), "`jax.tree.map` on the named state"),
    Row(
        (
            "bias_correction",
            "update_moment",
            "update_infinity_moment",
            "update_moment_per_elem_norm",
            "safe_norm",
            "safe_root_mean_squares",
            "safe_increment",
            "safe_int32_increment",
        ),
        "internal helpers, not public in eqxopt",
    ),
    Row(
        ("contrib.hutchinson_estimator_diag_hessian",),
        "inside `Sophia` (its `obj_fn=`)",
        ("Sophia",),
    ),
]

OPTAX_TYPES = [
    Row(
        ("GradientTransformation", "GradientTransformationExtraArgs"),
        "`AbstractTransform`, the base of every optimizer and transform "
        "(`opt.to_optax()` gives one to optax code, `from_optax(tx)` takes one)",
        ("AbstractTransform", "AbstractTransform.to_optax", "from_optax"),
    ),
    Row(
        ("TransformInitFn", "TransformUpdateFn", "TransformUpdateExtraArgsFn"),
        "the methods `init` and `update` (and `step`, the two fused)",
        ("AbstractTransform.init", "AbstractTransform.update"),
    ),
    Row(
        ("OptState", "Params", "Updates"),
        "any pytree; each transform's state is a module with named fields",
    ),
    Row(
        ("Schedule", "ScalarOrSchedule"),
        "`AbstractSchedule`; every float hyperparameter takes a number, a scalar "
        "array or a schedule",
        ("AbstractSchedule",),
    ),
    Row(
        ("MaskOrFn",),
        "`mask=`: a tree of bools (or a prefix), or a function of the parameters",
    ),
    Row(
        ("ShouldSkipUpdateFunction",),
        "`MultiSteps`'s `should_skip_update_fn`: a function `(grads, gradient_step, "
        "params) -> (should_skip, skip_state)`, such as `skip_not_finite`; or the "
        "wrappers `SkipNonFinite`, `SkipLargeUpdates`",
        (
            "MultiSteps",
            "skip_not_finite",
            "skip_large_updates",
            "SkipNonFinite",
            "SkipLargeUpdates",
        ),
    ),
    Row(
        ("ZoomLinesearchInfo",),
        "`LBFGSState.linesearch_steps`",
        ("LBFGSState.linesearch_steps",),
    ),
    Row(
        ("contrib.MuonDimensionNumbers", "contrib.GaLoreDimensionNumbers"),
        "`Muon(muon_mask=...)` (matrices as `(in, out)`, as optax's default); "
        "GaLore projects 2-D leaves",
        ("Muon", "GaLore"),
    ),
    Row(
        (
            "AdaptiveGradClipState",
            "AddDecayedWeightsState",
            "AddNoiseState",
            "ApplyEvery",
            "ApplyIfFiniteState",
            "ClipByGlobalNormState",
            "ClipState",
            "ConditionallyMaskState",
            "ConditionallyTransformState",
            "DifferentiallyPrivateAggregateState",
            "EmaState",
            "EmptyState",
            "FactoredState",
            "InjectHyperparamsState",
            "InjectStatefulHyperparamsState",
            "LookaheadParams",
            "LookaheadState",
            "MaskedNode",
            "MaskedState",
            "MonitorState",
            "MultiStepsState",
            "MultiTransformState",
            "NonNegativeParamsState",
            "PartitionState",
            "ScaleByAdaDeltaState",
            "ScaleByAdamState",
            "ScaleByAdanState",
            "ScaleByAmsgradState",
            "ScaleByBacktrackingLinesearchState",
            "ScaleByBeliefState",
            "ScaleByLBFGSState",
            "ScaleByLionState",
            "ScaleByNovogradState",
            "ScaleByRStdDevState",
            "ScaleByRmsState",
            "ScaleByRpropState",
            "ScaleByRssState",
            "ScaleBySM3State",
            "ScaleByScheduleState",
            "ScaleByTrustRatioState",
            "ScaleByZoomLinesearchState",
            "ScaleState",
            "TraceState",
            "ZeroNansState",
            "contrib.COCOBState",
            "contrib.DAdaptAdamWState",
            "contrib.DifferentiallyPrivateAggregateState",
            "contrib.DoGState",
            "contrib.DoWGState",
            "contrib.GaLoreState",
            "contrib.HutchinsonState",
            "contrib.MadgradState",
            "contrib.MechanicState",
            "contrib.MomoAdamState",
            "contrib.MomoState",
            "contrib.MuonState",
            "contrib.NormalizeState",
            "contrib.ProdigyState",
            "contrib.ReduceLROnPlateauState",
            "contrib.SAMState",
            "contrib.ScaleByAdemamixState",
            "contrib.ScaleBySimplifiedAdEMAMixState",
            "contrib.ScheduleFreeState",
            "contrib.SophiaState",
            "contrib.SplitRealAndImaginaryState",
        ),
        "each transform's own state module (`AdamState`, `ChainState`, "
        "`COCOBState`, ...) with named fields (`state.mu`, `state.step`)",
        ("AdamState", "ChainState", "COCOBState"),
    ),
]

OPTAX_OUT_OF_SCOPE = [
    Row(
        (
            "softmax_cross_entropy",
            "softmax_cross_entropy_with_integer_labels",
            "safe_softmax_cross_entropy",
            "sigmoid_binary_cross_entropy",
            "sigmoid_focal_loss",
            "l2_loss",
            "squared_error",
            "huber_loss",
            "hinge_loss",
            "log_cosh",
            "cosine_distance",
            "cosine_similarity",
            "kl_divergence",
            "convex_kl_divergence",
            "generalized_kl_divergence",
            "ctc_loss",
            "ctc_loss_with_forward_probs",
            "ntxent",
            "smooth_labels",
        ),
        "losses: outside eqxopt's scope (use optax's, or `optax.losses`)",
    ),
    Row(
        (
            "matrix_inverse_pth_root",
            "power_iteration",
            "multi_normal",
            "nnls",
        ),
        "linear algebra and solvers: outside eqxopt's scope",
    ),
    Row(
        (
            "tree_utils",
            "projections",
            "assignment",
            "perturbations",
            "second_order",
            "losses",
            "schedules",
            "transforms",
            "contrib",
            "tree",
        ),
        "optax's submodules: their optimizers, schedules and transforms are the rows "
        "above; the rest is outside eqxopt's scope",
    ),
]

# Code that reads or edits optax's state (tests/test_migration.py runs optax's call
# on optax's state beside the eqxopt way on eqxopt's, each row).
OPTAX_STATE = [
    Call(
        'optax.tree.get(state, "count")',
        'eqxopt.tree_get(state, "step")',
        names=("tree_get", "AdamState.step"),
        note="or `state.step` of one optimizer's state. `optax.tree.get` looks "
        "inside optax's named-tuple states and dicts only: on an eqxopt state it "
        "finds nothing and returns its default, `None`",
    ),
    Call(
        "optax.value_and_grad_from_state(f)(params, state=state)",
        "opt.value_and_grad(state, params, f)",
        names=("LBFGS.value_and_grad", "LBFGSState.value", "LBFGSState.grad"),
        note="the loss and gradient `LBFGS`'s linesearch computed at the new "
        "parameters (`state.value`, `state.grad`), or `f`'s where there are none; "
        "optax's function finds them in optax's named-tuple states only",
    ),
    Call(
        'state.hyperparams["learning_rate"]',
        'eqxopt.hyperparameters(opt, state)["learning_rate"]',
        names=("hyperparameters",),
        note="every value the next update uses, schedules called at the step "
        "`state` has reached (optax's `state.hyperparams` holds those the last "
        "update used), with no `optax.inject_hyperparams` around the optimizer",
    ),
    Call(
        'state.hyperparams["learning_rate"] = lr',
        "opt = dataclasses.replace(opt, learning_rate=lr)",
        names=("AdamW.learning_rate",),
        note="a new optimizer, its values checked; passed to the compiled step as "
        "an argument, it reuses the compiled code",
    ),
    Call(
        "optax.apply_updates(params, updates)",
        "eqxopt.apply_updates(params, updates)",
        names=("apply_updates", "Freeze"),
        note="where updates hold `None`: `Freeze`'s frozen leaves and leaves whose "
        "gradient is `None` get no update, which `optax.apply_updates` cannot add "
        "(a `TypeError`); `eqxopt.apply_updates`, `eqx.apply_updates` and "
        "`opt.step` leave those leaves as they are",
    ),
]

OPTAX_TABLES = {
    "calls": OPTAX_CALLS,
    "state": OPTAX_STATE,
    "optimizers": [*OPTAX_OPTIMIZERS, *OPTAX_OPTIMIZER_ROWS],
    "schedules": [*OPTAX_SCHEDULES, *OPTAX_SCHEDULE_ROWS],
    "transforms": [*OPTAX_TRANSFORMS, *OPTAX_TRANSFORM_ROWS],
    "types": OPTAX_TYPES,
    "scope": OPTAX_OUT_OF_SCOPE,
}

# ------------------------------------------------------------------- torch rows

TORCH_CALLS = [
    Call(
        "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)",
        "opt = eqxopt.AdamW(1e-3, weight_decay=1e-2); state = opt.init(model)",
        names=("AdamW", "AbstractTransform.init"),
        note="torch's default `weight_decay` is `1e-2`, eqxopt's optax's `1e-4`",
    ),
    Call(
        "loss.backward()",
        "loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)",
    ),
    Call(
        "opt.step()",
        "model, state = opt.step(grads, state, model)",
        names=("AbstractTransform.step",),
    ),
    Row(
        ("opt.zero_grad()",), "nothing: gradients are values, not accumulated in place"
    ),
    Call(
        "sched = StepLR(opt, 30, 0.1); sched.step()",
        "eqxopt.AdamW(eqxopt.StepDecay(1e-3, 30, 0.1))",
        names=("StepDecay",),
        note="the schedule is read at `state.step`",
    ),
    Call(
        "param_groups with their own lr / weight_decay",
        "eqxopt.Partition({...}, labels)",
        names=("Partition", "LearningRateMultipliers"),
        note="[cookbook](cookbook.md#per-parameter-learning-rates-and-freezing); "
        "groups that differ only in `lr`: `eqxopt.LearningRateMultipliers(opt, "
        "multipliers)`",
    ),
    Call("maximize=True", "eqxopt.Maximize(opt)", names=("Maximize",)),
    Row(
        ('for g in opt.param_groups: g["lr"] = new',),
        "build a new optimizer with the new value: no recompile "
        "([cookbook](cookbook.md#changing-hyperparameters-mid-run))",
    ),
    Row(
        ("opt.state_dict()", "load_state_dict"),
        "`eqx.tree_serialise_leaves` / `eqx.tree_deserialise_leaves` on the state "
        "([cookbook](cookbook.md#checkpointing-and-resuming))",
    ),
]

_TORCH_LR = 0.05

TORCH_OPTIMIZERS = [
    Call(
        "SGD(params, lr, momentum, nesterov=True)",
        "SGD(lr, momentum, nesterov=True)",
        values=dict(lr=_TORCH_LR, momentum=0.8),
        note="`weight_decay`: `Chain(AddDecayedWeights(wd), SGD(...))`",
    ),
    Call(
        "SGD(params, lr, momentum, dampening)",
        "SGD(lr, momentum, dampening=dampening)",
        values=dict(lr=_TORCH_LR, momentum=0.8, dampening=0.3),
        note="`dampening` is keyword-only (optax's third argument is `nesterov`)",
    ),
    Call(
        "Adam(params, lr, betas=(b1, b2), eps=eps)",
        "Adam(lr, b1, b2, eps)",
        values=dict(lr=_TORCH_LR, b1=0.8, b2=0.99, eps=1e-6),
        note='`amsgrad=True`: `AMSGrad(..., nu_correction="after_max")`',
    ),
    Call(
        "Adam(params, lr, amsgrad=True)",
        'AMSGrad(lr, nu_correction="after_max")',
        values=dict(lr=_TORCH_LR),
    ),
    Call(
        "AdamW(params, lr, betas=(b1, b2), eps=eps, weight_decay=wd)",
        "AdamW(lr, b1, b2, eps, weight_decay=wd)",
        values=dict(lr=_TORCH_LR, b1=0.8, b2=0.99, eps=1e-6, wd=0.1),
        note="eqxopt's default `weight_decay` is optax's `1e-4`, torch's is `1e-2`",
    ),
    Call(
        "NAdam(params, lr, momentum_decay=md)",
        "NAdam(lr, momentum_decay=md)",
        values=dict(lr=_TORCH_LR, md=4e-3),
        note="eqxopt's default `inf` is optax's constant momentum; "
        "`decoupled_weight_decay=True`: `NAdamW`",
    ),
    Call(
        "RAdam(params, lr, decoupled_weight_decay=True, weight_decay=wd)",
        "RAdam(lr, weight_decay=wd)",
        values=dict(lr=_TORCH_LR, wd=0.1),
        note="its `weight_decay` is decoupled; torch rectifies at `rho_t > 5`, "
        "eqxopt at `>= threshold`",
    ),
    Call("Adamax(params, lr)", "Adamax(lr)", values=dict(lr=_TORCH_LR)),
    Call(
        "Adagrad(params, lr)",
        "Adagrad(lr, initial_accumulator_value=0.0, eps=1e-10, eps_in_sqrt=False)",
        values=dict(lr=_TORCH_LR),
        note="eqxopt's defaults are optax's",
    ),
    Call(
        "Adadelta(params)",
        "Adadelta()",
        values={},
        note="the same defaults: `lr=1.0`, `rho=0.9`, `eps=1e-6`",
    ),
    Call(
        "RMSprop(params, lr, alpha=alpha, eps=eps, centered=True, momentum=m)",
        "RMSProp(lr, decay=alpha, eps=eps, eps_in_sqrt=False, centered=True, "
        "momentum=m)",
        values=dict(lr=0.01, alpha=0.99, eps=1e-8, m=0.5),
        note="`alpha` is `decay=`; torch's `eps` is outside the root",
    ),
    Call(
        "Rprop(params, lr, etas=(a, b), step_sizes=(c, d))",
        "Rprop(lr, a, b, c, d)",
        values=dict(lr=0.01, a=0.4, b=1.3, c=1e-5, d=10.0),
        note="`eta_minus`, `eta_plus`, `min_step_size`, `max_step_size`",
    ),
    Call(
        "ASGD(params, lr, lambd, alpha, t0, weight_decay)",
        "ASGD(lr, lambd, alpha, t0, weight_decay)",
        values=dict(lr=0.05, lambd=1e-3, alpha=0.75, t0=1.0, weight_decay=0.01),
        note="the same arguments, in torch's order",
    ),
    Call(
        "Adafactor(params, lr)",
        "Adafactor(lr)",
        values=dict(lr=0.05),
        differs="eqxopt's `Adafactor` is optax's; torch's (its own `beta2_decay`, "
        "`d` and `eps` pair, lr-relative step) is another parameterisation",
    ),
    Call(
        'LBFGS(params, lr, history_size=m, line_search_fn="strong_wolfe")',
        "LBFGS(lr, memory_size=m)",
        names=("LBFGS",),
        note="a zoom linesearch, as torch's `strong_wolfe`; the loss and loss "
        "function go to `step` as `value=`, `value_fn=` (torch takes a closure and "
        "iterates inside `step`: not the same steps)",
    ),
    Call(
        'Muon(params, lr, adjust_lr_fn="match_rms_adamw")',
        "Muon(lr, consistent_rms=0.2)",
        names=("Muon",),
        note="optax's formulation (AdamW for the non-matrix leaves); "
        "`consistent_rms=0.2` scales as torch's `match_rms_adamw`, "
        "`0.2 * sqrt(max(m, n))`; torch's default scaling reads the shape as "
        "`(out, in)`, eqxopt's as optax's `(in, out)`",
    ),
    Missing(("SparseAdam",), "JAX has no sparse gradients of this kind"),
    Row(("Optimizer",), "`AbstractTransform` (the base class)", ("AbstractTransform",)),
    Row(("lr_scheduler",), "the schedules below", ("AbstractSchedule",)),
    Row(
        ("swa_utils",),
        "`AveragedModel` (its default arithmetic mean): `SWA(opt, start, every)`, "
        "read with `state.averaged(params)`; `ParamEMA` for EMA weights; `SWALR`: "
        "the schedule below",
        ("SWA", "SWAState.averaged", "ParamEMA", "SWALR"),
    ),
    Row(
        ("swap_in_optimizer_params_and_state",),
        "not needed (parameters and state are values you pass)",
    ),
]

TORCH_SCHEDULERS = [
    Call(
        "StepLR(opt, step_size, gamma)",
        "StepDecay(lr, step_size, gamma)",
        values=dict(lr=0.5, step_size=3, gamma=0.5),
        steps=10,
    ),
    Call(
        "MultiStepLR(opt, milestones, gamma)",
        "MultiStepDecay(lr, milestones, gamma)",
        values=dict(lr=0.5, milestones=[2, 5], gamma=0.5),
        steps=8,
    ),
    Call(
        "ExponentialLR(opt, gamma)",
        "ExponentialDecay(lr, 1, gamma)",
        values=dict(lr=0.5, gamma=0.8),
        steps=6,
    ),
    Call(
        "LinearLR(opt, start_factor, end_factor, total_iters)",
        "Linear(lr * start_factor, lr * end_factor, total_iters)",
        values=dict(lr=0.5, start_factor=0.2, end_factor=0.9, total_iters=5),
        steps=8,
    ),
    Call(
        "ConstantLR(opt, factor, total_iters)",
        "PiecewiseConstant(lr * factor, {total_iters: 1 / factor})",
        values=dict(lr=0.5, factor=0.25, total_iters=3),
        steps=6,
    ),
    Call(
        "PolynomialLR(opt, total_iters, power)",
        "Polynomial(lr, 0.0, power, total_iters)",
        values=dict(lr=0.5, total_iters=6, power=2.0),
        steps=8,
    ),
    Call(
        "CosineAnnealingLR(opt, T_max, eta_min)",
        "CosineDecay(lr, T_max, alpha=eta_min / lr)",
        values=dict(lr=0.5, T_max=6, eta_min=0.05),
        note="up to `T_max`; torch's curve goes back up after it",
        steps=7,
    ),
    Call(
        "CosineAnnealingWarmRestarts(opt, T_0, eta_min=eta_min)",
        "SGDR([dict(init_value=lr, peak_value=lr, warmup_steps=0, decay_steps=T_0, "
        "end_value=eta_min)] * 2)",
        values=dict(lr=0.5, T_0=4, eta_min=0.05),
        note="equal cycles, no warmup",
        steps=8,
    ),
    Call(
        'CyclicLR(opt, base_lr, max_lr, step_size_up, mode="triangular2")',
        'Cyclic(base_lr, max_lr, step_size_up, mode="triangular2")',
        values=dict(base_lr=0.1, max_lr=0.5, step_size_up=2),
        note="the learning rate; its momentum cycling: the next row",
        steps=10,
    ),
    Call(
        "CyclicLR(opt, base_lr, max_lr, step_size_up, base_momentum=base_m, "
        "max_momentum=max_m)",
        "Cyclic(max_m, base_m, step_size_up)",
        values=dict(base_lr=0.1, max_lr=0.5, step_size_up=3, base_m=0.8, max_m=0.9),
        note="its momentum: the triangle upside down, passed as `momentum=` (SGD) "
        "or `b1=` (Adam: torch cycles `betas[0]`)",
        steps=10,
        reads="momentum",
    ),
    Call(
        "OneCycleLR(opt, max_lr, total_steps)",
        "CosineOneCycle(total_steps, max_lr)",
        values=dict(max_lr=0.5, total_steps=10),
        differs="optax's curve (`LinearOneCycle` / `CosineOneCycle`), close to "
        "torch's but not equal (torch ends each phase one step earlier)",
        steps=10,
    ),
    Call(
        "OneCycleLR(opt, max_lr, total_steps, three_phase=True)",
        "OneCycleMomentum(total_steps, three_phase=True)",
        values=dict(max_lr=0.5, total_steps=10),
        note="its momentum (`base_momentum`, `max_momentum` and torch's phase "
        "ends), passed as `momentum=` (SGD) or `b1=` (Adam)",
        steps=10,
        reads="momentum",
    ),
    Call(
        "SequentialLR(opt, [ConstantLR(opt, factor, n), ExponentialLR(opt, gamma)], "
        "[n])",
        "Join([Constant(lr * factor), ExponentialDecay(lr, 1, gamma)], [n])",
        values=dict(lr=0.5, factor=0.5, n=3, gamma=0.8),
        steps=7,
    ),
    Call(
        "swa_utils.SWALR(opt, swa_lr, anneal_epochs, anneal_strategy)",
        "SWALR(lr, swa_lr, anneal_epochs, anneal_strategy)",
        values=dict(lr=0.5, swa_lr=0.05, anneal_epochs=4, anneal_strategy="cos"),
        note="in steps; after another schedule: `Join([sched, SWALR(...)], "
        "[swa_start])`",
        steps=7,
    ),
    Call(
        "ReduceLROnPlateau(opt, factor=f, patience=p, threshold=t)",
        "Chain(opt, ReduceOnPlateau(f, p + 1, rtol=t))",
        names=("Chain", "ReduceOnPlateau"),
        note="fed the loss as `value=` (eqxopt's `patience` counts one more)",
    ),
    Call(
        "LambdaLR(opt, lr_lambda)",
        "Lambda(lr, lr_lambda)",
        values=dict(lr=0.5, lr_lambda=lambda step: 1 / (1 + step)),
        note="`lr_lambda` is called on the step array (JAX operations) and is "
        "static: a new function recompiles, a new step does not; numbers that "
        "should change without recompiling: an `AbstractSchedule` subclass (below)",
        steps=6,
    ),
    Row(
        ("MultiplicativeLR",),
        "out of scope: its rate is a running product of `lr_lambda` over every "
        "step so far, and an eqxopt schedule is a pure function of the step, "
        "evaluated at any step without history, so it could only recompute the "
        "product in an O(step) loop. Write the product in closed form as a "
        "`Lambda(lr, fn)`; a constant factor `g` is `ExponentialDecay(lr, 1, g)`",
        ("Lambda", "ExponentialDecay"),
    ),
    Call(
        "ChainedScheduler([ConstantLR(opt, factor, n), ExponentialLR(opt, gamma)])",
        "Product(lr, [PiecewiseConstant(factor, {n: 1 / factor}), "
        "ExponentialDecay(1.0, 1, gamma)])",
        values=dict(lr=0.5, factor=0.5, n=3, gamma=0.8),
        note="each factor a schedule from 1 (schedulers that multiply the rate)",
        steps=7,
    ),
    Row(("LRScheduler",), "`AbstractSchedule` (the base class)", ("AbstractSchedule",)),
]

TORCH_TABLES = {
    "calls": TORCH_CALLS,
    "optimizers": TORCH_OPTIMIZERS,
    "schedulers": TORCH_SCHEDULERS,
}


# ------------------------------------------------------------------- rendering


def _code(text: str) -> str:
    return f"`{text}`"


def optax_names(row: Any) -> tuple[str, ...]:
    """The optax names a row covers (`adamw`, `contrib.prodigy`)."""
    if isinstance(row, Port):
        return (row.optax,)
    if isinstance(row, Call):
        return row.covers
    return row.names


def positional(cls: type) -> str:
    """`AdamW(learning_rate, b1, b2, eps, *, ...)`: what a class takes by position."""
    params = list(inspect.signature(cls).parameters.values())
    names = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    more = any(p.kind is p.KEYWORD_ONLY for p in params)
    return f"{cls.__name__}({', '.join(names + (['*, ...'] if more else []))})"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _port_row(row: Port) -> str:
    notes = [row.note] if row.note else []
    if row.differs:
        notes.append(f"numbers differ: {row.differs}")
    ours = _code(positional(getattr(eqxopt, row.eqxopt)))
    return f"| `optax.{row.optax}` | {ours} | {_cell('; '.join(notes))} |"


def _names(names: tuple[str, ...], prefix: str) -> str:
    return ", ".join(f"`{prefix}{name}`" for name in names)


def render_table(name: str, rows: list, side: str) -> str:
    prefix = "optax." if side == "optax" else ""
    other = "optax" if side == "optax" else "torch"
    if name == "renamed":
        return _renamed_table()
    if name == "calls" or all(isinstance(r, (Call, Row, Missing)) for r in rows):
        header = [f"| {other} | eqxopt | notes |", "| --- | --- | --- |"]
    else:
        header = [
            f"| {other} | eqxopt (positional arguments, then keywords) | notes |",
            "| --- | --- | --- |",
        ]
    lines = list(header)
    for row in rows:
        if isinstance(row, Port):
            lines.append(_port_row(row))
        elif isinstance(row, Call):
            notes = [row.note] if row.note else []
            if row.differs:
                notes.append(f"numbers differ: {row.differs}")
            lines.append(
                f"| {_code(_cell(row.theirs))} | {_code(_cell(row.ours))} | "
                f"{_cell('; '.join(notes))} |"
            )
        elif isinstance(row, Row):
            lines.append(f"| {_names(row.names, prefix)} | {_cell(row.ours)} | |")
        elif isinstance(row, Missing):
            note = f" ({row.note})" if row.note else ""
            lines.append(f"| {_names(row.names, prefix)} | missing{_cell(note)} | |")
    return "\n".join(lines)


def renamed_arguments() -> list[tuple[str, str, str]]:
    """`(eqxopt class, optax's argument, eqxopt's spelling)` for every class's
    `renamed_arguments`, in the order of `eqxopt.__all__`."""
    from eqxopt._core._checks import renamed_advice

    out = []
    for name in eqxopt.__all__:
        cls = getattr(eqxopt, name)
        table = (
            getattr(cls, "renamed_arguments", None) if isinstance(cls, type) else None
        )
        for key, spelling in (table or {}).items():
            out.append((name, key, renamed_advice(spelling)))
    return out


def _renamed_table() -> str:
    lines = ["| eqxopt | optax's argument | eqxopt's spelling |", "| --- | --- | --- |"]
    for name, key, advice in renamed_arguments():
        cls = getattr(eqxopt, name)
        spelling = cls.renamed_arguments[key]
        theirs = f"`{key}=`"
        if isinstance(spelling, str):
            ours = advice
        else:
            ours = " and ".join(f"`{n}=`" for n in spelling)
            if key in cls.__dataclass_fields__:  # the same name, another form
                theirs = f"`{key}=` (a pair)"
            elif len(spelling) > 1:
                ours += " (optax's pair, split)"
        lines.append(f"| `{name}` | {theirs} | {_cell(ours)} |")
    return "\n".join(lines)


_TABLE = re.compile(r"(<!-- table: (\w+) -->\n)(.*?)(<!-- end table -->)", re.S)


def render(side: str) -> str:
    """The page of `side` ("optax" or "torch") with every table written anew."""
    tables = OPTAX_TABLES if side == "optax" else TORCH_TABLES
    text = PAGES[side].read_text()

    def table(match: re.Match) -> str:
        name = match.group(2)
        rows = tables.get(name, [])
        if name != "renamed" and name not in tables:
            raise KeyError(f"{PAGES[side].name} has a table {name!r} with no data")
        return match.group(1) + render_table(name, rows, side) + "\n" + match.group(4)

    return _TABLE.sub(table, text)


def main() -> None:
    for side, page in PAGES.items():
        page.write_text(render(side))


if __name__ == "__main__":
    main()
