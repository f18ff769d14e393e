"""Per-coordinate adaptive step sizes without Adam's bias-corrected pair:
Adagrad, Adadelta, RMSProp, Adan, Prodigy.
"""
