"""Options that do not apply, empty lists and numbers not written as digits: refused by name;
and answers that read as a number where there is none (``critical --scheme pp``)."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim import Mesh, cli
from shardsim.cli import count, mesh_type
from shardsim.cost import estimate, get_hardware
from shardsim.cost.critical import critical_batch
from shardsim.cost.estimator import excess_terms
from shardsim.transformer.demo import walk


def test_demo_model_quiet_prints_one_verdict_per_plan(capsys) -> None:
    assert cli.main(["demo", "--model", "gpt-tiny", "--quiet", "--plan", "tp=2", "--plan", "tp=2,sp"]) == 0
    out = capsys.readouterr().out.splitlines()
    want = ["PASS" if walk("gpt-tiny", p).rstrip().endswith("PASS") else "FAIL" for p in ("tp=2", "tp=2,sp")]
    assert out == [f"gpt-tiny under tp=2: {want[0]}", f"gpt-tiny under tp=2,sp: {want[1]}"]


#: Each MLP demo option, with a value of its own, that ``--model`` does not read.
MLP_OPTIONS = {"--scheme": ["ddp"], "--mesh": ["X=2"], "--axes": ["data=X"], "--batch": ["4"], "--d-model": ["8"],
               "--d-ff": ["16"], "--activation": ["relu"], "--dtype": ["float64"], "--seed": ["1"],
               "--option": ["microbatches=2"], "--engine": ["jax"], "--chrome-trace": ["t.json"], "--json": [],
               "--csv": []}  # fmt: skip


@pytest.mark.parametrize("flag", list(MLP_OPTIONS))
def test_demo_model_refuses_each_mlp_option_by_name(flag, capsys) -> None:
    assert cli.main(["demo", "--model", "gpt-tiny", "--plan", "tp=2", flag, *MLP_OPTIONS[flag]]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"shardsim demo: error: {flag}: the MLP demo's option(s); --model gpt-tiny")


def test_critical_pp_is_compute_bound_at_every_batch(capsys) -> None:
    """pp sends activations from stage to stage, bytes that grow with the batch as its matmuls
    do: no batch is needed to hide them. At one token per chip every phase's collectives already
    take no longer than its matmuls (the cost model's own terms), so the answer is "every
    batch", not a critical batch of 0.0 tokens."""
    mesh, hw = Mesh(Z=16), get_hardware("tpu-v5p")
    one_token = estimate("pp", mesh, hw, mesh.size, 8192, 32768, 16, dtype="bfloat16", efficiency="ideal")
    assert all(term <= 0 for term in excess_terms(one_token.phases).values())
    assert cli.main(["critical", "--scheme", "pp", "--hardware", "tpu-v5p"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == "pp on Mesh(Z=16) (tpu-v5p): compute-bound at every batch (from 1 token per chip)"
    assert "compute-bound above 2550.0 tokens per chip" in str(critical_batch("fsdp", "tpu-v5p"))


_DIGITISH = st.text(st.sampled_from("0123456789+-_ .eE٢²x"), min_size=1, max_size=6)


@given(_DIGITISH)
@settings(max_examples=200, deadline=None, derandomize=True)
def test_a_mesh_size_is_a_positive_whole_number_in_ascii_digits(size: str) -> None:
    plain = size.strip()
    if plain.isascii() and plain.isdigit() and 1 <= int(plain) <= 4096:
        assert mesh_type()(f"X={size}") == {"X": int(plain)}
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=r"mesh axis 'X'|chips; the limit|NAME=VALUE pairs"):
            mesh_type()(f"X={size}")


@given(_DIGITISH)
@settings(max_examples=200, deadline=None, derandomize=True)
def test_a_count_is_a_whole_number_in_ascii_digits(text: str) -> None:
    plain = text.strip()
    digits = plain.isascii() and plain.lstrip("-").isdigit() and plain.count("-") <= 1 and plain[:1] != "+"
    if digits and 1 <= int(plain) <= 10_000:
        assert count("steps")(text) == int(plain)
        return
    with pytest.raises(argparse.ArgumentTypeError, match="expected a whole number"):
        count("steps")(text)
