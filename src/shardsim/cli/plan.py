"""``shardsim plan``: the planner on the command line.

The options are :func:`~shardsim.planner.plan`'s: ``--model`` (a preset) or ``--hf-config`` (a
Hugging Face ``config.json``, :func:`~shardsim.models.hf.from_hf_config`), ``--hardware``,
``--chips``, ``--batch-tokens`` (``16M`` is 16 x 2**20 tokens, as Llama 3 counts its 16M
batch; ``K`` and ``G`` alike), ``--seq``, ``--fix tp=8,pp=16`` (plan fields held fixed),
``--allow dp,zero,tp,sp,pp`` (the parallelisms that may be used), ``--headroom``,
``--efficiency``, ``--policy`` (a byte policy), ``--window``, ``--top``; ``--json`` prints
every figure; ``--emit megatron`` (``deepspeed``, ``torchtitan``) the best plan as Megatron-LM's
flags (a DeepSpeed JSON configuration, a torchtitan TOML). A counter runs on
stderr while it searches, when stderr is a terminal. Errors are one line (exit code 2).

>>> import argparse
>>> p = argparse.ArgumentParser()
>>> add_plan_arguments(p)
>>> cli_plan(p.parse_args(["--model", "gpt-tiny", "--hardware", "h100", "--chips", "2",
...                        "--batch-tokens", "64", "--seq", "16", "--fix", "zero=0,recompute=none", "--top", "1"]))
... # doctest: +ELLIPSIS
gpt-tiny on 2 h100, 64 tokens per step (4 x 16): ...
#  plan ...
1  ...
...
0
"""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

from ..cost.defaults import HARDWARE
from ..cost.units import token_count  # the library reads batch_tokens="16M" with it too
from ..errors import CommandLineError
from ..frameworks.deepspeed import to_deepspeed
from ..frameworks.launch import Launch
from ..frameworks.megatron import to_megatron
from ..frameworks.torchtitan import to_torchtitan
from ..models.hf import from_hf_config
from ..models.presets import names as model_names
from ..planner.search import plan
from ..planner.space import FIXABLE, PARALLELISMS
from .args import count, key_values
from .framework import subcommand


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``shardsim plan``."""
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help=f"a model preset ({', '.join(model_names()[:4])}, ...)")
    which.add_argument("--hf-config", help="a Hugging Face config.json (or its folder) instead of a preset")
    parser.add_argument("--hardware", help=f"a hardware preset (default {HARDWARE})")
    parser.add_argument("--chips", type=count("cost_chips"), required=True, help="chips in the cluster")
    parser.add_argument("--batch-tokens", type=token_count, required=True, help="global batch in tokens (e.g. 16M)")
    parser.add_argument("--seq", type=count("batch"), help="sequence length (default the model's)")
    parser.add_argument("--fix", type=key_values, default={}, help="plan fields held fixed, e.g. tp=8,pp=16,zero=1")
    parser.add_argument("--allow", help=f"parallelisms that may be used (default {','.join(PARALLELISMS)})")
    parser.add_argument("--headroom", type=float, default=0.0, help="fraction of each chip's memory left free")
    parser.add_argument("--efficiency", choices=("ideal", "calibrated"), default="calibrated")
    parser.add_argument("--policy", help="the step's byte policy (default: bf16, fp32 Adam)")
    parser.add_argument("--window", type=float, default=0.15, help="keep plans within this fraction of the best")
    parser.add_argument("--top", type=count("columns"), default=10, help="rows to print (default 10)")
    parser.add_argument("--json", action="store_true", help="print every figure as JSON")
    parser.add_argument(
        "--zero-bubble", action="store_true", help="search the zero-bubble schedules (zb-h1, zb-h2) too"
    )
    parser.add_argument(
        "--emit",
        choices=("megatron", "deepspeed", "torchtitan"),
        help="also print the best plan as that framework's configuration",
    )


@subcommand(
    "plan", "the fastest plans of a model on a cluster that fit, ranked and explained", configure=add_plan_arguments
)
def cli_plan(args: argparse.Namespace) -> int:
    """Run ``shardsim plan``: the ranked table, why the best wins, the rejected families."""
    options: dict[str, Any] = {k: _value(k, v) for k, v in args.fix.items()}
    if args.allow is not None:
        options["allow"] = _allowed(args.allow)
    if args.zero_bubble:
        options["zero_bubble"] = True
    hardware = HARDWARE if args.hardware is None else args.hardware
    model = args.model if args.hf_config is None else from_hf_config(args.hf_config, seq=args.seq)
    table = plan(
        model, hardware, args.chips, args.batch_tokens, args.seq, efficiency=args.efficiency,
        window=args.window, headroom=args.headroom, policy=args.policy, **options,
    )  # fmt: skip
    if args.hardware is None:
        table.defaults = {"hardware": HARDWARE, **table.defaults}
    if args.json:
        print(table.to_json(args.top))
    else:
        print(table.text(args.top))
    if args.emit is not None:
        best = table.best
        launch = Launch(best.plan, best.candidate.micro, best.candidate.batch, table.seq)
        if args.emit == "megatron":
            print(shlex.join(to_megatron(launch)))
        elif args.emit == "deepspeed":
            print(json.dumps(to_deepspeed(launch)))
        else:
            print(to_torchtitan(launch), end="")
    return 0


def _allowed(text: str) -> tuple[str, ...]:
    """``--allow``'s parallelisms; an empty list is refused (it does not mean every one).

    >>> _allowed("dp, tp")
    ('dp', 'tp')
    """
    allowed = tuple(a.strip() for a in text.split(",") if a.strip())
    if not allowed:
        raise CommandLineError(
            f"--allow {text!r} names no parallelism; list the ones the plans may use, e.g. --allow dp,tp "
            f"(or leave --allow out for all of {','.join(PARALLELISMS)})"
        )
    return allowed


def _value(key: str, text: str) -> Any:
    """A ``--fix`` value: whole numbers for degrees, on/off for ``sp``, words for the rest."""
    if key not in FIXABLE:
        raise CommandLineError(f"--fix {key}: not a plan field the planner fixes; use one of {', '.join(FIXABLE)}")
    if key in ("schedule", "recompute", "cp_method", "attention"):
        return text
    if key == "sp":
        if text.lower() not in ("true", "false", "1", "0", "on", "off"):
            raise CommandLineError(f"--fix sp={text}: sequence parallelism is on or off (sp=true, sp=false)")
        return text.lower() in ("true", "1", "on")
    try:
        return int(text)
    except ValueError:
        raise CommandLineError(f"--fix {key}={text}: expected a whole number") from None


__all__ = ["add_plan_arguments", "cli_plan", "token_count"]
