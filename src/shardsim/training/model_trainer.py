"""Training a transformer under a :class:`~shardsim.plans.Plan`: ``run_model``, then the optimizer step.

:class:`~shardsim.training.Trainer` trains a transformer as it trains an MLP:
``Trainer(cfg, plan, mesh, params, optimizer)`` (or :meth:`Trainer.for_model
<shardsim.training.Trainer.for_model>`, the same). Its :meth:`~shardsim.training.Trainer.step`
runs :func:`~shardsim.transformer.run_model` (forward, loss, backward, the gradients reduced over
the data axis as the plan's ZeRO stage says) on the trainer's own weights, then the optimizer
update of :func:`~shardsim.training.trainer.update_weight`, the one the MLP's step runs
(:mod:`shardsim.training.model_step`). :class:`ModelTrainer` is another name of
:class:`~shardsim.training.Trainer` (the very class: ``ModelTrainer is Trainer``), kept for the
callers that know it. Where the optimizer state lives:

========  ==========================  ===========================  ==============================
ZeRO      weights                     gradients after backward     optimizer state; update
========  ==========================  ===========================  ==============================
0         replicated over data        AllReduced, whole            whole; in place
1         replicated over data        AllReduced, whole            split over data; each chip
                                                                   updates its slice, AllGather
2         replicated over data        ReduceScattered, split       split; as ZeRO-1
3         split over data (FSDP)      ReduceScattered, split       split; in place
========  ==========================  ===========================  ==============================

"Split over data" is the weight's ``D`` dimension (its only one for a vector), as ZeRO-3
splits it. Under mixed precision the optimizer updates float32 master weights and the 16-bit
weights are their rounded copy. The weights live on their pipeline stage only under ``pp > 1``,
and so do their master copy and moments. A step is all or nothing, as the MLP trainer's.

>>> import numpy as np, shardsim
>>> from shardsim.models import get, reference
>>> from shardsim.plans import Plan
>>> from shardsim.training import Trainer
>>> cfg = get("llama-tiny")
>>> plan = Plan(dp=2, zero=1)
>>> t = Trainer.for_model(cfg, plan, plan.mesh(), reference.init(cfg, dtype="float64"), "sgd")
>>> tok = np.arange(32).reshape(4, 8) % cfg.vocab
>>> r = t.step(tok, (tok + 1) % cfg.vocab)
>>> type(t) is Trainer is ModelTrainer
True
>>> sorted({op for op, _ in r.trace.collectives("optimizer")})
['all_gather']
>>> r.layouts["opt_layers.0.attn.wq"], r.layouts["layers.0.attn.wq"]
('[D_{data}, NH]', '[D, NH]')
"""

from __future__ import annotations

from .model_step import step_dropout_seed
from .trainer import Trainer

ModelTrainer = Trainer  # one trainer class for the MLP and the transformer

__all__ = ["ModelTrainer", "step_dropout_seed"]
