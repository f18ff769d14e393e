"""Optimizers that set their own step size, or need no tuned learning rate: DoG,
DoWG, COCOB, MADGRAD, D-Adaptation, Momo, and averaged SGD (ASGD). The ones with a
global step size compute it from whole-tree sums (`_sums.tree_sums`) and then take
an element-wise step through the shared engine.
"""
