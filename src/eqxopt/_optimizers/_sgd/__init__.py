"""Gradient descent and its sign, noise, private, Polyak, optimistic, resilient and
schedule-free forms: SGD, NoisySGD, DPSGD, PolyakSGD, OptimisticGradientDescent,
Rprop, SignSGD, Signum, Lion, ScheduleFreeSGD, ScheduleFreeAdamW; and the
differentially private aggregate DP-SGD is built on (`DifferentiallyPrivateAggregate`,
`per_example_global_norm_clip`, `per_example_layer_norm_clip`, in `_privacy.py`).
"""
