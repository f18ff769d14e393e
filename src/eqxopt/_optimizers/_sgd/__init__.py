"""Gradient descent and its sign, noise, Polyak, optimistic, resilient and
schedule-free forms: SGD, NoisySGD, PolyakSGD, OptimisticGradientDescent, Rprop,
SignSGD, Signum, Lion, ScheduleFreeSGD, ScheduleFreeAdamW.
"""
