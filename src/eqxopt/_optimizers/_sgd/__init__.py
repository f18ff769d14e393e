"""Gradient descent and its sign, noise, private, Polyak, optimistic, resilient and
schedule-free forms: SGD, NoisySGD, DPSGD, PolyakSGD, OptimisticGradientDescent,
Rprop, SignSGD, Signum, Lion, ScheduleFreeSGD, ScheduleFreeAdamW.
"""
