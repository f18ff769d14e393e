"""The Adam family: Adam, AdamW, NAdam(W), AMSGrad, Adamax(W), RAdam, Yogi,
AdaBelief, ADOPT, AdEMAMix, CAdamW, StableAdamW, OptimisticAdam, LaProp, AdamMini,
MARS.
"""
