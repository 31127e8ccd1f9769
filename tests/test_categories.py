"""Ledger categories of a scheme's run: the weights it places are ``params``, not activations.

Expected bytes are hand-derived from the layouts (float32, 4 bytes a number) and read back from
the mesh's ledger (``mesh.memory``), the same numbers the demo's memory table prints.
"""

from __future__ import annotations

import numpy as np

import shardsim
from shardsim.strategies import run_strategy

D, F, B = 4, 8, 4


def _run(name: str, mesh: shardsim.Mesh):
    params = shardsim.models.reference_mlp.init(D, F)
    x = np.ones((B, D), np.float32)
    return run_strategy(name, mesh, params, x, x)


def test_fsdp_weights_are_params_in_the_ledger() -> None:
    mesh = shardsim.Mesh(X=4)
    r = _run("fsdp", mesh)
    shard = D * F // 4 * 4  # one chip's quarter of W_in (and of W_out)
    gathered = D * F * 4  # one whole weight, all-gathered for its matmul and then freed
    assert mesh.memory.peak("params").tolist() == [2 * shard + gathered] * 4
    assert r.memory["params"].tolist() == [2 * shard + gathered] * 4
    assert mesh.memory.live("params").tolist() == [0] * 4  # every weight freed with the run


def test_ddp_holds_every_weight_whole_as_params() -> None:
    mesh = shardsim.Mesh(X=2)
    _run("ddp", mesh)
    assert mesh.memory.peak("params").tolist() == [2 * D * F * 4] * 2
