"""eqxopt: optimizers, gradient transforms and schedules as checked Equinox modules."""

from ._adabelief import AdaBelief as AdaBelief
from ._adadelta import Adadelta as Adadelta
from ._adadelta import AdadeltaState as AdadeltaState
from ._adafactor import Adafactor as Adafactor
from ._adafactor import AdafactorState as AdafactorState
from ._adagrad import Adagrad as Adagrad
from ._adagrad import AdagradState as AdagradState
from ._adam import Adam as Adam
from ._adam import Adamax as Adamax
from ._adam import AdamaxW as AdamaxW
from ._adam import AdamState as AdamState
from ._adam import AdamW as AdamW
from ._adam import AMSGrad as AMSGrad
from ._adam import AMSGradState as AMSGradState
from ._adam import NAdam as NAdam
from ._adam import NAdamState as NAdamState
from ._adam import NAdamW as NAdamW
from ._adan import Adan as Adan
from ._adan import AdanState as AdanState
from ._ademamix import AdEMAMix as AdEMAMix
from ._ademamix import AdEMAMixState as AdEMAMixState
from ._adopt import ADOPT as ADOPT
from ._base import AbstractTransform as AbstractTransform
from ._accumulate import MultiSteps as MultiSteps
from ._accumulate import MultiStepsState as MultiStepsState
from ._averaging import Lookahead as Lookahead
from ._averaging import LookaheadState as LookaheadState
from ._averaging import ParamEMA as ParamEMA
from ._averaging import ParamEMAState as ParamEMAState
from ._chain import Chain as Chain
from ._chain import ChainState as ChainState
from ._chain import EmptyState as EmptyState
from ._clip import AdaptiveGradClip as AdaptiveGradClip
from ._clip import ClipByBlockRMS as ClipByBlockRMS
from ._clip import ClipByGlobalNorm as ClipByGlobalNorm
from ._clip import ClipByValue as ClipByValue
from ._clip import GlobalNormState as GlobalNormState
from ._clip import global_norm as global_norm
from ._finite import SkipNonFinite as SkipNonFinite
from ._finite import SkipNonFiniteState as SkipNonFiniteState
from ._finite import ZeroNans as ZeroNans
from ._finite import ZeroNansState as ZeroNansState
from ._finite import apply_if_finite as apply_if_finite
from ._interop import FromOptax as FromOptax
from ._interop import FromOptaxState as FromOptaxState
from ._interop import from_optax as from_optax
from ._partition import Freeze as Freeze
from ._partition import Masked as Masked
from ._partition import MaskedState as MaskedState
from ._partition import Partition as Partition
from ._partition import PartitionState as PartitionState
from ._plateau import ReduceOnPlateau as ReduceOnPlateau
from ._plateau import ReduceOnPlateauState as ReduceOnPlateauState
from ._transforms import AddDecayedWeights as AddDecayedWeights
from ._transforms import AddNoise as AddNoise
from ._transforms import AddNoiseState as AddNoiseState
from ._transforms import Centralize as Centralize
from ._transforms import DecoupledWeightDecay as DecoupledWeightDecay
from ._transforms import DecoupledWeightDecayState as DecoupledWeightDecayState
from ._cautious import CAdamW as CAdamW
from ._fromage import Fromage as Fromage
from ._fromage import FromageState as FromageState
from ._lamb import LAMB as LAMB
from ._lamb import LAMBState as LAMBState
from ._lamb import LARS as LARS
from ._lamb import LARSState as LARSState
from ._lbfgs import LBFGS as LBFGS
from ._lbfgs import LBFGSState as LBFGSState
from ._leafwise import map_leaves as map_leaves
from ._muon import Muon as Muon
from ._muon import MuonState as MuonState
from ._noisy_sgd import NoisySGD as NoisySGD
from ._noisy_sgd import NoisySGDState as NoisySGDState
from ._novograd import NovoGrad as NovoGrad
from ._novograd import NovoGradState as NovoGradState
from ._optimistic import OptimisticGradientDescent as OptimisticGradientDescent
from ._optimistic import (
    OptimisticGradientDescentState as OptimisticGradientDescentState,
)
from ._optimistic_adam import OptimisticAdam as OptimisticAdam
from ._optimistic_adam import OptimisticAdamState as OptimisticAdamState
from ._plot import plot_schedules as plot_schedules
from ._polyak import PolyakSGD as PolyakSGD
from ._polyak import PolyakSGDState as PolyakSGDState
from ._prodigy import Prodigy as Prodigy
from ._prodigy import ProdigyState as ProdigyState
from ._radam import RAdam as RAdam
from ._rmsprop import RMSProp as RMSProp
from ._rmsprop import RMSPropState as RMSPropState
from ._rprop import Rprop as Rprop
from ._rprop import RpropState as RpropState
from ._schedule_free import ScheduleFreeAdamW as ScheduleFreeAdamW
from ._schedule_free import ScheduleFreeSGD as ScheduleFreeSGD
from ._schedule_free import ScheduleFreeState as ScheduleFreeState
from ._schedules import SGDR as SGDR
from ._schedules import (
    AbstractSchedule as AbstractSchedule,
)
from ._schedules import (
    Constant as Constant,
)
from ._schedules import CosineDecay as CosineDecay
from ._schedules import CosineOneCycle as CosineOneCycle
from ._schedules import Cyclic as Cyclic
from ._schedules import ExponentialDecay as ExponentialDecay
from ._schedules import Join as Join
from ._schedules import Linear as Linear
from ._schedules import LinearOneCycle as LinearOneCycle
from ._schedules import MultiStepDecay as MultiStepDecay
from ._schedules import PiecewiseConstant as PiecewiseConstant
from ._schedules import PiecewiseInterpolate as PiecewiseInterpolate
from ._schedules import Polynomial as Polynomial
from ._schedules import StepDecay as StepDecay
from ._schedules import WarmupConstant as WarmupConstant
from ._schedules import (
    WarmupCosine as WarmupCosine,
)
from ._schedules import WarmupExponentialDecay as WarmupExponentialDecay
from ._schedules import WarmupStableDecay as WarmupStableDecay
from ._sgd import SGD as SGD
from ._sgd import SGDState as SGDState
from ._sign import Lion as Lion
from ._sign import LionState as LionState
from ._sign import SignSGD as SignSGD
from ._sign import SignSGDState as SignSGDState
from ._sign import Signum as Signum
from ._sign import SignumState as SignumState
from ._sm3 import SM3 as SM3
from ._sm3 import SM3State as SM3State
from ._soap import SOAP as SOAP
from ._soap import SOAPState as SOAPState
from ._stable_adamw import StableAdamW as StableAdamW
from ._tree import apply_updates as apply_updates
from ._yogi import Yogi as Yogi

__version__ = "0.1.0"
