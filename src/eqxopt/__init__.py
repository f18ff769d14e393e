"""eqxopt: optimizers, gradient transforms and schedules as checked Equinox modules."""

from ._accumulate import MultiSteps as MultiSteps, MultiStepsState as MultiStepsState
from ._adabelief import AdaBelief as AdaBelief
from ._adadelta import Adadelta as Adadelta, AdadeltaState as AdadeltaState
from ._adafactor import Adafactor as Adafactor, AdafactorState as AdafactorState
from ._adagrad import Adagrad as Adagrad, AdagradState as AdagradState
from ._adam import (
    Adam as Adam,
    Adamax as Adamax,
    AdamaxW as AdamaxW,
    AdamState as AdamState,
    AdamW as AdamW,
    AMSGrad as AMSGrad,
    AMSGradState as AMSGradState,
    NAdam as NAdam,
    NAdamState as NAdamState,
    NAdamW as NAdamW,
)
from ._adan import Adan as Adan, AdanState as AdanState
from ._ademamix import AdEMAMix as AdEMAMix, AdEMAMixState as AdEMAMixState
from ._adopt import ADOPT as ADOPT
from ._averaging import (
    Lookahead as Lookahead,
    LookaheadState as LookaheadState,
    ParamEMA as ParamEMA,
    ParamEMAState as ParamEMAState,
)
from ._base import AbstractTransform as AbstractTransform
from ._cautious import CAdamW as CAdamW
from ._chain import Chain as Chain, ChainState as ChainState, EmptyState as EmptyState
from ._clip import (
    AdaptiveGradClip as AdaptiveGradClip,
    ClipByBlockRMS as ClipByBlockRMS,
    ClipByGlobalNorm as ClipByGlobalNorm,
    ClipByValue as ClipByValue,
    GlobalNormState as GlobalNormState,
    global_norm as global_norm,
)
from ._dispatch import set_split_compilation as set_split_compilation
from ._finite import (
    SkipNonFinite as SkipNonFinite,
    SkipNonFiniteState as SkipNonFiniteState,
    ZeroNans as ZeroNans,
    ZeroNansState as ZeroNansState,
    apply_if_finite as apply_if_finite,
)
from ._fromage import Fromage as Fromage, FromageState as FromageState
from ._fused import (
    native_kernels_available as native_kernels_available,
    set_native_kernels as set_native_kernels,
)
from ._interop import (
    FromOptax as FromOptax,
    FromOptaxState as FromOptaxState,
    from_optax as from_optax,
)
from ._lamb import (
    LAMB as LAMB,
    LARS as LARS,
    LAMBState as LAMBState,
    LARSState as LARSState,
)
from ._lbfgs import LBFGS as LBFGS, LBFGSState as LBFGSState
from ._leafwise import map_leaves as map_leaves
from ._muon import Muon as Muon, MuonState as MuonState
from ._noisy_sgd import NoisySGD as NoisySGD, NoisySGDState as NoisySGDState
from ._novograd import NovoGrad as NovoGrad, NovoGradState as NovoGradState
from ._optimistic import (
    OptimisticGradientDescent as OptimisticGradientDescent,
    OptimisticGradientDescentState as OptimisticGradientDescentState,
)
from ._optimistic_adam import (
    OptimisticAdam as OptimisticAdam,
    OptimisticAdamState as OptimisticAdamState,
)
from ._packed import Packed as Packed, pack as pack
from ._partition import (
    Freeze as Freeze,
    Masked as Masked,
    MaskedState as MaskedState,
    Partition as Partition,
    PartitionState as PartitionState,
)
from ._plateau import (
    ReduceOnPlateau as ReduceOnPlateau,
    ReduceOnPlateauState as ReduceOnPlateauState,
)
from ._plot import plot_schedules as plot_schedules
from ._polyak import PolyakSGD as PolyakSGD, PolyakSGDState as PolyakSGDState
from ._prodigy import Prodigy as Prodigy, ProdigyState as ProdigyState
from ._radam import RAdam as RAdam
from ._rmsprop import RMSProp as RMSProp, RMSPropState as RMSPropState
from ._rprop import Rprop as Rprop, RpropState as RpropState
from ._schedule_free import (
    ScheduleFreeAdamW as ScheduleFreeAdamW,
    ScheduleFreeSGD as ScheduleFreeSGD,
    ScheduleFreeState as ScheduleFreeState,
)
from ._schedules import (
    SGDR as SGDR,
    AbstractSchedule as AbstractSchedule,
    Constant as Constant,
    CosineDecay as CosineDecay,
    CosineOneCycle as CosineOneCycle,
    Cyclic as Cyclic,
    ExponentialDecay as ExponentialDecay,
    Join as Join,
    Linear as Linear,
    LinearOneCycle as LinearOneCycle,
    MultiStepDecay as MultiStepDecay,
    PiecewiseConstant as PiecewiseConstant,
    PiecewiseInterpolate as PiecewiseInterpolate,
    Polynomial as Polynomial,
    StepDecay as StepDecay,
    WarmupConstant as WarmupConstant,
    WarmupCosine as WarmupCosine,
    WarmupExponentialDecay as WarmupExponentialDecay,
    WarmupStableDecay as WarmupStableDecay,
)
from ._sgd import SGD as SGD, SGDState as SGDState
from ._sign import (
    Lion as Lion,
    LionState as LionState,
    SignSGD as SignSGD,
    SignSGDState as SignSGDState,
    Signum as Signum,
    SignumState as SignumState,
)
from ._sm3 import SM3 as SM3, SM3State as SM3State
from ._soap import SOAP as SOAP, SOAPState as SOAPState
from ._stable_adamw import StableAdamW as StableAdamW
from ._train_step import (
    TrainStep as TrainStep,
    make_train_step as make_train_step,
)
from ._transforms import (
    AddDecayedWeights as AddDecayedWeights,
    AddNoise as AddNoise,
    AddNoiseState as AddNoiseState,
    Centralize as Centralize,
    DecoupledWeightDecay as DecoupledWeightDecay,
    DecoupledWeightDecayState as DecoupledWeightDecayState,
)
from ._tree import apply_updates as apply_updates
from ._yogi import Yogi as Yogi

__version__ = "0.1.0"

# Every public name, sorted (the API reference documents each: tests/test_docs.py).
__all__ = [
    "ADOPT",
    "AMSGrad",
    "AMSGradState",
    "AbstractSchedule",
    "AbstractTransform",
    "AdEMAMix",
    "AdEMAMixState",
    "AdaBelief",
    "Adadelta",
    "AdadeltaState",
    "Adafactor",
    "AdafactorState",
    "Adagrad",
    "AdagradState",
    "Adam",
    "AdamState",
    "AdamW",
    "Adamax",
    "AdamaxW",
    "Adan",
    "AdanState",
    "AdaptiveGradClip",
    "AddDecayedWeights",
    "AddNoise",
    "AddNoiseState",
    "CAdamW",
    "Centralize",
    "Chain",
    "ChainState",
    "ClipByBlockRMS",
    "ClipByGlobalNorm",
    "ClipByValue",
    "Constant",
    "CosineDecay",
    "CosineOneCycle",
    "Cyclic",
    "DecoupledWeightDecay",
    "DecoupledWeightDecayState",
    "EmptyState",
    "ExponentialDecay",
    "Freeze",
    "FromOptax",
    "FromOptaxState",
    "Fromage",
    "FromageState",
    "GlobalNormState",
    "Join",
    "LAMB",
    "LAMBState",
    "LARS",
    "LARSState",
    "LBFGS",
    "LBFGSState",
    "Linear",
    "LinearOneCycle",
    "Lion",
    "LionState",
    "Lookahead",
    "LookaheadState",
    "Masked",
    "MaskedState",
    "MultiStepDecay",
    "MultiSteps",
    "MultiStepsState",
    "Muon",
    "MuonState",
    "NAdam",
    "NAdamState",
    "NAdamW",
    "NoisySGD",
    "NoisySGDState",
    "NovoGrad",
    "NovoGradState",
    "OptimisticAdam",
    "OptimisticAdamState",
    "OptimisticGradientDescent",
    "OptimisticGradientDescentState",
    "Packed",
    "ParamEMA",
    "ParamEMAState",
    "Partition",
    "PartitionState",
    "PiecewiseConstant",
    "PiecewiseInterpolate",
    "PolyakSGD",
    "PolyakSGDState",
    "Polynomial",
    "Prodigy",
    "ProdigyState",
    "RAdam",
    "RMSProp",
    "RMSPropState",
    "ReduceOnPlateau",
    "ReduceOnPlateauState",
    "Rprop",
    "RpropState",
    "SGD",
    "SGDR",
    "SGDState",
    "SM3",
    "SM3State",
    "SOAP",
    "SOAPState",
    "ScheduleFreeAdamW",
    "ScheduleFreeSGD",
    "ScheduleFreeState",
    "SignSGD",
    "SignSGDState",
    "Signum",
    "SignumState",
    "SkipNonFinite",
    "SkipNonFiniteState",
    "StableAdamW",
    "StepDecay",
    "TrainStep",
    "WarmupConstant",
    "WarmupCosine",
    "WarmupExponentialDecay",
    "WarmupStableDecay",
    "Yogi",
    "ZeroNans",
    "ZeroNansState",
    "apply_if_finite",
    "apply_updates",
    "from_optax",
    "global_norm",
    "make_train_step",
    "map_leaves",
    "native_kernels_available",
    "pack",
    "plot_schedules",
    "set_native_kernels",
    "set_split_compilation",
]
