"""The command line: ``shardsim demo`` prints the seed's layouts, steps, bytes, memory and checks.

Expected numbers are derived here by hand (the ring formulas, the seed's layouts) or come
from the single-device MLP, never from the code under test.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shardsim import cli, mlp, strategies
from shardsim.array import ShardedArray
from shardsim.collectives import all_reduce
from shardsim.strategies import ddp
from shardsim.strategies.base import Ctx, Scheme, check_mlp_shapes

SRC = Path(__file__).resolve().parents[1] / "src"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def section(out: str, scheme: str) -> str:
    """The part of the demo's output about one scheme."""
    parts = re.split(r"^=+\n(?=\S+ on Mesh)", out, flags=re.M)
    found = [p for p in parts if p.startswith(f"{scheme} on Mesh")]
    assert len(found) == 1, f"no section for {scheme}"
    return found[0]


def steps(text: str, phase: str) -> list[list[str]]:
    """The rows of a phase's step table: ``[#, step, axis, array, layout after, sent, flops]``."""
    block = text.split(f"{phase}:", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in block.splitlines()[2:]:  # the summary line and the header
        cells = re.split(r"\s{2,}", line.strip())
        rows.append(cells)
    return rows


# -- the seed's toy case ------------------------------------------------------------------------
def test_demo_runs_the_seeds_four_schemes_and_passes(capsys) -> None:
    code, out, err = run_cli(capsys, "demo")
    assert code == 0 and err == ""
    for name, mesh in [("ddp", "Mesh(X=2)"), ("fsdp", "Mesh(X=2)"), ("tp", "Mesh(Y=2)"), ("fsdp_tp", "Mesh(X=2, Y=2)")]:
        text = section(out, name)
        assert text.startswith(f"{name} on {mesh}")
        assert "B=2 tokens, d_model=4, d_ff=8, float32" in text
        assert re.search(rf"^  {name}: PASS$", text, re.M)
        assert len(re.findall(r"^  (Out|dIn|dW_in|dW_out) .* PASS$", text, re.M)) == 4
    assert out.rstrip().endswith("all checks PASS")
    assert max(len(line) for line in out.splitlines()) <= 100


def test_demo_prints_the_seeds_starting_layout(capsys) -> None:
    _, out, _ = run_cli(capsys, "demo", "--scheme", "fsdp_tp")
    text = section(out, "fsdp_tp")
    # the seed: "(X0,Y0): token 0, d_model[0:2] · (X0,Y1): token 0, d_model[2:4]" ...
    assert re.search(r"^\s+\(X0,Y0\): token 0, d_model\[0:2\]\s+\(X0,Y1\): token 0, d_model\[2:4\]$", text, re.M)
    assert re.search(r"^\s+\(X1,Y0\): token 1, d_model\[0:2\]\s+\(X1,Y1\): token 1, d_model\[2:4\]$", text, re.M)
    # the weights are quadrants: W_in[D_X, F_Y], W_out[F_Y, D_X]
    assert "W_in[D_X, F_Y] (4, 8)" in text and "W_out[F_Y, D_X] (8, 4)" in text
    assert re.search(r"\(X1,Y0\): d_model\[2:4\], d_ff\[0:4\]", text)
    assert re.search(r"\(X0,Y1\): d_ff\[4:8\], d_model\[0:2\]", text)


def test_demo_tp_replicates_the_batch(capsys) -> None:
    _, out, _ = run_cli(capsys, "demo", "--scheme", "tp")
    text = section(out, "tp")
    assert re.search(r"\(Y0\): tokens\[0:2\], d_model\[0:2\]\s+\(Y1\): tokens\[0:2\], d_model\[2:4\]", text)


def test_demo_prints_the_seeds_six_forward_steps_with_their_bytes(capsys) -> None:
    _, out, _ = run_cli(capsys, "demo", "--scheme", "fsdp_tp")
    text = section(out, "fsdp_tp")
    B, D, F, X, Y, s = 2, 4, 8, 2, 2, 4
    act = (Y - 1) * (B // X) * (D // Y) * s  # AllGather-Y / ReduceScatter-Y of [B_X, D]: 8 B
    weight = (X - 1) * (D // X) * (F // Y) * s  # AllGather-X of a [D, F_Y] quadrant: 32 B
    flops = 2 * (B // X) * D * (F // Y)
    want = [
        ["1", "AllGather", "Y", "In", "[B_X, D]", f"{act} B", "-"],
        ["2", "AllGather", "X", "W_in", "[D, F_Y]", f"{weight} B", "-"],
        ["3", "matmul", "-", "In @ W_in", "[B_X, F_Y]", "-", str(flops)],
        ["4", "AllGather", "X", "W_out", "[F_Y, D]", f"{weight} B", "-"],
        ["5", "matmul", "-", "H_pre @ W_out", "[B_X, D]{U_Y}", "-", str(flops)],
        ["6", "ReduceScatter", "Y", "Out", "[B_X, D_Y]", f"{act} B", "-"],
    ]
    assert steps(text, "Forward") == want
    assert f"Forward: 4 collectives, {2 * act + 2 * weight} B sent and {2 * flops} FLOPs per chip" in text
    backward = [(r[1], r[2], r[3]) for r in steps(text, "Backward") if r[1] != "matmul"]
    assert backward == [
        ("AllGather", "Y", "dOut"),
        ("ReduceScatter", "X", "dW_out"),
        ("AllGather", "X", "W_out"),
        ("AllGather", "Y", "In"),
        ("ReduceScatter", "X", "dW_in"),
        ("AllGather", "X", "W_in"),
        ("ReduceScatter", "Y", "dIn"),
    ]


def test_demo_ddp_forward_is_local_and_backward_all_reduces(capsys) -> None:
    _, out, _ = run_cli(capsys, "demo", "--scheme", "ddp", "--dtype", "float64")
    text = section(out, "ddp")
    assert "Forward: 0 collectives, 0 B sent" in text
    grads = [r for r in steps(text, "Backward") if r[1] == "AllReduce"]
    ar = 2 * (2 - 1) * 4 * 8 * 8 // 2  # 2(X-1)/X of a [F, D] float64 gradient: 256 B
    assert [(r[2], r[3], r[5]) for r in grads] == [("X", "dW_out", f"{ar} B"), ("X", "dW_in", f"{ar} B")]


def test_demo_memory_table_per_chip(capsys) -> None:
    _, out, _ = run_cli(capsys, "demo", "--scheme", "fsdp", "ddp")
    s, D, F, X = 4, 4, 8, 2
    rows = {}
    for name in ("ddp", "fsdp"):
        block = section(out, name).split("Peak memory per chip", 1)[1].split("\n\n", 1)[0].splitlines()
        header = re.split(r"\s{2,}", block[1].strip())
        rows[name] = dict(zip(header, re.split(r"\s{2,}", block[2].strip())))
        assert rows[name]["chip"] == "each of 2"
    assert rows["ddp"]["params"] == f"{2 * D * F * s} B"  # the full model on every chip
    assert rows["fsdp"]["params"] == f"{2 * D * F * s // X + D * F * s} B"  # slices + one gathered weight
    assert rows["fsdp"]["grads"] == f"{2 * D * F * s // X} B"


def test_demo_bigger_mesh_and_sizes(capsys) -> None:
    code, out, _ = run_cli(
        capsys, "demo", "--scheme", "fsdp_tp", "--mesh", "X=2,Y=4", "--batch", "8", "--d-model", "16", "--d-ff", "32"
    )
    assert code == 0
    text = section(out, "fsdp_tp")
    assert text.startswith("fsdp_tp on Mesh(X=2, Y=4)")
    B, D, F, X, Y, s = 8, 16, 32, 2, 4, 4
    rows = {r[0]: r for r in steps(text, "Forward")}
    assert rows["1"][5] == f"{(Y - 1) * (B // X) * (D // Y) * s} B"
    assert rows["2"][5] == f"{(X - 1) * (D // X) * (F // Y) * s} B"
    assert "(X1,Y3): tokens[4:8], d_model[12:16]" in text


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_demo_dtypes_and_activations_pass(capsys, dtype, activation) -> None:
    code, out, _ = run_cli(capsys, "demo", "--dtype", dtype, "--activation", activation, "--quiet", "--seed", "3")
    assert code == 0
    assert out.splitlines() == [
        "ddp on Mesh(X=2): PASS",
        "fsdp on Mesh(X=2): PASS",
        "tp on Mesh(Y=2): PASS",
        "fsdp_tp on Mesh(X=2, Y=2): PASS",
    ]


def test_demo_errors_are_independent_of_the_code_under_test(capsys) -> None:
    """The reported max error equals |scheme - single-device MLP| computed here."""
    run = cli.run_demo("fsdp_tp", activation="relu", dtype="float64", seed=5)
    params = {k: run.inputs[k] for k in ("w_in", "w_out")}
    x, dout = run.inputs["x"], run.inputs["dout"]
    want = {
        "Out": mlp.forward(params, x, "relu"),
        **{cli.grad_name(k): v for k, v in mlp.backward(params, x, dout, "relu").items()},
    }
    got = {"Out": run.result.out, **{cli.grad_name(k): v for k, v in run.result.grads.items()}}
    for name, err, _, ok in run.checks:
        assert ok
        assert err == pytest.approx(float(np.abs(got[name] - want[name]).max()), abs=0)


# -- any registered scheme ----------------------------------------------------------------------
def _replica_layouts(ctx: Ctx) -> dict[str, str]:
    R = ctx.axis("replica")
    return {"x": f"[B_{R}, D]", "w_in": "[D, F]", "w_out": "[F, D]", "out": f"[B_{R}, D]"}


def _replica_backward(ctx, saved, dout, params):
    R = ctx.axis("replica")
    h, x = saved["H"], saved["In"]
    dw_out = all_reduce(h.T @ dout, R, label="dW_out")
    dh = dout @ params["w_out"].T
    dw_in = all_reduce(x.T @ dh, R, label="dW_in")
    return (dh @ params["w_in"].T).named("dIn"), {"w_in": dw_in, "w_out": dw_out}


def _doubled_forward(ctx, x: ShardedArray, params):
    out, saved = ddp.forward(ctx, x, params)
    return (out + out).named("Out"), saved  # a wrong answer, for the check to catch


@pytest.fixture
def extra_schemes():
    added = [
        Scheme(
            "replica_test",
            roles=("replica",),
            layouts=_replica_layouts,
            forward=lambda ctx, x, p: ((x @ p["w_in"]) @ p["w_out"], {"In": x, "H": x @ p["w_in"]}),
            backward=_replica_backward,
            check_shapes=check_mlp_shapes,
            summary="a data-parallel scheme whose axis plays a role named 'replica'",
        ),
        Scheme(
            "broken_test",
            roles=("data",),
            layouts=ddp.layouts,
            forward=_doubled_forward,
            backward=ddp.backward,
            summary="ddp whose forward doubles its output",
        ),
    ]
    for s in added:
        strategies.register(s)
    yield added
    for s in added:
        strategies.registry._REGISTRY.pop(s.name, None)


def test_demo_runs_a_registered_scheme_with_its_own_role(capsys, extra_schemes) -> None:
    code, out, _ = run_cli(capsys, "demo", "--scheme", "replica_test")
    assert code == 0
    text = section(out, "replica_test")
    assert text.startswith("replica_test on Mesh(R=2)  (replica=R)")
    assert "(R0): token 0, d_model[0:4]   (R1): token 1, d_model[0:4]" in text
    assert [(r[1], r[2], r[3]) for r in steps(text, "Backward") if r[1] != "matmul"] == [
        ("AllReduce", "R", "dW_out"),
        ("AllReduce", "R", "dW_in"),
    ]
    code, out, _ = run_cli(capsys, "schemes")
    assert re.search(r"^replica_test\s+replica\s+a data-parallel scheme", out, re.M)


def test_a_wrong_scheme_fails_its_check_and_the_exit_code(capsys, extra_schemes) -> None:
    code, out, _ = run_cli(capsys, "demo", "--scheme", "ddp", "broken_test")
    assert code == 1
    text = section(out, "broken_test")
    assert re.search(r"^  Out\s+\S+\s+\S+\s+FAIL$", text, re.M)
    assert re.search(r"^  dW_in\s+\S+\s+\S+\s+PASS$", text, re.M)  # the backward is still right
    assert "broken_test: FAIL" in text and "ddp: PASS" in section(out, "ddp")
    assert out.rstrip().endswith("FAIL: broken_test")


# -- bad options: the library's message on stderr, exit 2, no traceback -----------------------
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mesh", "X=3"], r"ddp: cannot lay out In as \[B_X, D\]: dimension B of size 2 does not divide"),
        (["--d-model", "5"], r"cannot lay out W_in as \[D_X, F\]: dimension D of size 5 does not divide"),
        (["--scheme", "zero9"], r"unknown scheme 'zero9'; choose one of \['ddp', 'fsdp', 'tp', 'fsdp_tp'"),
        (["--mesh", "A=4", "--scheme", "fsdp_tp"], r"fsdp_tp needs a mesh axis for each of its roles"),
        (["--mesh", "X=2,Y=0"], r"argument --mesh: mesh axis 'Y' needs at least 1 chip, got 0"),
        (["--activation", "tanh"], r"unknown activation 'tanh'"),
        (["--axes", "pipe=P"], r"--axes names role\(s\) \['pipe'\] that none of"),
        (["--mesh", "X2"], r"argument --mesh: expected NAME=VALUE pairs"),
        (["--batch", "0"], r"argument --batch: expected a whole number from 1 to 17,179,869,184, got 0"),
        (["--dtype", "int8"], r"argument --dtype: invalid choice: 'int8'"),
    ],
)
def test_bad_options_exit_2_with_the_message(capsys, argv, message) -> None:
    code, out, err = run_cli(capsys, "demo", *argv)
    assert code == 2
    assert out == ""  # nothing half-printed: every scheme runs before any output
    assert re.search(message, err), err
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1 and err.startswith("shardsim demo: error:")


def test_no_command_is_a_usage_error(capsys) -> None:
    code, _, err = run_cli(capsys)
    assert code == 2 and "required: COMMAND" in err


def test_help_lists_the_registered_commands(capsys) -> None:
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    for name in ("demo", "schemes"):
        assert re.search(rf"^\s+{name}\s+\S", out, re.M)


def test_a_new_subcommand_is_one_registered_function(capsys) -> None:
    def configure(p):
        p.add_argument("--chips", type=cli.positive_int, default=8)

    @cli.subcommand("count_test", "count chips", configure=configure)
    def count(args) -> int:
        print(f"{args.chips} chips")
        return 0 if args.chips % 2 == 0 else 1

    try:
        assert run_cli(capsys, "count_test", "--chips", "4")[:2] == (0, "4 chips\n")
        assert run_cli(capsys, "count_test", "--chips", "3")[0] == 1
        assert run_cli(capsys, "count_test", "--chips", "-1")[0] == 2
    finally:
        cli.COMMANDS.pop("count_test")


def test_python_dash_m_shardsim(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "shardsim", "demo"], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.startswith("=" * 96 + "\nddp on Mesh(X=2)  (data=X)\n")
    assert re.findall(r"^  (\w+): PASS$", proc.stdout, re.M) == ["ddp", "fsdp", "tp", "fsdp_tp"]
    assert "(X0,Y0): token 0, d_model[0:2]" in proc.stdout


def test_readme_excerpt_is_real_output(capsys) -> None:
    readme = (SRC.parent / "README.md").read_text(encoding="utf-8")
    excerpt = readme.split("## What `shardsim demo` prints", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    _, out, _ = run_cli(capsys, "demo")
    lines = out.splitlines()
    shown = [line for line in excerpt.splitlines() if line.strip() not in ("$ shardsim demo", "...", "")]
    assert len(shown) > 20
    missing = [line for line in shown if line not in lines]
    assert not missing, f"README lines not in the output of shardsim demo: {missing}"


# -- the cost model's commands -----------------------------------------------------------------
def test_critical_prints_the_scaling_books_v5p_fsdp_threshold(capsys) -> None:
    """SB training chapter: FSDP on one v5p ICI axis is compute-bound above C/W = 2,550 tokens/chip."""
    assert cli.main(["critical", "--scheme", "fsdp", "--hardware", "tpu-v5p", "--chips", "16"]) == 0
    assert "compute-bound above 2550.0 tokens per chip" in capsys.readouterr().out


def test_estimate_prints_the_step_breakdown(capsys) -> None:
    argv = ["estimate", "--hardware", "tpu-v5p", "--mesh", "X=16,Y=8", "--scheme", "fsdp_tp"]
    argv += ["--batch", "65536", "--d-model", "8192", "--d-ff", "32768", "--layers", "2"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "fsdp_tp on Mesh(X=16, Y=8) (tpu-v5p), B=65536 tokens (512/chip)" in out
    assert re.search(r"MFU \d+\.\d%, (compute|communication)-bound", out)


def test_estimate_breakdown_is_a_table_of_every_collective(capsys) -> None:
    """Axis names as long as ``model`` keep their column; counts are per layer as traced."""
    argv = ["estimate", "--model", "llama2-7b", "--plan", "dp=2,tp=2,pp=2", "--hardware", "h100"]
    argv += ["--chips", "8", "--batch-tokens", "16K", "--seq", "4096", "--breakdown"]
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("phase"))
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[start:]]
    assert rows[0] == ["phase", "op", "axes", "label", "count", "ms", "exposed ms", "limit"]
    assert all(len(r) == 8 for r in rows)
    counts = {(r[0], r[2], r[3]): int(r[4]) for r in rows[1:]}
    assert counts["forward", "model", "Attn out"] == 32  # one TP AllReduce per layer, 32 layers
    assert counts["backward", "data", "dlayers.mlp.w_up"] == 32  # one gradient AllReduce per layer's weight


def test_fsdp_tp_without_a_mesh_takes_the_fastest_split(capsys) -> None:
    from shardsim.cost import best_split

    argv = ["estimate", "--scheme", "fsdp_tp", "--hardware", "tpu-v5p", "--chips", "64", "--per-chip-batch", "512"]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    best = best_split("tpu-v5p", 64 * 512, 8192, 32768, chips=64)
    assert f"the fastest split is {best.mesh}" in out and f"fsdp_tp on {best.mesh} (tpu-v5p)" in out
    assert best.mesh.shape != (64, 1)  # at 512 tokens per chip plain FSDP is communication-bound
    # the v5p has no measured matmul curve: one line saying so, not Python's file and source line
    assert err.splitlines() == [line for line in err.splitlines() if line.startswith("shardsim estimate: warning:")]
    assert "has no measured efficiency for matmul" in err


def test_sweep_lists_every_scheme_and_batch(capsys) -> None:
    assert cli.main(["sweep", "--hardware", "h100", "--chips", "8", "--batches", "1024,65536"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [(s, b) for s in ("ddp", "fsdp", "tp", "fsdp_tp") for b in ("1024", "65536")]


def test_estimate_bad_mesh_is_a_clean_error(capsys) -> None:
    assert cli.main(["estimate", "--mesh", "X=sixteen"]) == 2
    err = capsys.readouterr().err
    assert "argument --mesh: mesh axis 'X' needs a whole-number size written in digits, got 'sixteen'" in err


def test_train_runs_every_stage_and_matches_one_device(capsys) -> None:
    assert cli.main(["train", "--steps", "2", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in ("ddp", "zero1", "zero2", "zero3", "tp", "fsdp_tp"):
        assert any(line.startswith(name) and line.rstrip().endswith("PASS") for line in lines), name


@pytest.mark.parametrize(
    "name", ["zero1", "zero2", "zero3", "tp_ln", "tp_sp", "pp", "pp_interleaved", "dp_pp", "dp_pp_tp", "ep", "dp_ep"]
)
def test_demo_runs_every_registered_scheme(capsys, name: str) -> None:
    """Each scheme's demo checks it against its own single-device reference."""
    assert cli.main(["demo", "--scheme", name, "--batch", "8", "--quiet"]) == 0
    assert capsys.readouterr().out.rstrip().endswith(": PASS")


def test_run_demo_takes_a_scheme_that_is_not_registered(extra_schemes) -> None:
    mine = dataclasses.replace(extra_schemes[0], name="unregistered_test")
    r = cli.run_demo(mine, check_memory=True)  # the memory check's shape-only run uses the scheme given
    assert r.ok and r.result.scheme == "unregistered_test" and "unregistered_test" not in strategies.names()


def test_demo_model_walks_a_transformer_block_through_each_plan(capsys) -> None:
    from shardsim.transformer.demo import walk

    assert cli.main(["demo", "--model", "llama-tiny", "--plan", "tp=2", "--plan", "dp=2,zero=3"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == (walk("llama-tiny", "tp=2") + "\n\n" + walk("llama-tiny", "dp=2,zero=3")).strip()
    assert out.count(": PASS") == 2


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["demo", "--model", "gpt3-175b"], "shape-only with 'shardsim estimate'"),
        (["demo", "--plan", "tp=2"], "give --model too"),
        (["demo", "--model", "nope"], "no model preset 'nope'"),
        (["demo", "--model", "gpt-tiny", "--plan", "tp=3"], "does not divide"),
    ],
)
def test_demo_model_refuses_in_one_line(capsys, argv, words) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
