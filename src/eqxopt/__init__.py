"""eqxopt: optimizers, gradient transforms and schedules as checked Equinox modules."""

import importlib.metadata

from ._core import (
    AbstractTransform as AbstractTransform,
    Blockwise4bit as Blockwise4bit,
    Blockwise8bit as Blockwise8bit,
    BlockwiseFp8 as BlockwiseFp8,
    Companded8bit as Companded8bit,
    ErrorCorrectedArray as ErrorCorrectedArray,
    ErrorCorrectedBf16 as ErrorCorrectedBf16,
    Packed as Packed,
    QuantizedArray as QuantizedArray,
    apply_updates as apply_updates,
    map_leaves as map_leaves,
    pack as pack,
    set_split_compilation as set_split_compilation,
    tree_cast as tree_cast,
    tree_get as tree_get,
    tree_norm as tree_norm,
    tree_set as tree_set,
)
from ._core._backend import (
    native_kernels_available as native_kernels_available,
    set_native_kernels as set_native_kernels,
)
from ._core._schedule import (
    AbstractSchedule as AbstractSchedule,
    Constant as Constant,
)
from ._distributed import (
    shard_state as shard_state,
    sharded_deserialise_filter_spec as sharded_deserialise_filter_spec,
    state_shardings as state_shardings,
)
from ._interop import (
    FromOptax as FromOptax,
    FromOptaxState as FromOptaxState,
    from_optax as from_optax,
)
from ._microbatch import microbatch as microbatch
from ._module_labels import (
    matrix_axes as matrix_axes,
    module_labels as module_labels,
)
from ._optimizers._adam._acprop import (
    ACProp as ACProp,
)
from ._optimizers._adam._adabelief import (
    AdaBelief as AdaBelief,
)
from ._optimizers._adam._adam import (
    Adam as Adam,
    Adamax as Adamax,
    AdamaxW as AdamaxW,
    AdamW as AdamW,
    AMSGrad as AMSGrad,
    AMSGradState as AMSGradState,
    NAdam as NAdam,
    NAdamState as NAdamState,
    NAdamW as NAdamW,
)
from ._optimizers._adam._adam_like import (
    AdamState as AdamState,
)
from ._optimizers._adam._adam_mini import (
    AdamMini as AdamMini,
    AdamMiniState as AdamMiniState,
)
from ._optimizers._adam._ademamix import (
    AdEMAMix as AdEMAMix,
    AdEMAMixState as AdEMAMixState,
    SimplifiedAdEMAMix as SimplifiedAdEMAMix,
    SimplifiedAdEMAMixState as SimplifiedAdEMAMixState,
)
from ._optimizers._adam._adopt import (
    ADOPT as ADOPT,
)
from ._optimizers._adam._cautious import (
    CAdamW as CAdamW,
)
from ._optimizers._adam._laprop import (
    LaProp as LaProp,
    LaPropState as LaPropState,
)
from ._optimizers._adam._mars import (
    MARS as MARS,
    MARSState as MARSState,
)
from ._optimizers._adam._optimistic_adam import (
    OptimisticAdam as OptimisticAdam,
    OptimisticAdamState as OptimisticAdamState,
    OptimisticAdamV1 as OptimisticAdamV1,
)
from ._optimizers._adam._radam import (
    RAdam as RAdam,
)
from ._optimizers._adam._stable_adamw import (
    StableAdamW as StableAdamW,
)
from ._optimizers._adam._yogi import (
    Yogi as Yogi,
)
from ._optimizers._adaptive._adadelta import (
    Adadelta as Adadelta,
    AdadeltaState as AdadeltaState,
)
from ._optimizers._adaptive._adagrad import (
    Adagrad as Adagrad,
    AdagradState as AdagradState,
)
from ._optimizers._adaptive._adan import (
    Adan as Adan,
    AdanState as AdanState,
)
from ._optimizers._adaptive._prodigy import (
    Prodigy as Prodigy,
    ProdigyState as ProdigyState,
)
from ._optimizers._adaptive._rmsprop import (
    RMSProp as RMSProp,
    RMSPropState as RMSPropState,
)
from ._optimizers._constrained._hyperball import (
    HyperBallAdamW as HyperBallAdamW,
    HyperBallAdamWState as HyperBallAdamWState,
)
from ._optimizers._constrained._scion import (
    Scion as Scion,
    ScionState as ScionState,
)
from ._optimizers._contrib._apollo import (
    APOLLO as APOLLO,
    APOLLOMini as APOLLOMini,
    APOLLOState as APOLLOState,
)
from ._optimizers._contrib._galore import (
    GaLore as GaLore,
    GaLoreState as GaLoreState,
)
from ._optimizers._contrib._sophia import (
    Sophia as Sophia,
    SophiaState as SophiaState,
)
from ._optimizers._layerwise._fromage import (
    Fromage as Fromage,
    FromageState as FromageState,
)
from ._optimizers._layerwise._lamb import (
    LAMB as LAMB,
    LARS as LARS,
    LAMBState as LAMBState,
    LARSState as LARSState,
)
from ._optimizers._layerwise._novograd import (
    NovoGrad as NovoGrad,
    NovoGradState as NovoGradState,
)
from ._optimizers._parameter_free._asgd import (
    ASGD as ASGD,
    ASGDState as ASGDState,
)
from ._optimizers._parameter_free._cocob import (
    COCOB as COCOB,
    COCOBState as COCOBState,
)
from ._optimizers._parameter_free._dadapt import (
    DAdaptAdamW as DAdaptAdamW,
    DAdaptAdamWState as DAdaptAdamWState,
    DAdaptSGD as DAdaptSGD,
    DAdaptSGDState as DAdaptSGDState,
)
from ._optimizers._parameter_free._dog import (
    DoG as DoG,
    DoGState as DoGState,
    DoWG as DoWG,
    DoWGState as DoWGState,
)
from ._optimizers._parameter_free._madgrad import (
    MADGRAD as MADGRAD,
    MADGRADState as MADGRADState,
)
from ._optimizers._parameter_free._momo import (
    Momo as Momo,
    MomoAdam as MomoAdam,
    MomoAdamState as MomoAdamState,
    MomoState as MomoState,
)
from ._optimizers._preconditioned._adafactor import (
    Adafactor as Adafactor,
    AdafactorState as AdafactorState,
)
from ._optimizers._preconditioned._adamuon import (
    AdaMuon as AdaMuon,
    AdaMuonState as AdaMuonState,
)
from ._optimizers._preconditioned._dion import (
    Dion as Dion,
    DionState as DionState,
)
from ._optimizers._preconditioned._kl_shampoo import (
    KLShampoo as KLShampoo,
    KLShampooState as KLShampooState,
)
from ._optimizers._preconditioned._lbfgs import (
    LBFGS as LBFGS,
    LBFGSState as LBFGSState,
)
from ._optimizers._preconditioned._muon import (
    Muon as Muon,
    MuonState as MuonState,
)
from ._optimizers._preconditioned._normuon import (
    NorMuon as NorMuon,
    NorMuonState as NorMuonState,
)
from ._optimizers._preconditioned._orthogonal import (
    MatrixAxes as MatrixAxes,
)
from ._optimizers._preconditioned._polargrad import (
    PolarGrad as PolarGrad,
    PolarGradState as PolarGradState,
)
from ._optimizers._preconditioned._psgd import (
    PSGDKron as PSGDKron,
    PSGDKronState as PSGDKronState,
)
from ._optimizers._preconditioned._shampoo import (
    Shampoo as Shampoo,
    ShampooState as ShampooState,
)
from ._optimizers._preconditioned._sm3 import (
    SM3 as SM3,
    SM3State as SM3State,
)
from ._optimizers._preconditioned._soap import (
    SOAP as SOAP,
    SOAPState as SOAPState,
)
from ._optimizers._sgd._dpsgd import (
    DPSGD as DPSGD,
    DPSGDState as DPSGDState,
)
from ._optimizers._sgd._noisy_sgd import (
    NoisySGD as NoisySGD,
    NoisySGDState as NoisySGDState,
)
from ._optimizers._sgd._optimistic import (
    OptimisticGradientDescent as OptimisticGradientDescent,
    OptimisticGradientDescentState as OptimisticGradientDescentState,
)
from ._optimizers._sgd._polyak import (
    PolyakSGD as PolyakSGD,
    PolyakSGDState as PolyakSGDState,
)
from ._optimizers._sgd._privacy import (
    DifferentiallyPrivateAggregate as DifferentiallyPrivateAggregate,
    DifferentiallyPrivateAggregateState as DifferentiallyPrivateAggregateState,
    per_example_global_norm_clip as per_example_global_norm_clip,
    per_example_layer_norm_clip as per_example_layer_norm_clip,
)
from ._optimizers._sgd._rprop import (
    Rprop as Rprop,
    RpropState as RpropState,
)
from ._optimizers._sgd._schedule_free import (
    ScheduleFreeAdamW as ScheduleFreeAdamW,
    ScheduleFreeSGD as ScheduleFreeSGD,
    ScheduleFreeState as ScheduleFreeState,
)
from ._optimizers._sgd._sgd import (
    SGD as SGD,
    SGDState as SGDState,
)
from ._optimizers._sgd._sign import (
    Lion as Lion,
    LionState as LionState,
    SignSGD as SignSGD,
    SignSGDState as SignSGDState,
    Signum as Signum,
    SignumState as SignumState,
)
from ._population import population as population
from ._schedules._cyclic import (
    SGDR as SGDR,
    CosineOneCycle as CosineOneCycle,
    Cyclic as Cyclic,
    LinearOneCycle as LinearOneCycle,
    OneCycleMomentum as OneCycleMomentum,
)
from ._schedules._decay import (
    SWALR as SWALR,
    CosineDecay as CosineDecay,
    ExponentialDecay as ExponentialDecay,
    Linear as Linear,
    MultiStepDecay as MultiStepDecay,
    Polynomial as Polynomial,
    StepDecay as StepDecay,
)
from ._schedules._function import (
    Lambda as Lambda,
    Product as Product,
)
from ._schedules._piecewise import (
    Join as Join,
    PiecewiseConstant as PiecewiseConstant,
    PiecewiseInterpolate as PiecewiseInterpolate,
)
from ._schedules._plot import (
    plot_schedules as plot_schedules,
)
from ._schedules._warmup import (
    WarmupConstant as WarmupConstant,
    WarmupCosine as WarmupCosine,
    WarmupExponentialDecay as WarmupExponentialDecay,
    WarmupStableDecay as WarmupStableDecay,
)
from ._train_step import (
    TrainStep as TrainStep,
    make_train_step as make_train_step,
)
from ._transforms._blocks import (
    EMA as EMA,
    AbstractBlock as AbstractBlock,
    EMAState as EMAState,
    Identity as Identity,
    KeepParamsNonnegative as KeepParamsNonnegative,
    ScaleByAdam as ScaleByAdam,
    ScaleByAdamState as ScaleByAdamState,
    ScaleByLearningRate as ScaleByLearningRate,
    ScaleByRms as ScaleByRms,
    ScaleByRmsState as ScaleByRmsState,
    ScaleBySign as ScaleBySign,
    ScaleByTrustRatio as ScaleByTrustRatio,
    Stateless as Stateless,
    Trace as Trace,
    TraceState as TraceState,
)
from ._transforms._blocks_adaptive import (
    ScaleByAdadelta as ScaleByAdadelta,
    ScaleByAdadeltaState as ScaleByAdadeltaState,
    ScaleByAdamax as ScaleByAdamax,
    ScaleByAdan as ScaleByAdan,
    ScaleByAdanState as ScaleByAdanState,
    ScaleByAmsgrad as ScaleByAmsgrad,
    ScaleByAmsgradState as ScaleByAmsgradState,
    ScaleByBelief as ScaleByBelief,
    ScaleByLion as ScaleByLion,
    ScaleByLionState as ScaleByLionState,
    ScaleByNovograd as ScaleByNovograd,
    ScaleByNovogradState as ScaleByNovogradState,
    ScaleByRadam as ScaleByRadam,
    ScaleByRss as ScaleByRss,
    ScaleByRssState as ScaleByRssState,
    ScaleByYogi as ScaleByYogi,
)
from ._transforms._blocks_structured import (
    ScaleByDistanceOverGradients as ScaleByDistanceOverGradients,
    ScaleByDistanceOverGradientsState as ScaleByDistanceOverGradientsState,
    ScaleByFactoredRms as ScaleByFactoredRms,
    ScaleByFactoredRmsState as ScaleByFactoredRmsState,
    ScaleByLBFGS as ScaleByLBFGS,
    ScaleByOptimisticGradient as ScaleByOptimisticGradient,
    ScaleByOptimisticGradientState as ScaleByOptimisticGradientState,
    ScaleByParamBlockNorm as ScaleByParamBlockNorm,
    ScaleByParamBlockRms as ScaleByParamBlockRms,
    ScaleByPolyak as ScaleByPolyak,
    ScaleByRprop as ScaleByRprop,
    ScaleByRpropState as ScaleByRpropState,
    ScaleBySm3 as ScaleBySm3,
    ScaleBySm3State as ScaleBySm3State,
    ScaleByStddev as ScaleByStddev,
    ScaleByStddevState as ScaleByStddevState,
)
from ._transforms._clip import (
    AdaptiveGradClip as AdaptiveGradClip,
    ClipByBlockRMS as ClipByBlockRMS,
    ClipByGlobalNorm as ClipByGlobalNorm,
    ClipByValue as ClipByValue,
    GlobalNormState as GlobalNormState,
    NormalizeByUpdateNorm as NormalizeByUpdateNorm,
    global_norm as global_norm,
)
from ._transforms._decay import (
    AddDecayedWeights as AddDecayedWeights,
    AddNoise as AddNoise,
    AddNoiseState as AddNoiseState,
    Centralize as Centralize,
    DecoupledWeightDecay as DecoupledWeightDecay,
    DecoupledWeightDecayState as DecoupledWeightDecayState,
)
from ._transforms._finite import (
    SkipNonFinite as SkipNonFinite,
    SkipNonFiniteState as SkipNonFiniteState,
    ZeroNans as ZeroNans,
    ZeroNansState as ZeroNansState,
    apply_if_finite as apply_if_finite,
)
from ._transforms._linesearch import (
    ScaleByBacktrackingLinesearch as ScaleByBacktrackingLinesearch,
    ScaleByBacktrackingLinesearchState as ScaleByBacktrackingLinesearchState,
)
from ._transforms._measure import (
    MeasureWithEMA as MeasureWithEMA,
    MeasureWithEMAState as MeasureWithEMAState,
    Snapshot as Snapshot,
    SnapshotState as SnapshotState,
)
from ._transforms._plateau import (
    ReduceOnPlateau as ReduceOnPlateau,
    ReduceOnPlateauState as ReduceOnPlateauState,
)
from ._transforms._scale_gradient import scale_gradient as scale_gradient
from ._transforms._state import (
    EmptyState as EmptyState,
    StepState as StepState,
)
from ._transforms._target import (
    incremental_update as incremental_update,
    periodic_update as periodic_update,
)
from ._wrappers import (
    SAM as SAM,
    SWA as SWA,
    Cautious as Cautious,
    Chain as Chain,
    ChainState as ChainState,
    ConditionallyMask as ConditionallyMask,
    ConditionallyMaskState as ConditionallyMaskState,
    ConditionallyTransform as ConditionallyTransform,
    ConditionallyTransformState as ConditionallyTransformState,
    DiLoCo as DiLoCo,
    DiLoCoState as DiLoCoState,
    ErrorCorrection as ErrorCorrection,
    ErrorCorrectionState as ErrorCorrectionState,
    Freeze as Freeze,
    KahanSummation as KahanSummation,
    KahanSummationState as KahanSummationState,
    LearningRateMultipliers as LearningRateMultipliers,
    Lookahead as Lookahead,
    LookaheadState as LookaheadState,
    Masked as Masked,
    MaskedState as MaskedState,
    Maximize as Maximize,
    Mechanic as Mechanic,
    MechanicState as MechanicState,
    Monitor as Monitor,
    MonitorState as MonitorState,
    MultiSteps as MultiSteps,
    MultiStepsState as MultiStepsState,
    MuonClip as MuonClip,
    OffloadState as OffloadState,
    ParamEMA as ParamEMA,
    ParamEMAState as ParamEMAState,
    Partition as Partition,
    PartitionState as PartitionState,
    QKClip as QKClip,
    RealImaginaryPair as RealImaginaryPair,
    SAMState as SAMState,
    ScheduleFree as ScheduleFree,
    ScheduleFreeWrapperState as ScheduleFreeWrapperState,
    SkipLargeUpdates as SkipLargeUpdates,
    SkipLargeUpdatesState as SkipLargeUpdatesState,
    SplitRealAndImaginary as SplitRealAndImaginary,
    SplitRealAndImaginaryState as SplitRealAndImaginaryState,
    StochasticRounding as StochasticRounding,
    StochasticRoundingState as StochasticRoundingState,
    SWAState as SWAState,
    hyperparameters as hyperparameters,
    max_attention_logits as max_attention_logits,
    round_stochastic_bf16 as round_stochastic_bf16,
    skip_large_updates as skip_large_updates,
    skip_not_finite as skip_not_finite,
)

try:
    # The native CPU kernels, an optional backend: importing them registers them
    # with the engine (`_core/_backend.py`); without them every step runs XLA's code.
    from ._native import NativeBackend as _NativeBackend  # noqa: F401
except ModuleNotFoundError as error:  # a checkout without them
    if error.name != f"{__name__}._native":
        raise

# The authoring API (bases, field helpers, declarations): `eqxopt.extend`.
from . import extend as extend

__version__ = importlib.metadata.version("eqxopt")

# Every public name, sorted (the API reference documents each: tests/test_docs.py).
__all__ = [
    "ACProp",
    "ADOPT",
    "AMSGrad",
    "AMSGradState",
    "APOLLO",
    "APOLLOMini",
    "APOLLOState",
    "ASGD",
    "ASGDState",
    "AbstractBlock",
    "AbstractSchedule",
    "AbstractTransform",
    "AdEMAMix",
    "AdEMAMixState",
    "AdaBelief",
    "AdaMuon",
    "AdaMuonState",
    "Adadelta",
    "AdadeltaState",
    "Adafactor",
    "AdafactorState",
    "Adagrad",
    "AdagradState",
    "Adam",
    "AdamMini",
    "AdamMiniState",
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
    "Blockwise4bit",
    "Blockwise8bit",
    "BlockwiseFp8",
    "CAdamW",
    "COCOB",
    "COCOBState",
    "Cautious",
    "Centralize",
    "Chain",
    "ChainState",
    "ClipByBlockRMS",
    "ClipByGlobalNorm",
    "ClipByValue",
    "Companded8bit",
    "ConditionallyMask",
    "ConditionallyMaskState",
    "ConditionallyTransform",
    "ConditionallyTransformState",
    "Constant",
    "CosineDecay",
    "CosineOneCycle",
    "Cyclic",
    "DAdaptAdamW",
    "DAdaptAdamWState",
    "DAdaptSGD",
    "DAdaptSGDState",
    "DPSGD",
    "DPSGDState",
    "DecoupledWeightDecay",
    "DecoupledWeightDecayState",
    "DiLoCo",
    "DiLoCoState",
    "DifferentiallyPrivateAggregate",
    "DifferentiallyPrivateAggregateState",
    "Dion",
    "DionState",
    "DoG",
    "DoGState",
    "DoWG",
    "DoWGState",
    "EMA",
    "EMAState",
    "EmptyState",
    "ErrorCorrectedArray",
    "ErrorCorrectedBf16",
    "ErrorCorrection",
    "ErrorCorrectionState",
    "ExponentialDecay",
    "Freeze",
    "FromOptax",
    "FromOptaxState",
    "Fromage",
    "FromageState",
    "GaLore",
    "GaLoreState",
    "GlobalNormState",
    "HyperBallAdamW",
    "HyperBallAdamWState",
    "Identity",
    "Join",
    "KLShampoo",
    "KLShampooState",
    "KahanSummation",
    "KahanSummationState",
    "KeepParamsNonnegative",
    "LAMB",
    "LAMBState",
    "LARS",
    "LARSState",
    "LBFGS",
    "LBFGSState",
    "LaProp",
    "LaPropState",
    "Lambda",
    "LearningRateMultipliers",
    "Linear",
    "LinearOneCycle",
    "Lion",
    "LionState",
    "Lookahead",
    "LookaheadState",
    "MADGRAD",
    "MADGRADState",
    "MARS",
    "MARSState",
    "Masked",
    "MaskedState",
    "MatrixAxes",
    "Maximize",
    "MeasureWithEMA",
    "MeasureWithEMAState",
    "Mechanic",
    "MechanicState",
    "Momo",
    "MomoAdam",
    "MomoAdamState",
    "MomoState",
    "Monitor",
    "MonitorState",
    "MultiStepDecay",
    "MultiSteps",
    "MultiStepsState",
    "Muon",
    "MuonClip",
    "MuonState",
    "NAdam",
    "NAdamState",
    "NAdamW",
    "NoisySGD",
    "NoisySGDState",
    "NorMuon",
    "NorMuonState",
    "NormalizeByUpdateNorm",
    "NovoGrad",
    "NovoGradState",
    "OffloadState",
    "OneCycleMomentum",
    "OptimisticAdam",
    "OptimisticAdamState",
    "OptimisticAdamV1",
    "OptimisticGradientDescent",
    "OptimisticGradientDescentState",
    "PSGDKron",
    "PSGDKronState",
    "Packed",
    "ParamEMA",
    "ParamEMAState",
    "Partition",
    "PartitionState",
    "PiecewiseConstant",
    "PiecewiseInterpolate",
    "PolarGrad",
    "PolarGradState",
    "PolyakSGD",
    "PolyakSGDState",
    "Polynomial",
    "Prodigy",
    "ProdigyState",
    "Product",
    "QKClip",
    "QuantizedArray",
    "RAdam",
    "RMSProp",
    "RMSPropState",
    "RealImaginaryPair",
    "ReduceOnPlateau",
    "ReduceOnPlateauState",
    "Rprop",
    "RpropState",
    "SAM",
    "SAMState",
    "SGD",
    "SGDR",
    "SGDState",
    "SM3",
    "SM3State",
    "SOAP",
    "SOAPState",
    "SWA",
    "SWALR",
    "SWAState",
    "ScaleByAdadelta",
    "ScaleByAdadeltaState",
    "ScaleByAdam",
    "ScaleByAdamState",
    "ScaleByAdamax",
    "ScaleByAdan",
    "ScaleByAdanState",
    "ScaleByAmsgrad",
    "ScaleByAmsgradState",
    "ScaleByBacktrackingLinesearch",
    "ScaleByBacktrackingLinesearchState",
    "ScaleByBelief",
    "ScaleByDistanceOverGradients",
    "ScaleByDistanceOverGradientsState",
    "ScaleByFactoredRms",
    "ScaleByFactoredRmsState",
    "ScaleByLBFGS",
    "ScaleByLearningRate",
    "ScaleByLion",
    "ScaleByLionState",
    "ScaleByNovograd",
    "ScaleByNovogradState",
    "ScaleByOptimisticGradient",
    "ScaleByOptimisticGradientState",
    "ScaleByParamBlockNorm",
    "ScaleByParamBlockRms",
    "ScaleByPolyak",
    "ScaleByRadam",
    "ScaleByRms",
    "ScaleByRmsState",
    "ScaleByRprop",
    "ScaleByRpropState",
    "ScaleByRss",
    "ScaleByRssState",
    "ScaleBySign",
    "ScaleBySm3",
    "ScaleBySm3State",
    "ScaleByStddev",
    "ScaleByStddevState",
    "ScaleByTrustRatio",
    "ScaleByYogi",
    "ScheduleFree",
    "ScheduleFreeAdamW",
    "ScheduleFreeSGD",
    "ScheduleFreeState",
    "ScheduleFreeWrapperState",
    "Scion",
    "ScionState",
    "Shampoo",
    "ShampooState",
    "SignSGD",
    "SignSGDState",
    "Signum",
    "SignumState",
    "SimplifiedAdEMAMix",
    "SimplifiedAdEMAMixState",
    "SkipLargeUpdates",
    "SkipLargeUpdatesState",
    "SkipNonFinite",
    "SkipNonFiniteState",
    "Snapshot",
    "SnapshotState",
    "Sophia",
    "SophiaState",
    "SplitRealAndImaginary",
    "SplitRealAndImaginaryState",
    "StableAdamW",
    "Stateless",
    "StepDecay",
    "StepState",
    "StochasticRounding",
    "StochasticRoundingState",
    "Trace",
    "TraceState",
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
    "hyperparameters",
    "incremental_update",
    "make_train_step",
    "map_leaves",
    "matrix_axes",
    "max_attention_logits",
    "microbatch",
    "module_labels",
    "native_kernels_available",
    "pack",
    "per_example_global_norm_clip",
    "per_example_layer_norm_clip",
    "periodic_update",
    "plot_schedules",
    "population",
    "round_stochastic_bf16",
    "scale_gradient",
    "set_native_kernels",
    "set_split_compilation",
    "shard_state",
    "sharded_deserialise_filter_spec",
    "skip_large_updates",
    "skip_not_finite",
    "state_shardings",
    "tree_cast",
    "tree_get",
    "tree_norm",
    "tree_set",
]
