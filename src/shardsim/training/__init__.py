"""Training: deep MLP stacks, optimizers, ZeRO stages, mixed precision and recomputation.

A :class:`Trainer` holds an MLP's sharded weights and optimizer state under one scheme
(``ddp``, ``zero1``, ``zero2``, ``zero3`` = ``fsdp``, ``tp``, ``fsdp_tp``) and runs training
steps: forward, mean-squared-error loss, backward, gradient synchronisation and update,
with every collective in the trace and every chip's bytes in the ledger. A step either
happens or it does not (one that raises changes nothing); float16 steps check their
gradients and skip an overflowing update (:class:`DynamicLossScale`).

>>> import numpy as np, shardsim
>>> params = shardsim.models.reference_mlp.init_stack(2, 8, 16, seed=0)
>>> rng = np.random.default_rng(0)
>>> x, y = rng.standard_normal((8, 8)).astype(np.float32), np.zeros((8, 8), np.float32)
>>> losses = {}
>>> for name in ("ddp", "zero1", "zero2", "zero3"):
...     t = Trainer(name, shardsim.Mesh(X=4), params, Adam(lr=1e-2), activation="gelu")
...     losses[name] = [round(t.step(x, y).loss, 5) for _ in range(3)]
>>> len({tuple(v) for v in losses.values()})  # the same losses under every stage
1
"""

from __future__ import annotations

from . import policies
from .footprint import model_memory
from .loss import mse
from .model_trainer import ModelTrainer, step_dropout_seed
from .optim import SGD, Adam, AdamW, Optimizer
from .policies import BytePolicy
from .precision import Precision
from .scaling import DynamicLossScale
from .trainer import StepResult, Trainer, train_step

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "BytePolicy",
    "DynamicLossScale",
    "ModelTrainer",
    "Optimizer",
    "Precision",
    "StepResult",
    "Trainer",
    "model_memory",
    "mse",
    "policies",
    "step_dropout_seed",
    "train_step",
]
