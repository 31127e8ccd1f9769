"""``docs/errors.md`` against the code: the page's class tree and each section's ``Bases:``
against ``shardsim.errors``, and every example on the page run, the message it raises compared
with the page's word for word and its type with the section's.

An example is a paragraph ending in ``:`` followed by a fenced block holding the message; its
code is the paragraph's first backticked span (a paragraph that is only a list of spans, ``a``,
``b``, ``c``:, is one example per span, one message line each). The page runs its examples on
``mesh = Mesh(X=2, Y=2)`` and ``x = shard(np.zeros((4, 8)), mesh, "B_X D", label="In")`` unless
its prose says otherwise; what the prose says is written out here, keyed by the example's code:
``SETUP`` runs before the code as shown, ``INSTEAD`` runs in place of text that is not Python as
written, and a ``shardsim ...`` command runs through the command line. ``EXAMPLES`` counts them,
so an example added to the page without its setup fails here rather than being guessed at.
"""

from __future__ import annotations

import inspect
import io
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardsim
from shardsim import cli, errors

PAGE = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
README = PAGE.parents[1] / "README.md"

EXAMPLES = 46  # every example on the page; a new one needs its line in SETUP or INSTEAD if the prose sets it up

# what the prose around an example sets up, as statements run before the example's code
PARAMS = 'params = reference.init(get("gpt-tiny"))'
MLP_ARGS = "params = shardsim.models.reference_mlp.init_stack(2, 8, 16)\nx = np.zeros((8, 8), np.float32)\ndout = x"
SETUP = {
    'shard(a, Mesh(X=2, Y=2), "X, None")': "a = np.zeros((4, 8))",
    'shard(a, mesh, "[B_X, 3D]")': "a = np.zeros((4, 8))",
    'shard(a, mesh, "B_X D_X")': "a = np.zeros((4, 8))",
    "p.to_global()": 'p = from_local(np.zeros((2, 2, 4, 8)), mesh, "[B, D]{U_Y}", label="Out")',
    "x @ w": 'w = shard(np.zeros((8, 2)), Mesh(X=2, Y=2), "D F", label="W")',
    "p * 1.5": 'p = from_local(np.full((2, 1), 100, np.int8), Mesh(X=2), "[B]{U_X}")',
    "mask - mask": 'mask = shard(np.array([True, False]), Mesh(X=2), "D_X", label="mask")',
    "s.to_global()": 's = shard(ShapeDtype((4, 8)), mesh, "B_X D", label="In")',
    'reference.forward(get("gpt-tiny"), params, [[1, 2]])': (
        f'{PARAMS}\nparams["layers.1.attn.wk"] = np.zeros((32, 16))'
    ),
    'shard(np.zeros((20, 10)), mesh, "B_X D", label="Act")': (
        "mesh = Mesh(X=2)\nmesh.memory.capacity = 1000\n"
        'w = shard(np.zeros(100), mesh, "D", label="W", category="params")'
    ),
    'all_gather(x, "X")': "mesh.fail(X=1, Y=0)",
    'reference.forward(get("gpt-tiny"), params, [[1, 2], [64, 3]])': PARAMS,
    'reference.forward(get("gpt-tiny"), params, np.zeros((1, 17), int))': PARAMS,
    'plan(cfg, "h100", 2, 64, seq=16, tp=0)': 'cfg = get("llama-tiny")',
    'plan(cfg, "h100", 8, 6 * 16, seq=16, allow=("dp", "tp"), tp=2)': 'cfg = get("llama-tiny")',
    'run_model(get("gpt-tiny"), Plan(tp=2), mesh, params, [[1, 2, 64]], [[1, 2, 3]])': (
        f"{PARAMS}\nmesh = Plan(tp=2).mesh()"
    ),
    'engines.jax.run_strategy("pp", Mesh(Z=2), params, x, dout)': f"import shardsim.engines.jax\n{MLP_ARGS}",
    'engines.jax.run_strategy("ddp", Mesh(X=16), params, x, dout)': f"import shardsim.engines.jax\n{MLP_ARGS}",
}
# code for the examples whose text says what is run rather than being Python as written
INSTEAD = {
    "[B_X, D] @ [D, F_X]": 'x @ shard(np.zeros((8, 2)), mesh, "D F_X")',
    'Trainer(..., engine="jax").step': (
        f'{MLP_ARGS}\nmesh = Mesh(X=2)\ntrainer = Trainer("ddp", mesh, params, Adam(lr=0.01), engine="jax")\n'
        "mesh.fail(X=1)\ntrainer.step(x, dout)"
    ),
    'plan(cfg, "h100", 12, ...)': 'plan(get("llama-tiny"), "h100", 12, batch_tokens=12 * 16, seq=16)',
}
NEEDS_JAX = {
    'engines.jax.run_strategy("pp", Mesh(Z=2), params, x, dout)',
    'engines.jax.run_strategy("ddp", Mesh(X=16), params, x, dout)',
    'Trainer(..., engine="jax").step',
}
EIGHT_DEVICES = 'engines.jax.run_strategy("ddp", Mesh(X=16), params, x, dout)'  # "with 8 devices", as conftest.py sets
WITHOUT_JAX = "import shardsim.engines.jax"
HOST_MEMORY = int(20.9 * 2**30)  # "on a host with 20.9 GiB of memory available"


@dataclass(frozen=True)
class Example:
    section: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.section}: {self.code}"


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (\w+)\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _examples(section: str, body: str) -> list[Example]:
    lines = body.split("\n")
    found = []
    for i, line in enumerate(lines):
        if line != "```" or sum(x == "```" for x in lines[:i]) % 2:
            continue  # not an opening fence
        end = lines.index("```", i + 1)  # a fence left open fails here
        message = "\n".join(lines[i + 1 : end])
        start = max(j for j in range(i - 1) if lines[j] == "") + 1
        paragraph = " ".join(" ".join(lines[start : i - 1]).split())
        assert lines[i - 1] == "" and paragraph.endswith(":"), (
            f"## {section}: no paragraph ending in ':' before {message!r}"
        )
        spans = re.findall(r"`([^`]+)`", paragraph)
        if re.fullmatch(r"(`[^`]+`, )+`[^`]+`:", paragraph):  # a list of calls: one message line each
            messages = message.split("\n")
            assert len(messages) == len(spans), f"## {section}: {len(spans)} calls but {len(messages)} messages"
            found += [Example(section, code, text) for code, text in zip(spans, messages)]
        else:
            found.append(Example(section, spans[0], message))
    return found


def page_examples() -> list[Example]:
    text = PAGE.read_text(encoding="utf-8")
    return [e for name, body in _sections(text).items() for e in _examples(name, body)]


def documented_tree() -> dict[str, tuple[str, ...]]:
    """Each class of the page's tree and its bases: its parent in the tree, then the ``(also ...)``."""
    tree = PAGE.read_text(encoding="utf-8").split("```\n", 2)[1]
    bases: dict[str, tuple[str, ...]] = {}
    parents: list[str] = []
    for line in tree.splitlines():
        m = re.fullmatch(r"([│├└─ ]*)(\w+)(?: \(also ([\w, ]+)\))?", line)
        assert m, f"a line of the tree: {line!r}"
        depth = len(m.group(1)) // 4
        del parents[depth:]
        also = tuple(m.group(3).split(", ")) if m.group(3) else ()
        bases[m.group(2)] = (parents[-1], *also) if parents else ("Exception",)
        parents.append(m.group(2))
    return bases


def section_bases() -> dict[str, tuple[str, ...]]:
    found = {}
    for name, body in _sections(PAGE.read_text(encoding="utf-8")).items():
        m = re.match(r"\s*Bases: (.*?)\.(?:\s|$)", body)
        assert m, f"## {name} starts with 'Bases: ...'"
        found[name] = tuple(re.findall(r"\w+", m.group(1)))
    return found


def code_bases() -> dict[str, tuple[str, ...]]:
    classes = inspect.getmembers(errors, lambda v: inspect.isclass(v) and issubclass(v, errors.ShardsimError))
    return {name: tuple(b.__name__ for b in cls.__bases__) for name, cls in classes}


# -- the class tree and the bases --------------------------------------------------------------
def test_the_tree_is_the_class_hierarchy() -> None:
    assert documented_tree() == code_bases()


def test_every_error_has_a_section_with_its_bases() -> None:
    assert section_bases() == code_bases()


def test_the_errors_module_exports_every_error() -> None:
    assert sorted(errors.__all__) == sorted(code_bases())


# -- the examples ------------------------------------------------------------------------------
def test_every_example_is_counted_and_every_setup_is_used() -> None:
    codes = [e.code for e in page_examples()]
    assert len(codes) == EXAMPLES, f"the page has {len(codes)} examples, this file runs {EXAMPLES}"
    assert len(set(codes)) == len(codes), "two examples with the same code: tell them apart on the page"
    written = set(SETUP) | set(INSTEAD) | NEEDS_JAX
    assert written <= set(codes), f"set up for no example on the page: {written - set(codes)}"
    assert not set(SETUP) & set(INSTEAD)


def namespace() -> dict[str, Any]:
    """The names the page's examples use, and its default ``mesh`` and ``x``."""
    from shardsim import engines
    from shardsim.cost import AxisLink, MatmulEfficiency, estimate, get_hardware, place, scheme_mesh
    from shardsim.models import TransformerConfig, get, reference
    from shardsim.planner import plan
    from shardsim.training import Adam, Trainer, model_memory

    core = ("Mesh", "ShapeDtype", "Plan", "shard", "from_local", "all_gather", "ppermute", "cast", "run_model")
    mesh = shardsim.Mesh(X=2, Y=2)
    return {
        "np": np,
        "shardsim": shardsim,
        **{name: getattr(shardsim, name) for name in core},
        "engines": engines,
        **dict(AxisLink=AxisLink, MatmulEfficiency=MatmulEfficiency, estimate=estimate, get_hardware=get_hardware),
        **dict(place=place, TransformerConfig=TransformerConfig, get=get, reference=reference, plan=plan),
        **dict(Adam=Adam, Trainer=Trainer, model_memory=model_memory, scheme_mesh=scheme_mesh),
        "mesh": mesh,
        "x": shardsim.shard(np.zeros((4, 8)), mesh, "B_X D", label="In"),
    }


def raised(example: Example, monkeypatch: pytest.MonkeyPatch) -> tuple[type[BaseException] | None, str]:
    """The type and message of what ``example`` raises; a command's is the line it prints (the
    command line reports errors, it does not raise them, so it has no type to compare)."""
    if example.code.startswith("shardsim "):
        from shardsim import host  # the host's free memory, read where the command line reads it

        monkeypatch.setattr(host, "available_memory", lambda: HOST_MEMORY)
        stderr = io.StringIO()
        monkeypatch.setattr(sys, "stderr", stderr)
        assert cli.main(shlex.split(example.code)[1:]) == 2
        return None, stderr.getvalue().removesuffix("\n")
    if example.code == WITHOUT_JAX:  # JAX hidden: the engine's package runs again and finds no JAX
        for name in [m for m in sys.modules if m == "shardsim.engines.jax" or m.startswith("shardsim.engines.jax.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setitem(sys.modules, "jax", None)
    if example.code in NEEDS_JAX:
        jax = pytest.importorskip("jax")
        if example.code == EIGHT_DEVICES and jax.device_count() != 8:
            pytest.skip("the page's message is for 8 JAX devices")
    ns = namespace()
    exec(SETUP.get(example.code, ""), ns)
    try:
        exec(INSTEAD.get(example.code, example.code), ns)
    except Exception as e:
        return type(e), str(e)
    raise AssertionError(f"{example} raised nothing")


@pytest.mark.parametrize("example", page_examples(), ids=str)
def test_an_example_raises_the_documented_error_word_for_word(example: Example, monkeypatch) -> None:
    kind, message = raised(example, monkeypatch)
    assert message == example.message
    if kind is not None:
        assert kind is getattr(errors, example.section), f"{example} raised {kind.__name__}"


# -- the public names --------------------------------------------------------------------------
def test_all_names_the_base_error_and_no_other() -> None:
    assert [name for name in shardsim.__all__ if name in errors.__all__] == ["ShardsimError"]
    for name in errors.__all__:  # still attributes of the package, as code and the docs use them
        assert getattr(shardsim, name) is getattr(errors, name)


def test_all_holds_every_name_the_readme_tour_uses() -> None:
    tour = README.read_text(encoding="utf-8").split("## A 15-line tour", 1)[1].split("```python\n", 1)[1]
    used = set(re.findall(r"\bss\.(\w+)", tour.split("```", 1)[0]))
    assert used and used <= set(shardsim.__all__), used - set(shardsim.__all__)
