"""Writes docs/catalog.md: one entry per optimizer, its formula and defaults read from
eqxopt itself (the docstring's formula block and the signature), with the paper and
the reference the tests compare it against listed below.

Run from the repository root: `python docs/make_catalog.py`. tests/test_docs.py
checks that the committed page is what this script writes.
"""

import inspect
import math
import pathlib
import re

import eqxopt

DEFAULT_TOL = "rtol 2e-5, atol 2e-6"


def arxiv(number: str) -> str:
    return f"[arXiv:{number}](https://arxiv.org/abs/{number})"


# name, API page, paper, what the tests compare against, tolerance (None: default)
CATALOG = [
    # SGD and sign methods
    (
        "SGD",
        "sgd",
        "Robbins & Monro, *A Stochastic Approximation Method*, 1951; momentum: Polyak, 1964; Nesterov momentum as in Sutskever et al., ICML 2013",
        "`optax.sgd` and `torch.optim.SGD` (`dampening` 0, and 0.3 to 1 over 30 steps, native kernels and XLA); hand-worked momentum examples on nested dict/list trees",
        None,
    ),
    (
        "NoisySGD",
        "sgd",
        f"Neelakantan et al., *Adding Gradient Noise Improves Learning for Very Deep Networks*, 2015, {arxiv('1511.06807')}",
        "`optax.noisy_sgd` with the same key (the same noise); noise statistics",
        None,
    ),
    (
        "DPSGD",
        "sgd",
        f"Abadi et al., *Deep Learning with Differential Privacy*, CCS 2016, {arxiv('1607.00133')}",
        "`optax.contrib.dpsgd` on per-example gradients, with momentum, Nesterov and noise (the same seed, the same noise); noise statistics",
        None,
    ),
    (
        "PolyakSGD",
        "sgd",
        f"Loizou et al., *Stochastic Polyak Step-size for SGD*, AISTATS 2021, {arxiv('2002.10542')}",
        "`optax.polyak_sgd` (4 variants), the NumPy formula, least-squares convergence",
        None,
    ),
    (
        "OptimisticGradientDescent",
        "sgd",
        f"Daskalakis et al., *Training GANs with Optimism*, ICLR 2018, {arxiv('1711.00141')}",
        "`optax.optimistic_gradient_descent`",
        None,
    ),
    (
        "SignSGD",
        "sgd",
        f"Bernstein et al., *signSGD: Compressed Optimisation for Non-Convex Problems*, ICML 2018, {arxiv('1802.04434')}",
        "`optax.sign_sgd`",
        None,
    ),
    (
        "Signum",
        "sgd",
        f"Bernstein et al., ICML 2018, {arxiv('1802.04434')}",
        "`optax.signum`",
        None,
    ),
    (
        "Lion",
        "sgd",
        f"Chen et al., *Symbolic Discovery of Optimization Algorithms*, 2023, {arxiv('2302.06675')}",
        "`optax.lion` (schedule, decay, mask)",
        None,
    ),
    # Adam family
    (
        "Adam",
        "adam",
        f"Kingma & Ba, *Adam: A Method for Stochastic Optimization*, ICLR 2015, {arxiv('1412.6980')}",
        "`optax.adam`, `torch.optim.Adam`",
        None,
    ),
    (
        "AdamW",
        "adam",
        f"Loshchilov & Hutter, *Decoupled Weight Decay Regularization*, ICLR 2019, {arxiv('1711.05101')}",
        "`optax.adamw` (tree, prefix and function masks, a decay schedule), `torch.optim.AdamW`; hand-worked AdamW examples (first steps, bias correction, decay)",
        None,
    ),
    (
        "NAdam",
        "adam",
        "Dozat, *Incorporating Nesterov Momentum into Adam*, ICLR 2016 workshop",
        "`optax.nadam`; `torch.optim.NAdam` with both momentum conventions",
        None,
    ),
    (
        "NAdamW",
        "adam",
        "Dozat, ICLR 2016 workshop, with decoupled decay",
        "`optax.nadamw`, `torch.optim.NAdam(decoupled_weight_decay=True)`",
        None,
    ),
    (
        "AMSGrad",
        "adam",
        f"Reddi et al., *On the Convergence of Adam and Beyond*, ICLR 2018, {arxiv('1904.09237')}",
        "`optax.amsgrad` (both bias-correction versions), `torch.optim.Adam(amsgrad=True)` and `AdamW(amsgrad=True)`",
        "the default; atol 1e-5 for the paper's version without bias corrections (last-bit differences random-walk where a parameter crosses 0)",
    ),
    (
        "Adamax",
        "adam",
        "Kingma & Ba, ICLR 2015, section 7.1",
        "`optax.adamax`, `torch.optim.Adamax`",
        None,
    ),
    (
        "AdamaxW",
        "adam",
        "Kingma & Ba, ICLR 2015, section 7.1, with decoupled decay",
        "`optax.adamaxw`",
        None,
    ),
    (
        "AdaBelief",
        "adam",
        f"Zhuang et al., *AdaBelief Optimizer*, NeurIPS 2020, {arxiv('2010.07468')}",
        "`optax.adabelief` (optax's and the paper's eps, nesterov)",
        None,
    ),
    (
        "RAdam",
        "adam",
        f"Liu et al., *On the Variance of the Adaptive Learning Rate and Beyond*, ICLR 2020, {arxiv('1908.03265')}",
        "`torch.optim.RAdam`; `optax.radam`",
        "the default against torch; rtol 3e-4, atol 1e-5 against optax (optax computes `rho_t` in float32 with cancellation; eqxopt matches torch's float64 value)",
    ),
    (
        "Yogi",
        "adam",
        "Zaheer et al., *Adaptive Methods for Nonconvex Optimization*, NeurIPS 2018",
        "`optax.yogi`",
        None,
    ),
    (
        "ADOPT",
        "adam",
        f"Taniguchi et al., *ADOPT: Modified Adam Can Converge with Any beta2 with the Optimal Rate*, NeurIPS 2024, {arxiv('2411.02853')}",
        "`optax.contrib.adopt` (with and without clipping, nesterov)",
        None,
    ),
    (
        "AdEMAMix",
        "adam",
        f"Pagliardini et al., *The AdEMAMix Optimizer: Better, Faster, Older*, 2024, {arxiv('2409.03137')}",
        "`optax.contrib.ademamix`; a NumPy float64 rule with alpha and b3 schedules",
        "atol 1e-5 against optax (optax drifts from the float64 rule by up to 7e-6); the default against the float64 rule",
    ),
    (
        "SimplifiedAdEMAMix",
        "adam",
        f"Morwani et al., *Connections between Schedule-Free Optimizers, AdEMAMix, and Accelerated SGD Variants*, 2025, {arxiv('2502.02431')}",
        "`optax.contrib.simplified_ademamix` (with decay, and an alpha schedule)",
        None,
    ),
    (
        "ACProp",
        "adam",
        f"Zhuang et al., *Momentum Centering and Asynchronous Update for Adaptive Gradient Methods*, NeurIPS 2021, {arxiv('2110.05454')}",
        "`optax.contrib.acprop` (with decay)",
        None,
    ),
    (
        "OptimisticAdam",
        "adam",
        f"Daskalakis et al., *Training GANs with Optimism*, ICLR 2018, {arxiv('1711.00141')}",
        "`optax.optimistic_adam_v2`",
        None,
    ),
    (
        "OptimisticAdamV1",
        "adam",
        f"Daskalakis et al., *Training GANs with Optimism*, ICLR 2018, {arxiv('1711.00141')}",
        "`optax.optimistic_adam` (the deprecated form); `OptimisticAdam` with a unit learning rate under a schedule",
        None,
    ),
    (
        "CAdamW",
        "adam",
        f"Liang et al., *Cautious Optimizers: Improving Training with One Line of Code*, 2024, {arxiv('2411.16085')}",
        "a NumPy transcription of the paper's Algorithm 1; Rosenbrock to below 1e-5 (no optax or torch equivalent)",
        None,
    ),
    (
        "Cautious",
        "adam",
        f"Liang et al., *Cautious Optimizers: Improving Training with One Line of Code*, 2024, {arxiv('2411.16085')}",
        "`CAdamW` (`Cautious(AdamW)` with and without decay, schedules and a mask, and `Cautious(Adam)` then decoupled decay); the decay of each optimizer declaring `decoupled_decay` left unmasked; float64 NumPy transcriptions around `Lion` and `SGD` with (Nesterov) momentum",
        None,
    ),
    (
        "StableAdamW",
        "adam",
        f"Wortsman et al., *Stable and low-precision training for large-scale vision-language models*, NeurIPS 2023, {arxiv('2304.13013')}",
        "a NumPy transcription of Algorithm 2 with gradient spikes; Rosenbrock to below 1e-5 (no optax or torch equivalent)",
        None,
    ),
    # Adaptive step sizes
    (
        "Adagrad",
        "adaptive",
        "Duchi, Hazan & Singer, *Adaptive Subgradient Methods for Online Learning and Stochastic Optimization*, JMLR 2011",
        "`optax.adagrad`; `torch.optim.Adagrad` (`initial_accumulator_value=0, eps=1e-10, eps_in_sqrt=False`)",
        None,
    ),
    (
        "Adadelta",
        "adaptive",
        f"Zeiler, *ADADELTA: An Adaptive Learning Rate Method*, 2012, {arxiv('1212.5701')}",
        "`optax.adadelta`, `torch.optim.Adadelta`",
        None,
    ),
    (
        "RMSProp",
        "adaptive",
        f"Tieleman & Hinton, Coursera *Neural Networks for Machine Learning*, lecture 6.5, 2012; centered: Graves, 2013, {arxiv('1308.0850')}",
        "`optax.rmsprop` (8 configurations), `torch.optim.RMSprop` (4, `eps_in_sqrt=False`)",
        None,
    ),
    (
        "Rprop",
        "adaptive",
        "Riedmiller & Braun, *A Direct Adaptive Method for Faster Backpropagation Learning: The RPROP Algorithm*, ICNN 1993",
        "`torch.optim.Rprop` and NumPy; the exact relation to `optax.rprop`'s output (which lags one step, optax PR 1725)",
        None,
    ),
    # Layer-wise and factored
    (
        "LAMB",
        "layerwise",
        f"You et al., *Large Batch Optimization for Deep Learning: Training BERT in 76 minutes*, ICLR 2020, {arxiv('1904.00962')}",
        "`optax.lamb` with a mask, a schedule, `eps_root`",
        None,
    ),
    (
        "LARS",
        "layerwise",
        f"You, Gitman & Ginsburg, *Large Batch Training of Convolutional Networks*, 2017, {arxiv('1708.03888')}",
        "`optax.lars` with both masks, Nesterov, a schedule",
        None,
    ),
    (
        "Fromage",
        "layerwise",
        f"Bernstein et al., *On the distance between two neural networks and the stability of learning*, NeurIPS 2020, {arxiv('2002.03432')}",
        "`optax.fromage`",
        None,
    ),
    (
        "NovoGrad",
        "layerwise",
        f"Ginsburg et al., *Stochastic Gradient Methods with Layer-wise Adaptive Moments for Training of Deep Networks*, 2019, {arxiv('1905.11286')}",
        "`optax.novograd`",
        None,
    ),
    (
        "Adafactor",
        "layerwise",
        f"Shazeer & Stern, *Adafactor: Adaptive Learning Rates with Sublinear Memory Cost*, ICML 2018, {arxiv('1804.04235')}",
        "`optax.adafactor`: factored (matrix and 3-D) and unfactored leaves, momentum, mask, schedules",
        None,
    ),
    (
        "SM3",
        "layerwise",
        f"Anil et al., *Memory-Efficient Adaptive Optimization*, NeurIPS 2019, {arxiv('1901.11150')}",
        "`optax.sm3` (scalars as 1-element vectors, where `optax.sm3` fails)",
        None,
    ),
    # Newer
    (
        "Adan",
        "newer",
        f"Xie et al., *Adan: Adaptive Nesterov Momentum Algorithm for Faster Optimizing Deep Models*, 2022, {arxiv('2208.06677')}",
        "`optax.adan` with a mask and a schedule",
        None,
    ),
    (
        "Muon",
        "newer",
        "Jordan et al., *Muon: An optimizer for hidden layers in neural networks*, 2024 (kellerjordan.github.io/posts/muon)",
        "`optax.contrib.muon` (0.2.8) option by option over 30 steps in float32 and float64: `preconditioning` (`frobenius`, `spectral`, `aol`, `schatten`), `adaptive`, `consistent_rms`, the `standard` and `dion` presets and the Polar Express rows, `MatrixAxes` against `MuonDimensionNumbers` on a conv kernel, a stack with its batch axis in the middle and an `(out, in)` matrix; Nesterov on and off, decay, a schedule; Gram Newton-Schulz against the plain iteration in float64 (rtol 1e-10); 8-bit momentum against float32; inside `shard_map` with rows split over 8 devices against one device",
        "the default in float32; rtol 1e-10, atol 1e-11 in float64",
    ),
    (
        "MuonClip",
        "newer",
        f"Kimi Team, *Kimi K2: Open Agentic Intelligence*, 2025, {arxiv('2507.20534')}",
        "`optax.contrib.muon` (`consistent_rms=0.2`) followed by a transcription of the report's per-head QK-clip, on a small attention model whose largest logits start above the threshold, 12 steps through `make_train_step` (the logits handed from the loss's aux), with and without a query bias; a clip alone brings a head's logits to the threshold; below it, `Muon` to float32 rounding",
        "rtol 1e-4, atol 1e-5 (float32 Newton-Schulz on both sides, with logits of a few tens)",
    ),
    (
        "NorMuon",
        "newer",
        f"Li et al., *NorMuon: Making Muon more efficient and scalable*, 2025, {arxiv('2510.05491')}",
        "a torch transcription of the authors' `normuon_update` (Newton-Schulz in float32) with its Adam group over 30 steps, Nesterov on and off, decay; the paper's RMS scaling (`consistent_rms`); a 3-D stack by mask",
        None,
    ),
    (
        "AdaMuon",
        "newer",
        f"Si et al., *AdaMuon: Adaptive Muon Optimizer*, 2025, {arxiv('2507.11005')}",
        "pytorch-optimizer 4.1.0's `AdaMuon` with its AdamW group over 30 steps in float32 and float64 (its Newton-Schulz, bfloat16 there, run in the same dtype): its defaults, the RMS-aligned and Jordan's scaling, decay by mask, a schedule, a conv kernel as its `(out, in * k * k)` matrix; the paper's sign-stabilised direction and the authors' Nesterov momentum against a NumPy transcription of Algorithm 1 in float64 (rtol 1e-9); Gram Newton-Schulz against the plain iteration; 8-bit moments against float32",
        "the default in float32; rtol 1e-11, atol 1e-12 in float64",
    ),
    (
        "Dion",
        "newer",
        f"Ahn et al., *Dion: Distributed Orthonormalized Updates*, 2025, {arxiv('2504.05295')}; microsoft/dion's `dion_reference.py`",
        "a NumPy transcription of microsoft/dion's reference `dion_update` (Householder QR) and its AdamW over 30 steps in float64 from the same initial factors, on wide, tall and square matrices and a vector: full rank, half rank, a rank fraction rounded to a multiple with two power iterations (parameters and momenta within 4e-15, factors within 2.1e-14); a warmup schedule with Householder and with Cholesky QR (4.4e-15); a stack of matrices and an `(out, in)` weight by `MatrixAxes`; a zero gradient; 8-bit momentum and bf16 parameters against float32; split over 8 devices against one (the largest collective a rank-8 product)",
        "rtol 1e-12, atol 1e-13 (float64)",
    ),
    (
        "HyperBallAdamW",
        "newer",
        "Wen et al., *Fantastic Pretraining Optimizers and Where to Find Them*, Section 2.1, *HyperBall Optimization*, 2025; as heavyball 3.2.1's `HyperBallAdamW`",
        "heavyball 3.2.1's `HyperBallAdamW` over 40 steps on wide, tall and 3-D matrices, a vector and a scalar, in float64 (largest difference 2e-15) and float32 (1e-6): plain, decay, caution with cautious decay, `b2`/`eps`, a warmup schedule (heavyball's `warmup_steps`), weight-decay and hyperball masks (heavyball's groups and routes), weights loaded after `init` (the radius measured at the first step, as heavyball); each matrix's norm kept to 1e-13 at every step; bf16 parameters and 8-bit second moments",
        "rtol 1e-12, atol 1e-13 in float64; the default in float32",
    ),
    (
        "PolarGrad",
        "newer",
        f"Lau, Long & Su, *PolarGrad: A Class of Matrix-Gradient Optimizers from a Unifying Preconditioning Perspective*, 2025, {arxiv('2505.21799')}; as the authors' `PolarGrad` (github.com/timlautk/polargrad, `polar_grad.py`)",
        "a NumPy float64 transcription of the authors' `PolarGrad.step` (polar factor and nuclear norm from NumPy's SVD) with `Muon`'s AdamW for a vector, over 40 steps on wide, tall and square matrices and a stack of matrices by mask: momentum first and polar first, QDWH and SVD, decay and a warmup schedule (largest difference 6e-16); without momentum (the paper's PolarGrad); Newton-Schulz run to convergence against it; QDWH, SVD and Newton-Schulz against each other in float32; zero gradients; 8-bit momentum against float32; bf16 parameters",
        "rtol 1e-12, atol 1e-13 (float64)",
    ),
    (
        "Scion",
        "newer",
        f"Pethick et al., *Training Deep Learning Models with Norm-Constrained LMOs*, ICML 2025, {arxiv('2502.07529')}; as heavyball 3.2.1's `Scion`",
        "heavyball 3.2.1's `Scion` over 40 steps in float64 from its own initialisation (its auto norm on wide, tall, 3-D and 4-D kernels, a vector and a scalar): plain, decay with a radius and momentum, the constrained step (its `weight_decay=1`), a warmup schedule and a weight-decay mask (its groups), largest difference 2e-15; `pytorch_optimizer.SCION` (4.1.0, Newton-Schulz in float64) with a different oracle per leaf (spectral, column, row, sign, RMS), constrained and not, largest difference 2e-15; bf16 parameters and 8-bit momentum against float32",
        "rtol 1e-12, atol 1e-13 (float64)",
    ),
    (
        "SOAP",
        "newer",
        f"Vyas et al., *SOAP: Improving and Stabilizing Shampoo using Adam*, 2024, {arxiv('2409.11321')}; `factor_update='kl'` (KL-SOAP): Lin et al., *Understanding and Improving Shampoo and SOAP via Kullback-Leibler Minimization*, 2025, {arxiv('2509.03378')}",
        "a NumPy float64 transcription of the authors' code; an ill-conditioned regression from above 100 to below 1e-2 (no optax equivalent, optax issue 1580); `factor_update='kl'` against heavyball 3.2.1's `KLSOAP` in float64 over 25 closed-loop steps (square matrices, and a one-sided, a 3-D and a 1-D leaf; eps 1e-12 and 1e-8), and split under FSDP on 8 devices against one device",
        "the default; KL-SOAP against heavyball in float64: 1e-10 absolute (eps 1e-12; measured 2e-12), 1e-7 (eps 1e-8, which heavyball also adds to the bias-corrected root and to each QR's input; measured 1.8e-8)",
    ),
    (
        "Shampoo",
        "newer",
        f"Gupta et al., *Shampoo: Preconditioned Stochastic Tensor Optimization*, ICML 2018, {arxiv('1802.09568')}; grafting, blocking and filtering as Shi et al., *A Distributed Data-Parallel PyTorch Implementation of the Distributed Shampoo Optimizer*, 2023, {arxiv('2309.06497')}",
        "a NumPy float64 transcription of the distributed Shampoo paper's algorithm (unpadded blocks), 3 configurations over 30 steps; a Kronecker-factored quadratic (condition number 1e4) reached in under half the steps of Adam at its best learning rate",
        "rtol 2e-4, atol 2e-5 (float32 eigendecompositions against float64)",
    ),
    (
        "KLShampoo",
        "newer",
        f"Lin et al., *Understanding and Improving Shampoo and SOAP via Kullback-Leibler Minimization*, 2025, {arxiv('2509.03378')}; as heavyball 3.2.1's `KLShampoo`",
        "heavyball 3.2.1's `KLShampoo` (no dampening) in float64 over 25 closed-loop steps: square and non-square matrices, a one-sided, a 3-D, a 1-D leaf and one with an axis of 1, refreshes every 2 and 4 steps, decay; split under FSDP on 8 devices and under `shard_map` with `param_specs` against one device",
        "1e-11 absolute in float64 (eps 1e-12; measured 4e-14); 1e-7 (eps 1e-8, by which heavyball lifts each QR's input; measured 1e-8)",
    ),
    (
        "PSGDKron",
        "newer",
        f"Li, *Preconditioned Stochastic Gradient Descent*, 2015, {arxiv('1512.04202')}; Kronecker factors: Li, *Preconditioner on Matrix Lie Group for SGD*, ICLR 2019, {arxiv('1809.10232')}; as PSGD-Kron in psgd_torch `kron.py`, psgd_jax and heavyball",
        "a NumPy float64 transcription of `kron.py`'s step (unpadded blocks, explicit inverses) fed the same key-derived probes and update draws, 2 configurations over 30 steps; a Kronecker-factored quadratic (condition number 1e4) reached in under half the steps of Adam at its best learning rate and schedule",
        "rtol 2e-4, atol 2e-5 (float32 triangular solves against float64 inverses)",
    ),
    (
        "LaProp",
        "newer",
        f"Ziyin et al., *LaProp: Separating Momentum and Adaptivity in Adam*, 2020, {arxiv('2002.04839')}",
        "a torch transcription of the authors' `laprop.py` over 30 steps (masked weight decay; `centered`, `amsgrad` and both, on gradients with a mean away from zero; `update` and `step`); the paper's form in float64 with a schedule",
        None,
    ),
    (
        "AdamMini",
        "newer",
        f"Zhang et al., *Adam-mini: Use Fewer Learning Rates To Gain More*, 2024, {arxiv('2406.16793')}",
        "a torch transcription of the authors' `Adam_mini` update over 30 steps, for each partition (`leaf`, `rows`, `columns`) with masked weight decay; the state of a model of matrices is 1.016x its parameters' bytes with `rows` (AdamW's: 2x)",
        None,
    ),
    (
        "MARS",
        "newer",
        f"Yuan et al., *MARS: Unleashing the Power of Variance Reduction for Training Large Models*, 2024, {arxiv('2411.10438')}",
        "a torch transcription of the authors' `mars.py` (MARS-AdamW, approximate form, `optimize_1d=True`) over 30 steps with masked weight decay, gradients on both sides of the clipping threshold; `update` and `step`",
        None,
    ),
    (
        "Prodigy",
        "newer",
        f"Mishchenko & Defazio, *Prodigy: An Expeditiously Adaptive Parameter-Free Learner*, 2023, {arxiv('2306.06101')}",
        "`optax.contrib.prodigy` on random gradients and on a quadratic",
        "the default on random gradients; atol 1e-5 on the quadratic, where `d` grows 10^4-fold and tree sums are added in another order",
    ),
    (
        "ScheduleFreeSGD",
        "newer",
        f"Defazio et al., *The Road Less Scheduled*, 2024, {arxiv('2405.15682')}",
        "`optax.contrib.schedule_free_sgd`: the parameters and the evaluation parameters at every step",
        None,
    ),
    (
        "ScheduleFreeAdamW",
        "newer",
        f"Defazio et al., *The Road Less Scheduled*, 2024, {arxiv('2405.15682')}",
        "`optax.contrib.schedule_free_adamw`: the parameters and the evaluation parameters at every step",
        None,
    ),
    (
        "LBFGS",
        "newer",
        "Liu & Nocedal, *On the limited memory BFGS method for large scale optimization*, Mathematical Programming 45, 1989; the zoom linesearch of Nocedal & Wright, *Numerical Optimization*, Algorithms 3.5 and 3.6",
        "`optax.lbfgs`: the same linesearch iterations at every step; Rosenbrock to the exact minimum",
        "rtol 1e-3, atol 5e-4 on Rosenbrock (dot products summed in another order, amplified by the curved valley; the largest difference seen is 7e-5); the default elsewhere",
    ),
    # optax.contrib methods
    (
        "Mechanic",
        "contrib",
        f"Cutkosky, Defazio & Mehta, *Mechanic: A Learning Rate Tuner*, NeurIPS 2023, {arxiv('2306.00144')}",
        "`optax.contrib.mechanize` around the same inner optimizer (Adam, 32 steps) and around `optax.sgd` with momentum (40 steps), on a quartic regression",
        "rtol 1e-4, atol 1e-5 (tree-wide sums added in another order, times a scale that grows 10^5-fold)",
    ),
    (
        "ScheduleFree",
        "contrib",
        f"Defazio et al., *The Road Less Scheduled*, 2024, {arxiv('2405.15682')}",
        "`optax.contrib.schedule_free` around `optax.adam(b1=0)`: the evaluation parameters at every step; around `SGD` and `AdamW(b1=0)` it is `ScheduleFreeSGD` and `ScheduleFreeAdamW`",
        "the default against optax; rtol 1e-6, atol 1e-7 against eqxopt's fused schedule-free optimizers",
    ),
    (
        "SWA",
        "transforms",
        f"Izmailov et al., *Averaging Weights Leads to Wider Optima and Better Generalization*, UAI 2018, {arxiv('1803.05407')}",
        "`torch.optim.swa_utils.AveragedModel` (its default arithmetic mean) updated after the same steps, around SGD with momentum over 30 steps, 3 `start`/`every` pairs: the mean and the snapshot count at every step",
        None,
    ),
    (
        "SAM",
        "contrib",
        f"Foret et al., *Sharpness-Aware Minimization for Efficiently Improving Generalization*, ICLR 2021, {arxiv('2010.01412')}",
        "`optax.contrib.sam` (opaque mode, normalised SGD ascent step) around SGD with momentum; on `(a * b - 1)**2` SAM leaves the sharp minimum SGD stays at for the flattest",
        None,
    ),
    (
        "Sophia",
        "contrib",
        f"Liu et al., *Sophia: A Scalable Stochastic Second-order Optimizer for Language Model Pre-training*, ICLR 2024, {arxiv('2305.14342')}",
        "`optax.contrib.sophia` with its Hutchinson estimator and the same seed (Sophia-H, 30 steps), and with an estimator of one's own (the exact diagonal, `hessian=`)",
        None,
    ),
    (
        "GaLore",
        "contrib",
        f"Zhao et al., *GaLore: Memory-Efficient LLM Training by Gradient Low-Rank Projection*, ICML 2024, {arxiv('2403.03507')}",
        "`optax.contrib.galore` (its default `scale_by_adam` base) on tall and wide matrices and non-matrix leaves, projectors refreshed every 7 steps, 30 steps",
        "rtol 2e-5, atol 1e-5 (the non-matrix leaves' Adam steps of nearly constant size round one ulp apart each step; the matrices agree to 1e-6)",
    ),
    (
        "APOLLO",
        "contrib",
        f"Zhu et al., *APOLLO: SGD-like Memory, AdamW-level Performance*, MLSys 2025, {arxiv('2412.05270')}",
        "pytorch-optimizer 4.1.0's `APOLLO` with a square orthogonal projection (where its projected-back update is the authors' scaled gradient; channel and tensor scales), and a NumPy transcription of the authors' `apollo_torch` with random rank-r projections, decay, `scale`, `scale_front` and the norm-growth limiter, 30 steps; the redraw schedule",
        "rtol 2e-5, atol 2e-6 (pytorch-optimizer); rtol 1e-4, atol 1e-6 (the float64 transcription)",
    ),
    (
        "APOLLOMini",
        "contrib",
        f"Zhu et al., MLSys 2025, {arxiv('2412.05270')}",
        "the NumPy transcription of the authors' `apollo_torch` at rank 1 with one scale per matrix, 30 steps; its state for an (m, n) matrix is m + m + n numbers",
        "rtol 1e-4, atol 1e-6",
    ),
]

# Parameter-free and adaptive-step optimizers (api/parameter-free.md)
CATALOG += [
    (
        "DoG",
        "parameter-free",
        f"Ivgi et al., *DoG is SGD's Best Friend: A Parameter-Free Dynamic Step Size Schedule*, ICML 2023, {arxiv('2302.12022')}",
        "`optax.contrib.dog` over 40 steps: the three `init_step` kinds; a schedule with masked weight decay",
        "rtol 1e-4, atol 1e-5 (whole-tree norms, a root and a division per step)",
    ),
    (
        "DoWG",
        "parameter-free",
        f"Khaled et al., *DoWG Unleashed: An Efficient Universal Parameter-Free Gradient Descent Method*, NeurIPS 2023, {arxiv('2305.16284')}",
        "`optax.contrib.dowg` over 40 steps, with and without `init_estim_sq_dist`, masked weight decay",
        "rtol 1e-4, atol 1e-5 (whole-tree norms, a root and a division per step)",
    ),
    (
        "COCOB",
        "parameter-free",
        f"Orabona & Tommasi, *Training Deep Networks without Learning Rates Through Coin Betting*, NeurIPS 2017, {arxiv('1705.07795')}",
        "`optax.contrib.cocob` over 40 steps, with masked weight decay and with a schedule",
        None,
    ),
    (
        "ASGD",
        "parameter-free",
        f"Polyak & Juditsky, *Acceleration of Stochastic Approximation by Averaging*, SIAM J. Control Optim. 30(4), 1992; step sizes of Xu, *Towards Optimal One Pass Large Scale Learning with Averaged Stochastic Gradient Descent*, 2011, {arxiv('1107.2490')}",
        "`torch.optim.ASGD` over 40 steps: the parameters and the averages `ax`, two settings of `lambd`, `alpha`, `t0` and weight decay",
        None,
    ),
    (
        "MADGRAD",
        "parameter-free",
        f"Defazio & Jelassi, *Adaptivity without Compromise: A Momentumized, Adaptive, Dual Averaged Gradient Method for Stochastic Optimization*, JMLR 23, 2022, {arxiv('2101.11075')}",
        "a float64 NumPy transcription of the authors' `madgrad.MADGRAD` over 40 steps (momentum 0.9, 0.5 and 0, coupled and decoupled decay, eps 0); `optax.contrib.madgrad`",
        "rtol 1e-4, atol 1e-5 against the float64 transcription; the default against optax",
    ),
    (
        "DAdaptAdamW",
        "parameter-free",
        f"Defazio & Mishchenko, *Learning-Rate-Free Learning by D-Adaptation*, ICML 2023, {arxiv('2301.07733')}",
        "`optax.contrib.dadapt_adamw` over 40 steps: random gradients; a quadratic where `d` grows 10^4-fold, in float32 and (slow) float64",
        "rtol 1e-4, atol 1e-5 on random gradients; rtol 1e-3, atol 1e-4 on the float32 quadratic, where the closed loop doubles a one-ulp difference every few steps; 1e-12 in float64",
    ),
    (
        "Momo",
        "parameter-free",
        f"Schaipp et al., *MoMo: Momentum Models for Adaptive Learning Rates*, ICML 2024, {arxiv('2305.07583')}",
        "`optax.contrib.momo` over 40 steps on a quadratic (the loss passed as `value`), with and without `adapt_lower_bound`, with a schedule",
        "rtol 1e-4, atol 1e-5 (whole-tree inner products each step, in a closed loop)",
    ),
    (
        "MomoAdam",
        "parameter-free",
        f"Schaipp et al., *MoMo: Momentum Models for Adaptive Learning Rates*, ICML 2024, {arxiv('2305.07583')}",
        "`optax.contrib.momo_adam` over 40 steps on a quadratic (the loss passed as `value`), with and without `adapt_lower_bound`",
        "rtol 1e-4, atol 1e-5 (whole-tree inner products each step, in a closed loop)",
    ),
    (
        "DAdaptSGD",
        "parameter-free",
        f"Defazio & Mishchenko, *Learning-Rate-Free Learning by D-Adaptation*, ICML 2023, {arxiv('2301.07733')}",
        "a float64 NumPy transcription of the authors' `dadaptation.DAdaptSGD` over 40 steps on a quadratic where `d` grows over 100-fold, with and without momentum, weight decay and `growth_rate`",
        "rtol 1e-4, atol 1e-5 (float32 against the float64 transcription)",
    ),
    # building blocks (an optimizer's direction without its learning rate)
    (
        "ScaleByAdamax",
        "blocks",
        "Kingma & Ba, ICLR 2015, section 7.1",
        "`optax.scale_by_adamax` over 30 steps with a `None`-gradient leaf; chained with `ScaleByLearningRate`, `Adamax` and (with `AddDecayedWeights`) `AdamaxW`",
        None,
    ),
    (
        "ScaleByAmsgrad",
        "blocks",
        f"Reddi et al., *On the Convergence of Adam and Beyond*, ICLR 2018, {arxiv('1904.09237')}",
        "`optax.scale_by_amsgrad` over 30 steps with a `None`-gradient leaf; chained with `ScaleByLearningRate`, `AMSGrad` (with and without the bias corrections)",
        None,
    ),
    (
        "ScaleByAdadelta",
        "blocks",
        f"Zeiler, *ADADELTA: An Adaptive Learning Rate Method*, 2012, {arxiv('1212.5701')}",
        "`optax.scale_by_adadelta` over 30 steps with a `None`-gradient leaf; chained with `ScaleByLearningRate`, `Adadelta`",
        None,
    ),
    (
        "ScaleByAdan",
        "blocks",
        f"Xie et al., *Adan: Adaptive Nesterov Momentum Algorithm for Faster Optimizing Deep Models*, 2022, {arxiv('2208.06677')}",
        "`optax.scale_by_adan` over 30 steps with a `None`-gradient leaf; chained with `ScaleByLearningRate`, `Adan`",
        None,
    ),
    (
        "ScaleByBelief",
        "blocks",
        f"Zhuang et al., *AdaBelief Optimizer*, NeurIPS 2020, {arxiv('2010.07468')}",
        "`optax.scale_by_belief` over 30 steps with a `None`-gradient leaf; chained with `ScaleByLearningRate`, `AdaBelief` (nesterov too)",
        "the default; atol 1e-5 with `nesterov=True` (Dozat's estimate cancels near zero, as for `ScaleByAdam`)",
    ),
    (
        "ScaleByLion",
        "blocks",
        f"Chen et al., *Symbolic Discovery of Optimization Algorithms*, 2023, {arxiv('2302.06675')}",
        "`optax.scale_by_lion` over 30 steps with a `None`-gradient leaf; chained with `ScaleByLearningRate`, `Lion` (the three modes)",
        None,
    ),
    (
        "ScaleByNovograd",
        "blocks",
        f"Ginsburg et al., *Stochastic Gradient Methods with Layer-wise Adaptive Moments for Training of Deep Networks*, 2019, {arxiv('1905.11286')}",
        "`optax.scale_by_novograd` over 30 steps with a `None`-gradient leaf; chained with `ScaleByLearningRate`, `NovoGrad`",
        None,
    ),
    (
        "ScaleByRadam",
        "blocks",
        f"Liu et al., *On the Variance of the Adaptive Learning Rate and Beyond*, ICLR 2020, {arxiv('1908.03265')}",
        "`optax.scale_by_radam` over 30 steps with a `None`-gradient leaf; chained with `ScaleByLearningRate`, `RAdam` (nesterov too), in float64",
        "rtol 1e-10, atol 1e-12 in float64 against optax (in float32 optax's `rho_t` cancels, see `RAdam`); the default against `RAdam`",
    ),
    (
        "ScaleByRss",
        "blocks",
        "Duchi, Hazan & Singer, *Adaptive Subgradient Methods for Online Learning and Stochastic Optimization*, JMLR 2011",
        "`optax.scale_by_rss` over 30 steps with a `None`-gradient leaf; chained with `ScaleByLearningRate`, `Adagrad`",
        None,
    ),
    (
        "ScaleByYogi",
        "blocks",
        "Zaheer et al., *Adaptive Methods for Nonconvex Optimization*, NeurIPS 2018",
        "`optax.scale_by_yogi` over 30 steps with a `None`-gradient leaf; chained with `ScaleByLearningRate`, `Yogi`",
        None,
    ),
    # Structured building blocks (chained with ScaleByLearningRate)
    (
        "ScaleByRprop",
        "blocks",
        "Riedmiller & Braun, *A Direct Adaptive Method for Faster Backpropagation Learning: The RPROP Algorithm*, ICNN 1993",
        "`optax.scale_by_rprop` over 25 steps on a tree of matrices, vectors and a 3-d leaf (the update its state holds, one call ahead of its output, optax PR 1725); chained, `Rprop`",
        None,
    ),
    (
        "ScaleBySm3",
        "blocks",
        f"Anil et al., *Memory-Efficient Adaptive Optimization*, NeurIPS 2019, {arxiv('1901.11150')}",
        "`optax.scale_by_sm3` over 25 steps on a tree of matrices, vectors and a 3-d leaf, summed and decayed accumulators; chained, `SM3`",
        None,
    ),
    (
        "ScaleByStddev",
        "blocks",
        f"Graves, *Generating Sequences With Recurrent Neural Networks*, 2013, {arxiv('1308.0850')}",
        "`optax.scale_by_stddev` over 25 steps on a tree of matrices, vectors and a 3-d leaf, 3 configurations (eps in and outside the root, bias correction)",
        None,
    ),
    (
        "ScaleByFactoredRms",
        "blocks",
        f"Shazeer & Stern, *Adafactor: Adaptive Learning Rates with Sublinear Memory Cost*, ICML 2018, {arxiv('1804.04235')}",
        "`optax.scale_by_factored_rms` over 25 steps on a tree of matrices, vectors and a 3-d leaf: factored and unfactored, a custom `decay_rate_fn`; chained, `Adafactor` without clipping or parameter scale",
        None,
    ),
    (
        "ScaleByParamBlockNorm",
        "blocks",
        f"You et al., *Large Batch Training of Convolutional Networks*, 2017, {arxiv('1708.03888')}",
        "`optax.scale_by_param_block_norm` over 25 steps on a tree of matrices, vectors and a 3-d leaf, with the floor reached and not",
        None,
    ),
    (
        "ScaleByParamBlockRms",
        "blocks",
        f"Shazeer & Stern, *Adafactor: Adaptive Learning Rates with Sublinear Memory Cost*, ICML 2018, {arxiv('1804.04235')}",
        "`optax.scale_by_param_block_rms` over 25 steps on a tree of matrices, vectors and a 3-d leaf, with the floor reached and not",
        None,
    ),
    (
        "ScaleByOptimisticGradient",
        "blocks",
        f"Daskalakis et al., *Training GANs with Optimism*, ICLR 2018, {arxiv('1711.00141')}",
        "`optax.scale_by_optimistic_gradient` over 25 steps on a tree of matrices, vectors and a 3-d leaf; chained, `OptimisticGradientDescent`",
        None,
    ),
    (
        "ScaleByPolyak",
        "blocks",
        f"Loizou et al., *Stochastic Polyak Step-size for SGD*, AISTATS 2021, {arxiv('2002.10542')}",
        "`optax.scale_by_polyak` over 25 steps on a tree of matrices, vectors and a 3-d leaf (`sps` and `sps+`); chained, `PolyakSGD`",
        None,
    ),
    (
        "ScaleByDistanceOverGradients",
        "blocks",
        f"Ivgi et al., *DoG is SGD's Best Friend: A Parameter-Free Dynamic Step Size Schedule*, ICML 2023, {arxiv('2302.12022')}",
        "`optax.scale_by_distance_over_gradients` over 25 steps on a tree of matrices, vectors and a 3-d leaf; chained, `DoG` on a one-leaf model",
        None,
    ),
    (
        "ScaleByLBFGS",
        "blocks",
        "Liu & Nocedal, *On the limited memory BFGS method for large scale optimization*, Mathematical Programming 45, 1989",
        "`optax.scale_by_lbfgs` (its sign, `+H g`) over 25 steps on a tree of matrices, vectors and a 3-d leaf; chained with `ScaleByLearningRate`, `LBFGS(linesearch=False)`",
        None,
    ),
]


def counts() -> dict[str, int]:
    """How many optimizers and building blocks the catalog has: the counts README,
    the docs and CHANGELOG give (tests/test_figures.py)."""
    blocks = sum(1 for entry in CATALOG if entry[1] == "blocks")
    return {"optimizers": len(CATALOG) - blocks, "building blocks": blocks}


HEADER = """# The optimizer catalog

<!-- Written by docs/make_catalog.py from eqxopt's docstrings and signatures: edit
those (or the script's table of papers and references), then run
`python docs/make_catalog.py`. -->

The catalog's {optimizers} optimizers and {blocks} building blocks, by family (each
family's API page has every argument):

| family | optimizers |
| --- | --- |
{families}

Every optimizer is a final Equinox module with array hyperparameters (no
recompiles), validated construction, a named state, checked `update`/`step`, and the
shared per-leaf engine, so `None` gradients, non-float leaves, bfloat16 and whole
Equinox models work the same for all of them (`tests/test_catalog.py` runs those
properties over the whole catalog). Each entry gives the update rule as its
docstring states it, the defaults from its signature, the paper, and what the tests
compare it against: at least 30 steps on a nested pytree, to float32 rounding
({default}) unless the entry names a looser tolerance and why. Transforms, wrappers
and schedules are in the [cookbook](cookbook.md), the [schedules page](schedules.md)
and the [API reference](api/transforms.md).

In the formulas `g` is the gradient, `p` the parameter, `lr` the learning rate at the
current step (a schedule is read at `state.step`), and `t = step + 1` where a bias
correction needs it. Weight decay in an optimizer's own `weight_decay` is decoupled
(`AdamW`'s) unless its entry says coupled.

"""


def _default(value: object) -> str:
    if isinstance(value, type):
        return (
            f"jnp.{value.__name__}"
            if value.__module__.startswith("jax")
            else value.__name__
        )
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return repr(value)


def _signature(obj: type) -> tuple[list[str], list[str]]:
    required, defaults = [], []
    for name, parameter in inspect.signature(obj).parameters.items():
        if parameter.default is inspect.Parameter.empty:
            required.append(f"`{name}`")
        else:
            defaults.append(f"`{name}={_default(parameter.default)}`")
    return required, defaults


# The docstring's first formula: a displayed one ($$ ... $$, typeset on the site) or
# a plain code block.
_FORMULA = re.compile(r"^(\$\$\n.*?^\$\$|```\n.*?^```)$", re.S | re.M)


def _formula_and_summary(obj: type) -> tuple[str, str]:
    doc = inspect.getdoc(obj) or ""
    match = _FORMULA.search(doc)
    if match is None:
        return " ".join(doc.split("\n\n")[0].split()), ""
    # the paragraphs before the formula say what its symbols are
    before = doc[: match.start()].strip().split("\n\n")
    summary = "\n\n".join(" ".join(paragraph.split()) for paragraph in before)
    return summary, match.group(1)


def family(page: str) -> str:
    """A family's name: the title of its API page (`docs/api/adam.md`)."""
    first = (pathlib.Path(__file__).parent / "api" / f"{page}.md").read_text()
    return first.splitlines()[0].removeprefix("# ")


def _entry(name: str, page: str, paper: str, reference: str, tolerance) -> str:
    obj = getattr(eqxopt, name)
    summary, formula = _formula_and_summary(obj)
    required, defaults = _signature(obj)
    lines = [f"### {name}", "", summary, ""]
    if formula:
        lines += [formula, ""]
    lines += [
        f"- **Required:** {', '.join(required) if required else 'nothing'}.",
        f"- **Defaults:** {', '.join(defaults) if defaults else 'none'}.",
        f"- **Paper:** {paper}.",
        f"- **Tested against:** {reference}.",
        f"- **Tolerance:** {tolerance or DEFAULT_TOL}.",
        f"- **API:** [`eqxopt.{name}`](api/{page}.md#eqxopt.{name}), with every"
        " argument and the conventions where references differ.",
        "",
    ]
    return "\n".join(lines)


def render() -> str:
    families: dict[str, list[tuple]] = {}  # API page -> entries, in catalog order
    for entry in CATALOG:
        families.setdefault(entry[1], []).append(entry)
    rows, sections = [], []
    for page, entries in families.items():
        title = family(page)
        links = ", ".join(f"[`{e[0]}`](#{e[0].lower()})" for e in entries)
        anchor = re.sub(r"[^\w\s-]", "", title.lower()).replace(" ", "-")
        rows.append(f"| [{title}](#{anchor}) | {links} |")
        sections.append(f"## {title}\n\n" + "\n".join(_entry(*e) for e in entries))
    n = counts()
    header = HEADER.format(
        default=DEFAULT_TOL,
        optimizers=n["optimizers"],
        blocks=n["building blocks"],
        families="\n".join(rows),
    )
    return header + "\n".join(sections)


def _short_tolerance(tolerance: str | None) -> str:
    # The summary table's cell: the tolerance without the reasons (the entry has them).
    if not tolerance:
        return DEFAULT_TOL
    return re.sub(r"\s*\([^)]*\)", "", tolerance).replace("the default", DEFAULT_TOL)


def main() -> None:
    out = pathlib.Path(__file__).parent / "catalog.md"
    out.write_text(render())
    n = counts()
    print(f"wrote {out} ({n['optimizers']} optimizers, {n['building blocks']} blocks)")


if __name__ == "__main__":
    main()
