"""The command line under hostile input: never a traceback, one line on stderr and exit 2 for
every bad invocation, 130 for Ctrl-C, bounded loops and no allocation the host cannot hold.

Every invocation runs in-process through ``cli.main(argv)`` with stdout and stderr captured.
"""

from __future__ import annotations

import random
import re
import time
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli_cases import random_case
from fuzz_budget import budget
from shardsim import cli, host, strategies
from shardsim.strategies import demo

GiB = 2**30


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str) -> None:
    assert code == 2, (code, err)
    assert "Traceback" not in err and "internal error" not in err, err
    assert len(err.splitlines()) == 1 and re.match(r"shardsim( \w+)?: error: \S", err), err
    assert out == ""


# -- each invalid invocation the campaign found, and its message --------------------------------
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--seed", "-1"], r"argument --seed: expected a seed from 0 to 4,294,967,295, got -1"),
        (["demo", "--seed", "4294967296"], r"expected a seed from 0"),
        (
            ["demo", "--mesh", "X=²"],
            r"argument --mesh: mesh axis 'X' needs a whole-number size written in digits, "
            r"got '²'",
        ),
        (["demo", "--mesh", "X=+2"], r"argument --mesh: mesh axis 'X' needs a whole-number size written in digits"),
        (["estimate", "--mesh", "X=+2"], r"argument --mesh: mesh axis 'X' needs a whole-number size written in digits"),
        (["estimate", "--mesh", "X=1_6"], r"written in digits, got '1_6'"),
        (["estimate", "--mesh", "X=١٦"], r"written in digits, got '١٦'"),
        (["demo", "--batch", "+2"], r"argument --batch: expected a whole number, got '\+2'"),
        (["estimate", "--png", ""], r"--png '' is empty; give a file name, e.g. out.png"),
        (["demo", "--chrome-trace", ""], r"--chrome-trace '' is empty; give a file name, e.g. out.json"),
        (["sweep", "--batches", "1:10:nan"], r"with a count from 2 to 1,000"),
        (["sweep", "--batches", "1:10:inf"], r"with a count from 2 to 1,000"),
        (
            ["train", "--reduce-dtype", "complex64"],
            r"argument --reduce-dtype: expected a floating-point dtype, one of "
            r"float16, bfloat16, float32, float64, got 'complex64'",
        ),
        (["train", "--reduce-dtype", "int8"], r"argument --reduce-dtype: expected a floating-point dtype"),
        (["train", "--reduce-dtype", "bool"], r"argument --reduce-dtype: expected a floating-point dtype"),
        (
            ["plan", "--model", "gpt-tiny", "--chips", "2", "--batch-tokens", "64", "--allow", ""],
            r"--allow '' names no parallelism; list the ones the plans may use, e.g. --allow dp,tp",
        ),
        (
            ["plan", "--model", "gpt-tiny", "--chips", "2", "--batch-tokens", "64", "--allow", ","],
            r"--allow ',' names no parallelism",
        ),
        (["demo", "--model", "gpt-tiny", "--json"], r"--json: the MLP demo's option\(s\); --model gpt-tiny walks"),
        (
            ["demo", "--model", "gpt-tiny", "--d-model", "8", "--scheme", "ddp"],
            r"^shardsim demo: error: --scheme, "
            r"--d-model: the MLP demo's option",
        ),
        (["demo", "--model", "gpt-tiny", "--chrome-trace", "t.json"], r"--chrome-trace: the MLP demo's option"),
        (["demo", "--model", "gpt-tiny", "--plan", ""], r"--plan '' is empty; name the plan to walk"),
        (
            ["demo", "--model", "gpt-tiny", "--plan", "dp=1000000"],
            r"--plan dp=1000000 needs 1,000,000 chips; a "
            r"walk-through holds every chip's blocks, at most 4,096",
        ),
        (["demo", "--mesh", "X=-2"], r"mesh axis 'X' needs at least 1 chip, got -2"),
        (["demo", "--mesh", "X=1000000000"], r"'X=1000000000' is 1,000,000,000 chips; the limit is 4,096"),
        (["demo", "--batch", "-16"], r"argument --batch: expected a whole number from 1 to"),
        (["demo", "--batch", "1e9"], r"argument --batch: expected a whole number, got '1e9'"),
        (["demo", "--d-model", "abc"], r"argument --d-model: expected a whole number, got 'abc'"),
        (["demo", "--d-ff", "0"], r"argument --d-ff: expected a whole number from 1 to 16,777,216, got 0"),
        (["demo", "--scheme", ""], r"--scheme '' names no scheme"),
        (
            ["demo", "--scheme", "pp", "--option", "microbatchs=2"],
            r"--option microbatchs: pp has no such option; "
            r"its options: microbatches, schedule",
        ),
        (["demo", "--scheme", "ddp", "--option", "microbatches=2"], r"ddp has no such option; its options: none"),
        (["demo", "--scheme", "pp", "--option", "microbatches=100000"], r"expected a whole number from 1 to 1,024"),
        (["demo", "--nosuch"], r"unrecognized arguments: --nosuch \(see 'shardsim demo --help'\)"),
        (["nosuch"], r"^shardsim: error: argument COMMAND: invalid choice: 'nosuch'"),
        ([], r"the following arguments are required: COMMAND"),
        (["sweep", "--batches", "1:2"], r"--batches '1:2': write lo:hi:count"),
        (["sweep", "--batches", "a,b"], r"'a' is not a whole number"),
        (["sweep", "--batches", "0,64"], r"every batch from 1 to 2\*\*34 tokens per chip, got 0"),
        (["sweep", "--batches", "1:100:100000"], r"with a count from 2 to 1,000"),
        (["sweep", "--batches", "nan:1:3"], r"with 1 <= lo <= hi"),
        (["sweep", "--schemes", ","], r"--schemes ',' names no scheme"),
        (["sweep", "--chips", "1000000000"], r"argument --chips: expected a whole number from 1 to 65,536"),
        (["estimate", "--png", "/nonexistent-shardsim-dir/x.png"], r"the folder '/nonexistent-shardsim-dir' does not"),
        (["estimate", "--png", "/"], r"is a folder; give a file name"),
        (["estimate", "--layers", "100000"], r"argument --layers: expected a whole number from 1 to 1,024"),
        (["estimate", "--width", "5"], r"argument --width: expected a whole number from 20 to 1,000"),
        (["estimate", "--scheme", "fsdp_tp", "--chips", "7", "--hardware", "h100"], r"no X x Y split of 7 chips fits"),
        (["critical", "--d-ff", "-5"], r"argument --d-ff: expected a whole number from 1"),
        (["train", "--steps", "0"], r"argument --steps: expected a whole number from 1 to 10,000, got 0"),
        (["train", "--steps", "100000"], r"from 1 to 10,000, got 100000"),
        (["train", "--layers", "1000"], r"argument --layers: expected a whole number from 1 to 256"),
        (["train", "--lr", "nan"], r"argument --lr: expected a finite number above 0, got 'nan'"),
        (["train", "--lr", "-1"], r"argument --lr: expected a finite number above 0"),
        (["train", "--chips", "0"], r"argument --chips: expected a whole number from 1 to 4,096, got 0"),
    ],
)
def test_bad_invocation_is_one_line_and_exit_2(capsys, argv, message) -> None:
    code, out, err = run(capsys, *argv)
    assert_one_line_error(code, out, err)
    assert re.search(message, err), err


def test_messages_name_flags_not_python_keywords(capsys) -> None:
    code, out, err = run(capsys, "demo", "--scheme", "fsdp_tp", "--mesh", "A=4")
    assert_one_line_error(code, out, err)
    assert "--axes data=AXIS,model=AXIS" in err and "axes={" not in err
    code, out, err = run(capsys, "estimate", "--hardware", "tpu-v5p", "--mesh", "X=65536")
    assert_one_line_error(code, out, err)
    assert "--links X=dcn" in err and "links={" not in err


def test_ctrl_c_exits_130_with_one_line(capsys, monkeypatch) -> None:
    def interrupted(args) -> int:
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "schemes", cli.Subcommand("schemes", "", interrupted))
    code, out, err = run(capsys, "schemes")
    assert (code, out, err) == (130, "", "shardsim: interrupted\n")


def test_an_unexpected_exception_is_still_one_line(capsys, monkeypatch) -> None:
    def broken(args) -> int:
        raise TypeError("unsupported operand")

    monkeypatch.setitem(cli.COMMANDS, "schemes", cli.Subcommand("schemes", "", broken))
    code, _, err = run(capsys, "schemes")
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("shardsim schemes: error: internal error TypeError: unsupported operand")


def test_version(capsys) -> None:
    from shardsim import __version__

    assert run(capsys, "--version") == (0, f"shardsim {__version__}\n", "")


# -- bounded resources ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--batch", "1000000000"],  # 29.8 GiB of In and dOut blocks on 2 chips
        ["demo", "--d-model", "65536", "--d-ff", "65536"],  # 32 GiB of weights before any chip
        ["train", "--d-model", "16384", "--d-ff", "65536", "--layers", "8"],
        ["train", "--batch", "1000000000", "--steps", "1"],
    ],
)
def test_a_run_too_big_for_the_host_is_refused_before_it_allocates(capsys, monkeypatch, argv) -> None:
    monkeypatch.setattr(host, "available_memory", lambda: 4 * GiB)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        code, out, err = run(capsys, *argv)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_one_line_error(code, out, err)
    assert re.search(r"needs about \d+\.\d [GT]iB of host memory and 4\.0 GiB is available", err), err
    assert "shardsim estimate" in err  # the shape-only alternative
    assert peak < 64 * 2**20 and time.perf_counter() - start < 30


def test_the_memory_need_comes_from_the_shape_only_ledger(monkeypatch) -> None:
    """The need checked is the chips' ledger peak plus the host copies. B = 2**27 tokens of
    d_model 4 in float32 is 2 GiB per [B, D] value: ddp on 2 chips holds In and dOut split
    over X and its activations, so the chips alone need more than 4 GiB; the check comes
    before the inputs are drawn."""
    seen: list[int] = []

    def record(need: int, what: str, alternative: str) -> None:
        seen.append(need)
        if len(seen) == 2:  # the ledger's check: stop before any data is drawn
            raise _StopError

    monkeypatch.setattr(demo, "check_host_memory", record)
    with pytest.raises(_StopError):
        cli.run_demo("ddp", batch=2**27, check_memory=True)
    per_value = 2**27 * 4 * 4  # B x D x 4 bytes
    assert seen[0] < seen[1]  # the naive bound (weights and inputs) first, then the ledger's
    assert 2 * per_value < seen[1] < 40 * per_value


class _StopError(Exception):
    pass


def test_default_demo_of_every_scheme_passes(capsys) -> None:
    code, out, err = run(capsys, "demo", "--scheme", "all", "--quiet")
    assert code == 0 and err == ""
    assert len(out.splitlines()) == len(strategies.names())
    assert "dp_ep on Mesh(X=2, Y=2): PASS" in out


# -- the whole class, as a property --------------------------------------------------------------
@budget(40)
@given(st.randoms(use_true_random=False))
def test_any_hostile_invocation_is_one_line_and_exit_2(rng: random.Random) -> None:
    import contextlib
    import io

    kind, argv = random_case(rng)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    assert "Traceback" not in err.getvalue() and "internal error" not in err.getvalue(), (argv, err.getvalue())
    if kind == "valid":
        assert code == 0, (argv, err.getvalue())
    else:
        assert code == 2, (kind, argv, code, out.getvalue()[-300:])
        assert len(err.getvalue().splitlines()) == 1, (argv, err.getvalue())
