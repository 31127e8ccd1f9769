"""Hostile inputs for the model-level API, shared by the property test
(``tests/test_hostile_model_campaign.py``) and the hand-run campaign (``benchmarks/campaign_model.py``).

Each call of ``CALLS`` has a ``draw(rng)`` that makes one input *recipe* (plain, printable data:
a near-valid configuration, plan and batch with one thing made hostile, or a random valid one)
and a ``run(recipe)`` that builds the objects, calls the public function and checks the value
it returns against an independent answer. :func:`run_case` classifies the outcome as
``tests/hostile_inputs.py`` does: ``"ok"`` (a value the independent check agrees with),
``"documented"`` (a :class:`~shardsim.ShardsimError` with a message), ``"wrong"`` (a value it
disagrees with, or an input the documented rules refuse that was accepted), ``"undocumented"``
(any other exception) or ``"hang"`` (still running after ``LIMIT_S`` seconds).

The independent answers: for ``run_model`` and ``Trainer.for_model`` the single-device
reference (:mod:`shardsim.models.reference`: loss and gradients, NaN where its are; the
trainer's first update from those gradients by the optimizer's formula); for
``TransformerConfig`` the fields as given and a closed-form parameter count; for ``Plan`` and
``Plan.parse`` the fields as given (a parser of the documented grammar) and
``Plan.parse(str(p)) == p``; for ``cost.estimate`` and the planner, finite, positive and
self-consistent figures (and where the planner and the estimate model the same step, equal
ones); for the command line, exit 0 or 2 with one line on stderr and no traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import random
import re
import signal
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import shardsim
from hostile_inputs import HOSTILE
from shardsim import cli, cost
from shardsim.dtypes import PRECISION_DTYPES as PRECISION_NAMES
from shardsim.models import TransformerConfig, reference
from shardsim.plans import ATTENTION, CP_METHODS, RECOMPUTE, SCHEDULES, Plan

OUTCOMES = ("ok", "documented", "wrong", "undocumented", "hang")
LIMIT_S = 10

Recipe = dict[str, Any]
Verdict = bool | str  # True: agrees; False or a reason: does not
Check = Callable[[Any], Verdict]

# -- hostile values ------------------------------------------------------------------------------
BIG = [2**31, 2**63, 10**30, 10**400]
INT_SPECIAL = [0, -1, -(2**63), 1.0, 2.0, 2.5, True, False, np.int64(2), np.int32(4), "2", 3, 7, *BIG]
FLOAT_SPECIAL = [0, 0.0, -0.0, -1.0, math.nan, math.inf, -math.inf, 1e-320, 1e308, True, False, "0.1", 10**400]
FLOAT_SPECIAL += [np.float32(0.5), np.float64(math.nan), 1j]
WORD_SPECIAL = ["", " ", "GELU", "relu", "gelu ", "none", "None", "flash ", "ring", "1f1b", "FP32", "é", "a b"]
WORD_SPECIAL += ["data", "model", "x" * 300, "a,b", "a=b", "5"]


def hostile(rng: random.Random, special: list[Any]) -> Any:
    """A hostile value: one for this kind of field half the time, any of ``HOSTILE`` the rest."""
    pool = special if special and rng.random() < 0.5 else HOSTILE
    return pool[rng.randrange(len(pool))]


def fmt(value: Any, limit: int = 60) -> str:
    """A short repr for reports (long strings and arrays cut)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- TransformerConfig -----------------------------------------------------------------------------
CFG_INTS = ("layers", "d_model", "heads", "d_ff", "vocab", "seq")
CFG_SPECIAL: dict[str, list[Any]] = {
    **{f: INT_SPECIAL for f in CFG_INTS},
    "kv_heads": [*INT_SPECIAL, None],
    "head_dim": [*INT_SPECIAL, None, 5],
    "mlp": WORD_SPECIAL,
    "norm": [*WORD_SPECIAL, "LayerNorm", "rms"],
    "position": [*WORD_SPECIAL, "RoPE", "alibi"],
    "rope_theta": FLOAT_SPECIAL,
    "bias": [0, 1, "True", None, np.bool_(True), 1.0],
    "tie_embeddings": [0, 1, "False", None, np.bool_(False)],
    "dropout": [*FLOAT_SPECIAL, 0.5, 1.0, 0.999999, 1 - 1e-17],
    "norm_eps": FLOAT_SPECIAL,
    "experts": [*INT_SPECIAL, 1, 4],
    "top_k": [*INT_SPECIAL, 1, 5],
    "capacity_factor": [*FLOAT_SPECIAL, None, 1.25, 1e-300],
}


def valid_config_fields(rng: random.Random, *, d_models: tuple[int, ...] = (8, 12, 16)) -> dict[str, Any]:
    """The fields of a random small valid config (d_model 8-16, 1-2 layers, seq 4-8, vocab ~11)."""
    d = rng.choice(d_models)
    heads = rng.choice([h for h in (1, 2, 4) if d % h == 0])
    fields: dict[str, Any] = dict(
        layers=rng.choice((1, 2)), d_model=d, heads=heads, d_ff=rng.choice((8, 12, 16, 32)),
        vocab=rng.choice((11, 12, 16)), seq=rng.choice((4, 8)),
    )  # fmt: skip
    if rng.random() < 0.4:
        fields["kv_heads"] = rng.choice([k for k in (1, 2, 4) if heads % k == 0])
    position = rng.choice(("learned", "rope", "none"))
    if position == "rope" and (d // heads) % 2:
        position = "learned"
    fields.update(position=position, norm=rng.choice(("layernorm", "rmsnorm")))
    fields.update(bias=rng.random() < 0.3, tie_embeddings=rng.random() < 0.3)
    if rng.random() < 0.15:
        fields.update(experts=rng.choice((2, 4)), top_k=rng.choice((1, 2)))
        if rng.random() < 0.5:
            fields["capacity_factor"] = rng.choice((1.0, 1.25, 2.0))
    else:
        fields["mlp"] = rng.choice(("gelu", "swiglu"))
    if rng.random() < 0.15:
        fields["dropout"] = 0.1
    return fields


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _same(got: Any, want: Any) -> bool:
    return got is want or (type(got) is type(want) and got == want)


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def config_is_valid(f: Mapping[str, Any]) -> bool:
    """The documented rules of ``TransformerConfig`` (its docstring and docs/transformer.md),
    written again: what an accepted config must satisfy (integers are Python ints, numbers are
    finite reals and not booleans, flags are booleans)."""
    g = {x.name: x.default for x in dataclasses.fields(TransformerConfig) if x.default is not dataclasses.MISSING}
    g.update(f)
    if not all(_whole(g[k]) and g[k] >= 1 for k in CFG_INTS):
        return False
    kv, hd = g["kv_heads"], g["head_dim"]
    if kv is not None and not (_whole(kv) and kv >= 1 and g["heads"] % kv == 0):
        return False
    if hd is not None and not (_whole(hd) and hd >= 1):
        return False
    if hd is None and g["d_model"] % g["heads"]:
        return False
    head = g["d_model"] // g["heads"] if hd is None else hd
    if g["mlp"] not in ("gelu", "swiglu") or g["norm"] not in ("layernorm", "rmsnorm"):
        return False
    if g["position"] not in ("learned", "rope", "none") or (g["position"] == "rope" and head % 2):
        return False
    for k in ("rope_theta", "norm_eps"):
        if not (_real(g[k]) and 0 < g[k] < math.inf):
            return False
    if not (_real(g["dropout"]) and 0 <= g["dropout"] < 1):
        return False
    if not all(isinstance(g[k], bool) for k in ("bias", "tie_embeddings")):
        return False
    e, k, c = g["experts"], g["top_k"], g["capacity_factor"]
    if not (_whole(e) and e >= 0):
        return False
    if e and not (_whole(k) and 1 <= k <= e and g["mlp"] == "gelu"):
        return False
    return c is None or (e > 0 and _real(c) and 0 < c < math.inf)


def param_count(cfg: TransformerConfig) -> int:
    """The parameter count in closed form (per layer: two norms, attention, MLP or experts)."""
    d, f, v, e = cfg.d_model, cfg.d_ff, cfg.vocab, cfg.experts
    nh, kh = cfg.heads * cfg.hd, cfg.n_kv * cfg.hd
    norm = d * (2 if cfg.norm == "layernorm" else 1)
    attn = 2 * d * nh + 2 * d * kh + ((nh + 2 * kh + d) if cfg.bias else 0)
    if e:
        mlp = d * e + 2 * e * d * f
    elif cfg.mlp == "gelu":
        mlp = 2 * d * f + ((f + d) if cfg.bias else 0)
    else:
        mlp = 3 * d * f + ((2 * f + d) if cfg.bias else 0)
    outside = v * d + (cfg.seq * d if cfg.position == "learned" else 0) + norm + (0 if cfg.tie_embeddings else d * v)
    return outside + cfg.layers * (2 * norm + attn + mlp)


def draw_config(rng: random.Random) -> Recipe:
    fields = valid_config_fields(rng)
    if rng.random() < 0.1:
        return {"fields": fields}
    key = rng.choice(list(CFG_SPECIAL))
    fields[key] = hostile(rng, CFG_SPECIAL[key])
    return {"fields": fields, "mutate": (key, fields[key])}


def run_config(r: Recipe) -> tuple[Any, Check]:
    fields = r["fields"]

    def check(cfg: TransformerConfig) -> Verdict:
        if not config_is_valid(fields):
            key, value = r.get("mutate") or ("?", None)
            return f"accepted {key}={fmt(value)} ({type(value).__name__}), which the documented rules refuse"
        if not all(_same(getattr(cfg, k), v) for k, v in fields.items()):
            return "a field does not read back as given"
        return cfg.layers > 4096 or cfg.param_count() == param_count(cfg) or "param_count() is not the closed form"

    return TransformerConfig(**fields), check


# -- Plan ------------------------------------------------------------------------------------------
PLAN_DEGREES = ("dp", "tp", "pp", "ep", "cp", "microbatches", "virtual_stages")
AXES = ("data_axis", "model_axis", "pipe_axis", "expert_axis", "context_axis")
PLAN_SPECIAL: dict[str, list[Any]] = {
    **{f: INT_SPECIAL for f in PLAN_DEGREES},
    "zero": [*INT_SPECIAL, 4, 3, np.int64(1)],
    "sp": [0, 1, "True", None, np.bool_(True)],
    "cp_balanced": [0, 1, "false", None, np.bool_(False)],
    "schedule": [*WORD_SPECIAL, "GPipe", "interleaved", "gpipe"],
    "cp_method": [*WORD_SPECIAL, "ALL_GATHER", "allgather", "all-gather"],
    "attention": [*WORD_SPECIAL, "Flash", "standard"],
    "recompute": [*WORD_SPECIAL, "full ", "selective"],
    "precision": [*WORD_SPECIAL, "bf16", "int8", None, "mixed"],
    **{a: [*WORD_SPECIAL, "X", "Y", "pipe", "context", "expert", "ab1", "٢", 5, None] for a in AXES},
}


def valid_plan_fields(rng: random.Random) -> dict[str, Any]:
    """A random valid Plan's fields: degrees 1, 2 (or 4), at most 8 chips."""
    f: dict[str, Any] = {}
    chips = 1
    for k in ("dp", "tp", "pp", "cp", "ep"):
        n = rng.choice((1, 1, 2, 2, 4))
        if chips * n <= 8:
            f[k] = n
            chips *= n
    f["zero"] = rng.choice((0, 0, 1, 2, 3))
    if f.get("tp", 1) > 1 and rng.random() < 0.5:
        f["sp"] = True
    if f.get("pp", 1) > 1:
        f["schedule"] = rng.choice(SCHEDULES)
        f["microbatches"] = rng.choice((1, 2, 4))
        if f["schedule"] == "interleaved" and rng.random() < 0.5:
            f["virtual_stages"] = 2
    f.update(cp_method=rng.choice(CP_METHODS), cp_balanced=rng.random() < 0.8, attention=rng.choice(ATTENTION))
    f["recompute"] = rng.choice(RECOMPUTE)
    if rng.random() < 0.2:
        f["precision"] = rng.choice(sorted(PRECISION_NAMES))
    if rng.random() < 0.2:
        f[rng.choice(AXES)] = rng.choice(("X", "Y", "Z9", "rows"))
    return f


def plan_is_valid(f: Mapping[str, Any]) -> bool:
    """The documented rules of ``Plan`` (its docstring), written again; axis names are what
    ``Plan.parse`` reads back (letters and digits), distinct among the parallelisms in use."""
    g = {x.name: x.default for x in dataclasses.fields(Plan)}
    g.update(f)
    if not all(_whole(g[k]) and g[k] >= 1 for k in PLAN_DEGREES):
        return False
    if not (_whole(g["zero"]) and g["zero"] in (0, 1, 2, 3)):
        return False
    if not all(isinstance(g[k], bool) for k in ("sp", "cp_balanced")):
        return False
    words = (("schedule", SCHEDULES), ("cp_method", CP_METHODS), ("attention", ATTENTION), ("recompute", RECOMPUTE))
    if any(g[k] not in choices or not isinstance(g[k], str) for k, choices in words):
        return False
    if g["precision"] is not None and (not isinstance(g["precision"], str) or g["precision"] not in PRECISION_NAMES):
        return False
    if (g["sp"] and g["tp"] == 1) or (g["virtual_stages"] > 1 and g["schedule"] != "interleaved"):
        return False
    if not all(isinstance(g[a], str) and g[a].isalnum() for a in AXES):
        return False
    used = [g[a] for a, d in zip(AXES, ("dp", "tp", "pp", "ep", "cp"), strict=True) if g[d] > 1]
    return len(used) == len(set(used))


def draw_plan(rng: random.Random) -> Recipe:
    fields = valid_plan_fields(rng)
    if rng.random() < 0.15:
        return {"fields": fields}
    key = rng.choice(list(PLAN_SPECIAL))
    fields[key] = hostile(rng, PLAN_SPECIAL[key])
    return {"fields": fields, "mutate": (key, fields[key])}


def run_plan(r: Recipe) -> tuple[Any, Check]:
    fields = r["fields"]

    def check(p: Plan) -> Verdict:
        chips = math.prod(p.degree(role) for role in ("data", "model", "pipe", "expert", "context"))
        if not plan_is_valid(fields):
            key, value = r.get("mutate") or ("?", None)
            return f"accepted {key}={fmt(value)} ({type(value).__name__}), which the documented rules refuse"
        if not all(_same(getattr(p, k), v) for k, v in fields.items()):
            return "a field does not read back as given"
        return (Plan.parse(str(p)) == p and p.chips == chips) or "Plan.parse(str(p)) != p"

    return Plan(**fields), check


# -- Plan.parse ------------------------------------------------------------------------------------
PLAN_KEYS = [f.name for f in dataclasses.fields(Plan)]
VALUE_TEXT = ["", " ", "-1", "0", "1", "2", "4", "1.5", "2.0", "nan", "inf", "²", "1_0", "0x2", "+2", "٢", "true",
              "True", "false", "yes", "on", "2**3", "9" * 30, "1" + "0" * 5000, "ring", "flash", "full", "X",
              "a b", "a-b", "bf16", "None", "=", "==2"]  # fmt: skip
TOKENS = [*PLAN_KEYS, "fsdp", ",", ",", "=", "=", " ", "2", "4", "1", "0", "true", "x", "tp=2", "sp", "é", "\t", "\n"]


class _RefusedError(Exception):
    pass


def _int_text(value: str) -> int | None:
    """A whole number as text, in ASCII decimal (None: text Python's int() may still read)."""
    return int(value) if re.fullmatch(r"\s*[+-]?[0-9]+\s*", value) and len(value.strip()) < 4000 else None


def expected_parse(text: str) -> dict[str, Any] | None:
    """The plan fields the documented grammar gives ``text`` (``Plan.parse``'s docstring and
    the module doc): comma-separated ``key=value`` items, blanks skipped, a flag alone for a
    bool, ``fsdp=N`` for ``dp=N`` with ZeRO-3 unless ``zero`` is given; None where the text
    may be read either way (digits Python's int() reads beyond ASCII). Raises ``_RefusedError``
    where the text must be refused."""
    fields = {f.name: f.type for f in dataclasses.fields(Plan)}
    values: dict[str, Any] = {}
    either = False
    fsdp_zero = False
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        key, sep, value = (s.strip() for s in item.partition("="))
        if key == "fsdp" and sep:
            key = "dp"
            if "zero" not in values:
                values["zero"], fsdp_zero = 3, True
        if key not in fields:
            raise _RefusedError
        if key in values and not (key == "zero" and fsdp_zero):
            raise _RefusedError
        fsdp_zero = fsdp_zero and key != "zero"
        kind = str(fields[key])
        if not sep:
            if "bool" not in kind:
                raise _RefusedError
            values[key] = True
        elif "int" in kind:
            n = _int_text(value)
            if n is None:
                either = True
                continue
            values[key] = n
        elif "bool" in kind:
            if value.lower() not in ("true", "false", "1", "0"):
                raise _RefusedError
            values[key] = value.lower() in ("true", "1")
        else:
            if key.endswith("_axis") and not value.isalnum():
                raise _RefusedError
            values[key] = value
    return None if either else values


def draw_parse(rng: random.Random) -> Recipe:
    kind = rng.random()
    if kind < 0.1:
        return {"text": hostile(rng, [b"dp=2", ["dp=2"], 5, None, Plan(dp=2)])}
    if kind < 0.55:
        items = str(Plan(**valid_plan_fields(rng))).split(",")
        i = rng.randrange(len(items))
        key = items[i].partition("=")[0] if rng.random() < 0.8 else rng.choice([*PLAN_KEYS, "fsdp", "DP", "d p"])
        how = rng.random()
        if how < 0.6:
            items[i] = f"{key}={rng.choice(VALUE_TEXT)}"
        elif how < 0.75:
            items.insert(rng.randrange(len(items) + 1), rng.choice([items[i], f"{key}", f"fsdp={rng.choice('124')}"]))
        elif how < 0.9:
            items[i] = rng.choice([" ", "\t"]) + items[i] + rng.choice(["", " ", ",", ",,"])
        else:
            items[i] = key
        return {"text": ",".join(items)}
    return {"text": "".join(rng.choice(TOKENS) for _ in range(rng.randrange(0, 9)))}


def run_parse(r: Recipe) -> tuple[Any, Check]:
    text = r["text"]

    def check(p: Plan) -> Verdict:
        if not isinstance(text, str):
            return "accepted a text that is not a str"
        if Plan.parse(str(p)) != p:
            return "Plan.parse(str(p)) != p"
        try:
            want = expected_parse(text)
        except _RefusedError:
            return "accepted a text the documented grammar refuses"
        return want is None or p == Plan(**want) or f"read as {p}, the grammar gives {Plan(**want)}"

    return Plan.parse(text), check


# -- run_model -------------------------------------------------------------------------------------
def fitting_plan(rng: random.Random, cfg: TransformerConfig, s: int) -> dict[str, Any]:
    """A plan that most likely fits ``cfg``: each degree divides what it splits (or not, 10%)."""
    loose = rng.random() < 0.1
    f: dict[str, Any] = {}
    chips = 1

    def pick(key: str, ok: Callable[[int], bool]) -> None:
        nonlocal chips
        options = [n for n in (1, 2, 4) if chips * n <= 8 and (loose or ok(n))]
        f[key] = rng.choice(options) if options else 1
        chips *= f[key]

    pick("tp", lambda n: all(x % n == 0 for x in (cfg.heads, cfg.d_ff, cfg.vocab)) and (
        cfg.n_kv % n == 0 or n % cfg.n_kv == 0))  # fmt: skip
    pick("cp", lambda n: n == 1 or (not cfg.experts and s % (2 * n) == 0 and not cfg.dropout))
    pick("ep", lambda n: n == 1 or (cfg.experts > 0 and cfg.experts % n == 0))
    pick("pp", lambda n: n == 1 or (cfg.layers % n == 0 and not cfg.tie_embeddings))
    pick("dp", lambda n: True)
    f["zero"] = rng.choice((0, 1, 2, 3) if not cfg.experts else (0, 1))
    if f["zero"] == 3 and cfg.d_model % f["dp"]:
        f["zero"] = 1
    if f["tp"] > 1 and rng.random() < 0.4 and s % (f["tp"] * f["cp"]) == 0:
        f["sp"] = True
    if f["pp"] > 1:
        f.update(schedule=rng.choice(("gpipe", "1f1b")), microbatches=rng.choice((1, 2)))
    if f["cp"] > 1:
        f.update(cp_method=rng.choice(CP_METHODS), cp_balanced=rng.random() < 0.7)
    elif not cfg.dropout:
        f["attention"] = rng.choice(ATTENTION)
    f["recompute"] = rng.choice(RECOMPUTE)
    return {k: v for k, v in f.items() if v != getattr(Plan(), k)}


def setup(rng: random.Random) -> Recipe:
    """A random valid small model, a plan that fits it, and a batch for it."""
    cfg = valid_config_fields(rng, d_models=(8, 16))
    c = TransformerConfig(**cfg)
    s = rng.choice([n for n in (4, 8) if n <= c.seq])
    plan = fitting_plan(rng, c, s)
    p = Plan(**plan)
    b = p.dp * p.ep * p.microbatches * rng.choice((1, 2))
    dropout_seed = rng.choice((None, 0, 7)) if c.dropout else None
    return {"cfg": cfg, "plan": plan, "B": b, "S": s, "seed": rng.randrange(100), "dtype": "float64",
            "dropout_seed": dropout_seed}  # fmt: skip


ARRAY_KINDS = ["float", "negative", "vocab", "1-D", "3-D", "no rows", "no columns", "bool", "object", "strings",
               "list", "int8", "uint64", "huge", "B+1", "S>seq", "nan", "transposed", "ShapeDtype"]  # fmt: skip
PARAM_KINDS = ["missing", "extra", "shape", "nan", "inf", "int", "float16", "float32", "bfloat16", "object",
               "list", "string", "None", "ShapeDtype", "complex", "huge"]  # fmt: skip


def mutate_model(rng: random.Random, r: Recipe, slots: tuple[str, ...]) -> Recipe:
    """``r`` with one argument of a run made hostile (``r["mutate"] = (slot, how)``)."""
    slot = rng.choice(slots)
    if slot in ("tokens", "targets"):
        how: Any = rng.choice(ARRAY_KINDS) if rng.random() < 0.8 else ("value", hostile(rng, []))
    elif slot == "params":
        how = rng.choice(PARAM_KINDS)
    elif slot == "plan field":
        key = rng.choice(["dp", "tp", "pp", "cp", "ep", "zero", "sp", "microbatches", "attention", "cp_method",
                          "recompute", "precision", "schedule", "cp_balanced"])  # fmt: skip
        how = (key, rng.choice({"sp": [True, False], "cp_balanced": [True, False], "attention": list(ATTENTION),
                                "cp_method": list(CP_METHODS), "recompute": list(RECOMPUTE),
                                "precision": ["fp32", "fp64", None], "schedule": ["gpipe", "1f1b"]}.get(
            key, [1, 2, 3, 4])))  # fmt: skip
    elif slot == "cfg field":
        key = rng.choice(
            ["seq", "vocab", "heads", "d_ff", "layers", "kv_heads", "experts", "dropout", "tie_embeddings"]
        )
        how = (key, rng.choice({"dropout": [0.0, 0.1], "tie_embeddings": [True, False], "kv_heads": [None, 1, 2],
                                "experts": [0, 2, 4]}.get(key, [1, 2, 3, 4, 8, 16])))  # fmt: skip
    elif slot == "mesh":
        how = rng.choice(["X=2", "renamed", "other plan", "bigger", "dict", "None", "failed chip", "capacity"])
    else:  # cfg, plan, dropout_seed, optimizer, precision, reduce_dtype: a hostile value in its place
        how = hostile(rng, {"cfg": ["gpt-tiny", {"layers": 1}, Plan()], "plan": ["tp=2", {"tp": 2}, "dp=1"],
                            "dropout_seed": [-1, 2**32, 2**64, 1.5, "1", math.nan],
                            "optimizer": ["sgd ", "lion", "Adam", "", shardsim.training.SGD(lr=0.1), 0.1],
                            "precision": ["fp16", "fp8", "FP32", "bf16", "fp64", "int8"],
                            "reduce_dtype": ["float16", "int8", "float32", "bfloat16", "U5", "float128"],
                            }.get(slot, []))  # fmt: skip
    return {**r, "mutate": (slot, how)}


def _tokens(r: Recipe, cfg: TransformerConfig, which: str) -> Any:
    rng = np.random.default_rng(r["seed"] + (which == "targets"))
    b, s = r["B"], r["S"]
    ids = rng.integers(0, cfg.vocab, size=(b, s))
    slot, how = r.get("mutate") or (None, None)
    if slot != which:
        return ids
    if isinstance(how, tuple):
        return how[1]
    shapes = {"1-D": (b * s,), "3-D": (b, s, 1), "no rows": (0, s), "no columns": (b, 0), "B+1": (b + 1, s),
              "S>seq": (b, cfg.seq + 1)}  # fmt: skip
    if how in shapes:
        return rng.integers(0, cfg.vocab, size=shapes[how])
    changed: dict[str, Any] = {
        "float": ids.astype(float), "negative": ids - cfg.vocab, "vocab": ids + cfg.vocab, "bool": ids > 0,
        "object": ids.astype(object), "strings": ids.astype(str), "list": ids.tolist(), "int8": ids.astype(np.int8),
        "uint64": ids.astype(np.uint64), "huge": ids + 2**62, "transposed": ids.T,
        "ShapeDtype": shardsim.ShapeDtype((b, s), "int64"),
    }  # fmt: skip
    if how == "nan":
        out = ids.astype(float)
        out[0, 0] = math.nan
        return out
    return changed[how]


def _params(r: Recipe, cfg: TransformerConfig) -> Any:
    p: dict[str, Any] = reference.init(cfg, seed=r["seed"], dtype=r["dtype"])
    slot, how = r.get("mutate") or (None, None)
    if slot != "params":
        return p
    key = sorted(p)[r["seed"] % len(p)]
    if how == "missing":
        del p[key]
    elif how == "extra":
        p["layers.9.attn.wq"] = p[key]
    elif how == "shape":
        p[key] = np.zeros(p[key].shape + (1,))
    elif how in ("nan", "inf"):
        w = p[key].copy()
        w.flat[r["seed"] % w.size] = math.nan if how == "nan" else -math.inf
        p[key] = w
    elif how in ("int", "float16", "float32", "bfloat16", "object", "complex"):
        to = {"int": np.int64, "object": object, "complex": np.complex128}.get(how, how)
        p[key] = p[key].astype(shardsim.dtypes.resolve_dtype(to) if how == "bfloat16" else to)
    elif how == "list":
        p[key] = p[key].tolist()
    elif how in ("string", "None"):
        p[key] = "w" if how == "string" else None
    elif how == "ShapeDtype":
        p = {k: shardsim.ShapeDtype(v.shape, v.dtype) for k, v in p.items()}
    elif how == "huge":
        p[key] = p[key] * 1e300
    return p


def build(r: Recipe) -> dict[str, Any]:
    """The objects a run takes: cfg, plan, mesh, params, tokens, targets, dropout_seed."""
    slot, how = r.get("mutate") or (None, None)
    cfg_fields, plan_fields = dict(r["cfg"]), dict(r["plan"])
    base = TransformerConfig(**cfg_fields)
    if slot == "cfg field":
        cfg_fields[how[0]] = how[1]
    if slot == "plan field":
        plan_fields[how[0]] = how[1]
    cfg: Any = TransformerConfig(**cfg_fields)
    plan: Any = Plan(**plan_fields)
    mesh: Any = plan.mesh()
    out = {"params": _params(r, base), "tokens": _tokens(r, base, "tokens"), "targets": _tokens(r, base, "targets")}
    if slot == "mesh":
        sizes = dict(zip(mesh.axis_names, mesh.shape, strict=True))
        if how == "X=2":
            mesh = shardsim.Mesh(X=2)
        elif how == "renamed":
            mesh = shardsim.Mesh({f"{a}1": n for a, n in sizes.items()})
        elif how == "other plan":
            mesh = Plan(dp=2, tp=2).mesh()
        elif how == "bigger":
            mesh = shardsim.Mesh({**sizes, "spare": 2})
        elif how == "dict":
            mesh = sizes
        elif how == "None":
            mesh = None
        elif how == "failed chip":
            mesh.fail(**{mesh.axis_names[-1]: mesh.shape[-1] - 1})
        else:
            mesh.memory.capacity = 1000
    if slot == "cfg":
        cfg = how
    if slot == "plan":
        plan = how
    seed = how if slot == "dropout_seed" else r["dropout_seed"]
    return {"cfg": cfg, "plan": plan, "mesh": mesh, **out, "dropout_seed": seed}


def draw_run_model(rng: random.Random) -> Recipe:
    r = setup(rng)
    if rng.random() < 0.3:
        return r
    slots = ("cfg", "plan", "mesh", "params", "tokens", "targets", "dropout_seed", "plan field", "cfg field")
    return mutate_model(rng, r, slots)


def tolerance(*dtypes: Any) -> float:
    """Relative tolerance of the least precise dtype (float64: 1e-7; float32: 1e-3; 16-bit: 5e-2)."""
    bits = min(np.dtype(d).itemsize for d in dtypes)
    return {8: 1e-7, 4: 1e-3}.get(bits, 5e-2)


def close(got: Any, want: Any, rtol: float) -> bool:
    """Same shape, non-finite exactly where ``want`` is (NaN or an infinity: which one an
    overflow gives depends on the order of a sum), within ``rtol`` of its scale elsewhere."""
    g, w = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if g.shape != w.shape or not np.array_equal(np.isfinite(g), np.isfinite(w)):
        return False
    ok = np.isfinite(w)
    scale = max(1.0, float(np.abs(w[ok]).max())) if ok.any() else 1.0
    return bool(np.allclose(g[ok], w[ok], rtol=rtol, atol=rtol * scale))


def agrees_with_reference(loss: Any, grads: Any, want_loss: float, want: Mapping[str, Any], rtol: float) -> Verdict:
    """The loss and every gradient as the reference's (NaN where its are); else which differs."""
    if not close(loss, want_loss, rtol):
        return f"loss {loss!r}, the reference's {want_loss!r}"
    if grads is None:
        return True
    if sorted(grads) != sorted(want):
        return "the gradients' keys are not the reference's"
    shapes = [k for k in want if np.shape(grads[k]) != np.shape(want[k])]
    if shapes:
        k = shapes[0]
        return f"gradient {k} has shape {np.shape(grads[k])}, the reference's {np.shape(want[k])}"
    bad = [k for k in want if not close(grads[k], want[k], rtol)]
    return not bad or f"gradient {bad[0]} differs from the reference's ({len(bad)} of {len(want)})"


def non_float_weight(params: Mapping[str, Any]) -> str:
    """A reason when a weight is not floating point (a gradient step cannot keep it), else ''."""
    for k, v in params.items():
        kind = np.asarray(v).dtype.kind
        if kind != "f" and np.asarray(v).dtype.name != "bfloat16":
            return f"accepted weight {k} of dtype {np.asarray(v).dtype}"
    return ""


def _reference(a: Mapping[str, Any]) -> tuple[float, dict[str, np.ndarray]] | None:
    """The reference's loss and grads, None where the reference itself refuses (or fails on) the inputs."""
    try:
        return reference.loss_and_grads(a["cfg"], a["params"], a["tokens"], a["targets"],
                                        dropout_seed=a["dropout_seed"])  # fmt: skip
    except Exception:
        return None


def _shape_only(a: Mapping[str, Any]) -> bool:
    return isinstance(a["params"], dict) and any(isinstance(v, shardsim.ShapeDtype) for v in a["params"].values())


def run_run_model(r: Recipe) -> tuple[Any, Check]:
    a = build(r)

    def check(res: Any) -> Verdict:
        if _shape_only(a) or isinstance(a["tokens"], shardsim.ShapeDtype):
            ok = res.loss is None and res.grads is None and res.peak is not None and int(res.peak.max()) > 0
            return ok or "a shape-only run gave values or no peak"
        odd = non_float_weight(a["params"])
        if odd:
            return odd
        want = _reference(a)
        if want is None:
            return "accepted inputs the reference refuses"
        rtol = tolerance(*(np.asarray(v).dtype for v in a["params"].values()), res.sharded_grads["embed"].dtype)
        if r.get("mutate") == ("params", "huge"):  # near 1e308 a sum overflows or not by its order, which
            return agrees_with_reference(res.loss, None, *want, rtol)  # sharding changes: the loss alone
        return agrees_with_reference(res.loss, res.grads, *want, rtol)

    return shardsim.run_model(a["cfg"], a["plan"], a["mesh"], a["params"], a["tokens"], a["targets"],
                              dropout_seed=a["dropout_seed"]), check  # fmt: skip


# -- Trainer.for_model -----------------------------------------------------------------------------
def draw_trainer(rng: random.Random) -> Recipe:
    r = {**setup(rng), "optimizer": rng.choice(("sgd", "momentum", "adam", "adamw")),
         "precision": rng.choice((None, None, "fp64")), "reduce_dtype": None}  # fmt: skip
    if rng.random() < 0.25:
        return r
    slots = ("cfg", "plan", "mesh", "params", "tokens", "targets", "dropout_seed", "optimizer", "precision",
             "reduce_dtype", "plan field")  # fmt: skip
    return mutate_model(rng, r, slots)


def first_update(opt: Any, w: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The optimizer's first step from its documented formula (shardsim.training.optim)."""
    if isinstance(opt, shardsim.training.SGD):
        return w - opt.lr * (g + opt.weight_decay * w)  # step 1: the momentum buffer is the gradient
    if opt.decoupled:
        w = w * (1 - opt.lr * opt.weight_decay)
    else:
        g = g + opt.weight_decay * w
    m, v = (1 - opt.b1) * g, (1 - opt.b2) * g * g
    return w - opt.lr / (1 - opt.b1) * m / (np.sqrt(v) / math.sqrt(1 - opt.b2) + opt.eps)


def run_trainer(r: Recipe) -> tuple[Any, Check]:
    a = build(r)
    slot, how = r.get("mutate") or (None, None)
    opt = how if slot == "optimizer" else r["optimizer"]
    options = {k: (how if slot == k else r[k]) for k in ("precision", "reduce_dtype", "dropout_seed")}
    options["dropout_seed"] = a["dropout_seed"]
    step_tokens = (a["tokens"], a["targets"])
    clean = {**a, "tokens": _tokens({**r, "mutate": None}, TransformerConfig(**r["cfg"]), "tokens"),
             "targets": _tokens({**r, "mutate": None}, TransformerConfig(**r["cfg"]), "targets")}  # fmt: skip
    t = shardsim.Trainer.for_model(a["cfg"], a["plan"], a["mesh"], a["params"], opt, **options)
    res = t.step(*step_tokens)

    def check(res: Any) -> Verdict:
        if _shape_only(a) or isinstance(step_tokens[0], shardsim.ShapeDtype):
            return (res.loss is None and t.step_count == 1) or "a shape-only step gave a loss"
        odd = non_float_weight(a["params"])
        if odd:
            return odd
        seed = a["dropout_seed"]  # step 1 draws its masks from the run's seed and the step count
        seed = None if seed is None else shardsim.training.step_dropout_seed(seed, 1)
        want = _reference({**clean, "tokens": step_tokens[0], "targets": step_tokens[1], "dropout_seed": seed})
        if want is None:
            return "accepted inputs the reference refuses"
        loss, grads = want
        dtypes = (t.precision.compute, t.precision.reduce, *(np.asarray(v).dtype for v in a["params"].values()))
        rtol = tolerance(*dtypes)
        if t.step_count != 1:
            return f"step_count {t.step_count} after one step"
        verdict = agrees_with_reference(res.loss, None, loss, grads, rtol)
        if verdict is not True or t.precision.mixed or len({np.asarray(v).dtype for v in a["params"].values()}) > 1:
            return verdict  # 16-bit or mixed-dtype gradients (the reference rounds each to its weight's): the loss
        new = t.params_global()
        bad = [k for k in grads if not close(new[k], first_update(t.optimizer, np.asarray(a["params"][k], np.float64),
                                                                   grads[k]), max(rtol, 1e-6))]  # fmt: skip
        return not bad or f"{t.optimizer.name}'s first update of {bad[0]} is not the formula's on the reference grads"

    return res, check


# -- cost.estimate of a model ----------------------------------------------------------------------
HARDWARE = ("h100", "a100", "tpu-v5p", "b200", "tpu-v5e")
ESTIMATE_SPECIAL: dict[str, list[Any]] = {
    "model": ["gpt3-1T", "", "GPT-TINY", None, {"layers": 1}, 5],
    "plan": ["dp=3", "tp=3", "dp=2,dp=2", "", "dp=0", "tp=2,sp", "pp=2,microbatches=0", None, {"dp": 2}, Plan(tp=8)],
    "hardware": ["H100", "", "nosuch", None, 5],
    "batch_tokens": [*INT_SPECIAL, 1, 17, 64, 2**40],
    "seq": [*INT_SPECIAL, None, 1, 3, 17, 2**20],
    "chips": [*INT_SPECIAL, 1, 16, None],
    "optimizer": ["lion", "", "Adam", None, 5],
    "precision": ["fp8", "", "bf16", "fp16", "fp64", None, 5],
    "efficiency": ["", "fast", None, 1.0],
    "overlap": [0, 1, None, "no"],
    "prefetch": [*INT_SPECIAL, 0, 100],
    "dtype": ["int8", "", "float16", "float64", None, "U5", "bool"],
    "links": [{"data": "nosuch"}, {"nosuch": "nvlink"}, {}, "nvlink", None],
    "topology": ["", "torus", (2, 2), (0,), "nosuch", None],
}


def draw_estimate(rng: random.Random) -> Recipe:
    cfg = rng.choice([None, None, "gpt-tiny", "llama-tiny", "moe-tiny"])
    fields = valid_config_fields(rng) if cfg is None else None
    c = TransformerConfig(**fields) if fields else shardsim.models.get(cfg)
    s = rng.choice([n for n in (4, 8, 16) if n <= c.seq])
    plan = Plan(**fitting_plan(rng, c, s))
    args: dict[str, Any] = {"model": cfg, "plan": str(plan), "hardware": rng.choice(HARDWARE),
                            "batch_tokens": plan.dp * plan.ep * plan.microbatches * s * rng.choice((1, 2, 4)),
                            "seq": s}  # fmt: skip
    if rng.random() < 0.5:
        args.update(optimizer=rng.choice(("sgd", "adam", "adamw", "momentum")), precision=rng.choice((None, "bf16")))
    r = {"cfg": fields, "args": args}
    if rng.random() < 0.85:
        key = rng.choice(list(ESTIMATE_SPECIAL))
        r["mutate"] = (key, hostile(rng, ESTIMATE_SPECIAL[key]))
    return r


def estimate_consistent(e: Any, batch_tokens: int) -> Verdict:
    """Finite positive times, compute within the step, memory positive and its total between the
    largest category's peak and the sum of them, MFU in (0, 1], tokens/s = batch / step."""
    times = (e.step_s, e.compute_s, e.comm_s, e.comm_exposed_s)
    if not all(isinstance(x, float | int) and math.isfinite(x) and x >= 0 for x in times) or not e.step_s > 0:
        return f"times not finite and positive: step {e.step_s!r}, compute {e.compute_s!r}, comm {e.comm_s!r}"
    parts = [v for k, v in e.memory.items() if k != "total"]
    total = e.memory.get("total", 0)
    if not (total > 0 and max(parts) <= total <= sum(parts)):
        return f"memory {e.memory} is not positive with a total between its largest part and their sum"
    if e.step_s < e.compute_s * (1 - 1e-9):
        return f"step {e.step_s} shorter than its compute {e.compute_s}"
    if not 0 < e.mfu <= 1:
        return f"MFU {e.mfu!r} outside (0, 1]"
    ok = math.isclose(e.tokens_per_s, batch_tokens / e.step_s, rel_tol=1e-9) and e.batch == batch_tokens
    return ok or f"tokens/s {e.tokens_per_s!r} is not batch / step"


def run_estimate(r: Recipe) -> tuple[Any, Check]:
    args = dict(r["args"])
    model = TransformerConfig(**r["cfg"]) if r["cfg"] else args.pop("model")
    args.pop("model", None)
    if "mutate" in r:
        key, value = r["mutate"]
        if key == "model":
            model = value
        else:
            args[key] = value
    plan = args.pop("plan")
    hw = args.pop("hardware")
    e = cost.estimate(model, plan, hw, **args)

    def check(e: Any) -> Verdict:
        if e.plan != (plan if isinstance(plan, Plan) else Plan.parse(plan)):
            return f"estimated plan {e.plan}, not the one given"
        return estimate_consistent(e, args["batch_tokens"])

    return e, check


# -- the planner -----------------------------------------------------------------------------------
PLANNER_SPECIAL: dict[str, list[Any]] = {
    "chips": [*INT_SPECIAL, 1, 3, 6],
    "batch_tokens": [*INT_SPECIAL, 1, 9, 2**40],
    "seq": [*INT_SPECIAL, None, 1, 3, 2**20],
    "hardware": ["H100", "", "nosuch", None, 5],
    "window": [*FLOAT_SPECIAL, 0.5, 100.0],
    "headroom": [*FLOAT_SPECIAL, 0.5, 0.999, 1.0],
    "allow": [(), ("dp",), ("tp", "tp"), ("nosuch",), "dp", None, 5, ("zero",), ("sp",)],
    "micro_range": [(0, 1), (2, 1), (1, 10**9), (-1, -1), (1.5, 2), ("1", "2"), (1,), None, 5, (1, 2, 3)],
    "batch_range": [(0, 1), (64, 32), (1, 10**12), (1.5, 64), None, (64,), "64"],
    "tp_max": [*INT_SPECIAL, None],
    "cp_max": [*INT_SPECIAL, None],
    "tp": [*INT_SPECIAL, 2, 4],
    "pp": [*INT_SPECIAL, 2],
    "zero": [*INT_SPECIAL, 3, 4],
    "recompute": WORD_SPECIAL,
    "attention": WORD_SPECIAL,
    "schedule": WORD_SPECIAL,
    "policy": ["", "nosuch", "megatron", "bf16", None, 5],
    "efficiency": ["", "fast", None, "ideal"],
    "nosuch": [1, None],
}


def draw_planner(rng: random.Random) -> Recipe:
    """A bounded search: a tiny model on 1, 2 or 4 chips, microbatches of 1-2, no recomputation,
    data and tensor parallelism (and ZeRO) only unless a mutation widens it."""
    fields = valid_config_fields(rng, d_models=(8, 16))
    fields.update(layers=1, experts=0, top_k=2, capacity_factor=None, mlp="gelu", dropout=0.0)
    s = 4 if fields["seq"] == 4 else rng.choice((4, 8))
    chips = rng.choice((1, 2, 4))
    args = {"chips": chips, "batch_tokens": s * chips * rng.choice((1, 2)), "seq": s, "hardware": rng.choice(HARDWARE),
            "allow": ("dp", "tp", "zero"), "micro_range": (1, 2), "recompute": "none"}  # fmt: skip
    r = {"cfg": fields, "args": args}
    if rng.random() < 0.8:
        key = rng.choice(list(PLANNER_SPECIAL))
        r["mutate"] = (key, hostile(rng, PLANNER_SPECIAL[key]))
    return r


def run_planner(r: Recipe) -> tuple[Any, Check]:
    from shardsim.planner import plan

    cfg = TransformerConfig(**r["cfg"])
    args = dict(r["args"])
    if "mutate" in r:
        args[r["mutate"][0]] = r["mutate"][1]
    hw = args.pop("hardware")
    table = plan(cfg, hw, **args)

    def check(t: Any) -> Verdict:
        b = t.best
        headroom = args.get("headroom", 0.0)
        if not (b.fits and b.plan.chips == args["chips"] and Plan.parse(str(b.plan)) == b.plan):
            return f"best plan {b.plan} does not fit or is not on {args['chips']} chips"
        if not (math.isfinite(b.step_s) and b.step_s > 0 and 0 < b.memory["total"] <= b.hbm * (1 - headroom)):
            return f"best plan's step {b.step_s!r} or memory {b.memory.get('total')!r} out of range"
        if not math.isclose(b.tokens_per_s, b.tokens / b.step_s, rel_tol=1e-9) or not 0 < b.mfu <= 1:
            return f"tokens/s {b.tokens_per_s!r} is not tokens / step, or MFU {b.mfu!r} outside (0, 1]"
        if b.plan.pp == 1 and b.plan.microbatches == 1 and "policy" not in args:
            # the step the whole-model estimate models too: every second and byte equal (docs/planner.md)
            e = cost.estimate(cfg, b.plan, hw, batch_tokens=b.tokens, seq=args["seq"] or cfg.seq,
                              **({"efficiency": args["efficiency"]} if "efficiency" in args else {}))  # fmt: skip
            keys = ("params", "grads", "optimizer", "activations", "total")
            if any(b.memory[k] != e.memory[k] for k in keys):
                return f"memory {dict((k, b.memory[k]) for k in keys)}, the estimate's {e.memory} for {b.plan}"
            return math.isclose(b.step_s, e.step_s, rel_tol=1e-6) or f"step {b.step_s}, the estimate's {e.step_s}"
        return True

    return table, check


# -- the command line ------------------------------------------------------------------------------
CLI_BASES: list[list[str]] = [
    ["estimate", "--model", "gpt-tiny", "--plan", "dp=2", "--batch-tokens", "64", "--hardware", "h100"],
    ["estimate", "--model", "llama-tiny", "--plan", "tp=2", "--batch-tokens", "32", "--seq", "8"],
    ["estimate", "--model", "moe-tiny", "--plan", "ep=2", "--batch-tokens", "64", "--json"],
    ["estimate", "--model", "gpt-tiny", "--plan", "pp=2,microbatches=2", "--batch-tokens", "64", "--chips", "2"],
    ["plan", "--model", "gpt-tiny", "--chips", "2", "--batch-tokens", "32", "--seq", "8", "--allow", "dp,tp",
     "--fix", "recompute=none"],
    ["demo", "--model", "gpt-tiny", "--plan", "tp=2", "--quiet"],
    ["demo", "--model", "llama-tiny", "--plan", "tp=2,sp", "--quiet"],
    ["train", "--quiet", "--steps", "1", "--scheme", "ddp", "--chips", "2"],
]  # fmt: skip
CLI_VALUES: dict[str, list[str]] = {
    "--model": ["", "nosuch", "GPT-TINY", "gpt-tiny ", "gpt3", "1", "--plan"],
    "--plan": ["", "dp=3", "tp=3", "dp=0", "dp=2,dp=2", "sp", "tp=2,sp,cp=2", "nosuch=1", "dp=1e9", "dp=²",
               "pp=2,microbatches=0", "dp=2,tp=2", "fsdp=2", "precision=fp8", "data_axis=a b", "dp=" + "9" * 30],
    "--batch-tokens": ["0", "-1", "1.5", "16M", "1e9", "nan", "inf", "", "abc", "99999999999T", "1" + "0" * 400, "3"],
    "--seq": ["0", "-1", "1", "3", "1.5", "nan", "", "1000000000"],
    "--chips": ["0", "-1", "3", "1.5", "", "1000000000", "65537"],
    "--hardware": ["", "nosuch", "H100"],
    "--fix": ["", "tp=3", "nosuch=1", "tp=", "recompute=never", "tp=2,tp=4", "pp=nan", "tp=1e9", "attention=x"],
    "--allow": ["", "nosuch", "dp,,tp", ",", "tp"],
    "--headroom": ["nan", "-1", "1", "inf", "1.5", "", "x", "0.999999"],
    "--window": ["nan", "-1", "inf", "", "x", "1e308"],
    "--top": ["0", "-1", "1000000000", "x", ""],
    "--policy": ["", "nosuch", "megatron"],
    "--optimizer": ["", "lion", "Adam"],
    "--precision": ["", "fp8", "int8"],
    "--train-tokens": ["nan", "-1", "0", "inf", "x", "", "1e400"],
    "--efficiency": ["", "fast"],
    "--steps": ["0", "-1", "1000000", "x"],
    "--batch": ["0", "-1", "x", "1e9"],
    "--d-model": ["0", "-1", "x"],
    "--layers": ["0", "-1", "100000"],
    "--lr": ["nan", "inf", "-1", "0"],
}  # fmt: skip
CLI_FLAGS = {
    "estimate": ["--model", "--plan", "--batch-tokens", "--seq", "--chips", "--hardware", "--optimizer",
                 "--precision", "--train-tokens", "--efficiency"],
    "plan": ["--model", "--chips", "--batch-tokens", "--seq", "--hardware", "--fix", "--allow", "--headroom",
             "--window", "--top", "--policy", "--efficiency"],
    "demo": ["--model", "--plan"],
    "train": ["--steps", "--batch", "--d-model", "--layers", "--lr", "--optimizer", "--precision", "--chips"],
}  # fmt: skip


def draw_cli(rng: random.Random) -> Recipe:
    argv = list(rng.choice(CLI_BASES))
    if rng.random() < 0.1:
        return {"argv": argv}
    flags = CLI_FLAGS[argv[0]]
    for _ in range(1 if rng.random() < 0.8 else 2):
        flag = rng.choice(flags)
        if rng.random() < 0.1:
            argv.append(flag)  # the value missing
        else:
            argv += [flag, rng.choice(CLI_VALUES[flag])]
    return {"argv": argv}


class _Exit:
    def __init__(self, code: Any, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err


def run_cli(r: Recipe) -> tuple[Any, Check]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code: Any = cli.main(r["argv"])
        except SystemExit as e:
            code = ("SystemExit", e.code)
    result = _Exit(code, out.getvalue(), err.getvalue())
    if code == 2 and len(result.err.splitlines()) == 1 and not re.search("Traceback|internal error", result.err):
        raise shardsim.ShardsimError(result.err.strip() or "(empty)")  # a one-line refusal: documented
    if code != 0 or re.search("Traceback|internal error", result.err):
        raise _CliFailureError(f"exit {code!r}, stderr {result.err.strip()[-300:]!r}")

    def check(x: _Exit) -> Verdict:
        if not x.out.strip():
            return "exit 0 and nothing printed"
        return not re.search(r"\b(nan|NaN|inf)\b", x.out) or "exit 0 with nan or inf in the output"

    return result, check


class _CliFailureError(Exception):
    """A command line that exits neither 0 nor 2 with one line, or prints a traceback."""


# -- the table -------------------------------------------------------------------------------------
Runner = Callable[[Recipe], tuple[Any, Check]]
CALLS: dict[str, tuple[Callable[[random.Random], Recipe], Runner]] = {
    "TransformerConfig": (draw_config, run_config),
    "Plan": (draw_plan, run_plan),
    "Plan.parse": (draw_parse, run_parse),
    "run_model": (draw_run_model, run_run_model),
    "Trainer.for_model": (draw_trainer, run_trainer),
    "cost.estimate(model)": (draw_estimate, run_estimate),
    "planner.plan": (draw_planner, run_planner),
    "cli": (draw_cli, run_cli),
}

#: Each call's share of a campaign's inputs (the costly ones fewer: a planner search takes a
#: fraction of a second, a TransformerConfig microseconds).
SHARES = {
    "TransformerConfig": 0.28, "Plan": 0.2, "Plan.parse": 0.2, "run_model": 0.16, "Trainer.for_model": 0.05,
    "cost.estimate(model)": 0.06, "planner.plan": 0.01, "cli": 0.04,
}  # fmt: skip


class Hang(BaseException):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Hang


def run_case(name: str, recipe: Recipe, *, limit_s: int = LIMIT_S) -> tuple[str, str]:
    """``(outcome, detail)`` of one input: the outcome (see the module docstring) and, for a bad
    one, the exception's type and first line."""
    _, run = CALLS[name]
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit_s)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # not np.errstate: see docs/reliability.md, CPython 3.11
            try:
                value, check = run(recipe)
            except shardsim.ShardsimError as e:
                text = str(e).strip()
                return ("documented", "") if text else ("undocumented", f"{type(e).__name__} with no message")
            except Hang:
                raise
            except Exception as e:
                return "undocumented", f"{type(e).__name__}: {_first_line(e)}"
            try:
                verdict = check(value)
                if verdict is True:
                    return "ok", ""
                return "wrong", verdict if isinstance(verdict, str) else "the check disagrees"
            except Hang:
                raise
            except Exception as e:
                return "wrong", f"the check raised {type(e).__name__}: {_first_line(e)}"
    except Hang:
        return "hang", f"still running after {limit_s} s"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:200] if lines else ""


def draw(name: str, rng: random.Random) -> Recipe:
    """One input recipe for call ``name``."""
    return CALLS[name][0](rng)


def describe(recipe: Recipe) -> str:
    """The recipe in one line: what was made hostile first, then the rest."""
    parts = []
    if "mutate" in recipe and recipe["mutate"] is not None:
        slot, how = recipe["mutate"]
        parts.append(f"hostile {slot}: {fmt(how)}")
    for k, v in recipe.items():
        if k != "mutate":
            parts.append(f"{k}={fmt(v, 200)}")
    return ", ".join(parts)
