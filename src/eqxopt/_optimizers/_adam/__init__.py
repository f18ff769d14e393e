"""The Adam family: Adam, AdamW, NAdam(W), AMSGrad, Adamax(W), RAdam, Yogi,
AdaBelief, ACProp, ADOPT, AdEMAMix, SimplifiedAdEMAMix, CAdamW, StableAdamW,
OptimisticAdam, OptimisticAdamV1, LaProp, AdamMini, MARS.
"""
