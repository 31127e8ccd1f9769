"""What a JAX user writes by habit is converted or refused at the door, naming shardsim's form.

A ``PartitionSpec`` written as layout text (``"X, None"``), a real ``PartitionSpec`` where a
layout is expected, ``Mesh((2, 2), ("X", "Y"))``, ``Mesh(X=2, devices=4)`` and jax.lax's
keywords on the collectives (``all_gather(x, "Y", axis=1)``); and the runner's own arguments
(``mesh=None``, ``axes=5``, an empty batch). JAX itself is not imported here: the JAX engine's
cases are in ``tests/jax_engine/test_bad_input.py``.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import shardsim
from fuzz_budget import budget
from shardsim import Layout, Mesh, mlp, strategies
from shardsim.layout import Dim
from shardsim.specs import P
from strategies_core import assert_blocks

A = np.arange(16.0).reshape(4, 4)


# -- layout text that is a PartitionSpec --------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "book"),
    [
        ("X, None", "[B_X, D]"),
        ("[X, Y]", "[B_X, D_Y]"),
        ("None, Y", "[B, D_Y]"),
        ("B_X None", "[B_X, D]"),
    ],
)
def test_spec_entries_written_as_a_layout_are_refused_with_the_layout_they_mean(text: str, book: str) -> None:
    mesh = Mesh(X=2, Y=2)
    with pytest.raises(shardsim.LayoutParseError, match="reads like a JAX PartitionSpec") as info:
        shardsim.shard(A, mesh, text)
    assert repr(book) in str(info.value) and "Layout.from_partition_spec(P(" in str(info.value)
    fixed = shardsim.shard(A, mesh, book)  # the suggestion is a layout that shards
    assert_blocks(fixed, A)


def test_the_refusal_holds_for_reshard_and_layout_parse() -> None:
    x = shardsim.shard(A, Mesh(X=2, Y=2), "[B, D]")
    with pytest.raises(shardsim.LayoutParseError, match="reads like a JAX PartitionSpec"):
        shardsim.reshard(x, "X, None")
    with pytest.raises(shardsim.LayoutParseError, match=r"\['None'\]"):
        Layout.parse("X, None")  # None is never a dimension name, with or without a mesh
    assert Layout.parse("X Y") == Layout((Dim("X"), Dim("Y")))  # without a mesh, X and Y are names


@pytest.mark.parametrize(
    ("mesh", "text"),
    [
        (Mesh(T=2), "T_T E"),
        (Mesh(X=2), "[D, F]"),
        (Mesh(D=2), "[B_D, F]"),
        (Mesh(X=2, Y=2), "[X_Y, D]"),
        (Mesh(D=2), "[D, F]"),  # DDP's replicated weight on a mesh whose data axis is called D
        (Mesh(X=2, Y=2), "[X, D_Y]"),  # one unsplit dimension named like an axis, among others
    ],
)
def test_a_dimension_split_over_its_namesake_or_unrelated_to_the_axes_still_parses(mesh: Mesh, text: str) -> None:
    x = shardsim.shard(np.arange(8.0).reshape(2, 4), mesh, text)
    assert_blocks(x, np.arange(8.0).reshape(2, 4))


@pytest.mark.parametrize("text", ["P('X', None)", "('X', None)", "(X, Y)"])
def test_unparsable_spec_text_points_at_from_partition_spec(text: str) -> None:
    with pytest.raises(shardsim.LayoutParseError, match=r"Layout\.from_partition_spec"):
        shardsim.shard(A, Mesh(X=2, Y=2), text)


# -- PartitionSpec objects ----------------------------------------------------------------------
def test_a_partition_spec_is_read_as_jax_reads_it() -> None:
    mesh = Mesh(X=2, Y=2)
    x = shardsim.shard(A, mesh, P("X"))  # short: the last dimension is unsplit, as in JAX
    assert x.layout == Layout((Dim("d0", ("X",)), Dim("d1")))
    assert_blocks(x, A)
    y = shardsim.reshard(shardsim.shard(A, mesh, "[B, D]"), P(None, ("Y", "X")))  # keeps x's names
    assert y.layout == Layout((Dim("B"), Dim("D", ("Y", "X"))))
    assert_blocks(y, A)
    assert Layout.parse(P("X", unreduced={"Y"}), mesh.axis_names) == Layout((Dim("d0", ("X",)),), ("Y",))
    with pytest.raises(shardsim.MeshAxisError, match="'Z'"):
        Layout.parse(P(None, "Z"), mesh.axis_names)


def test_a_plain_tuple_is_refused_naming_the_partition_spec_route() -> None:
    with pytest.raises(shardsim.LayoutParseError, match=r"got tuple \('X', None\).*from_partition_spec"):
        shardsim.shard(A, Mesh(X=2, Y=2), ("X", None))  # type: ignore[arg-type]


def test_reading_specs_never_imports_jax() -> None:
    code = (
        "import sys, numpy as np, shardsim\n"
        "from shardsim.specs import P\n"
        "x = shardsim.shard(np.ones((4, 4)), shardsim.Mesh(X=2), P('X'))\n"
        "assert str(x.layout) == '[d0_X, d1]', x.layout\n"
        "assert 'jax' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@st.composite
def specs(draw: st.DrawFn) -> tuple[Mesh, list[tuple[str, ...]]]:
    names = draw(st.lists(st.sampled_from(["X", "Y", "Z", "data"]), min_size=1, max_size=3, unique=True))
    mesh = Mesh({n: 2 for n in names})
    free = list(draw(st.permutations(names)))
    entries: list[tuple[str, ...]] = []
    for _ in range(2):
        k = draw(st.integers(0, len(free)))
        entries.append(tuple(free[:k]))
        free = free[k:]
    return mesh, entries


def _entry(axes: tuple[str, ...]) -> object:
    return None if not axes else axes[0] if len(axes) == 1 else axes


@budget(40)
@given(specs())
def test_every_spec_shards_as_its_entries_say_and_its_text_is_refused(case: tuple[Mesh, list]) -> None:
    mesh, entries = case
    a = np.arange(64.0).reshape(8, 8)
    x = shardsim.shard(a, mesh, P(*map(_entry, entries)))
    assert x.layout == Layout(tuple(Dim(f"d{i}", e) for i, e in enumerate(entries)))  # by hand: the entries
    assert_blocks(x, a)
    written_entries = [str(_entry(e)) for e in entries if len(e) < 2]  # JAX's entries as text: X, None, data
    text = ", ".join(written_entries)
    # "[X]" alone stays a layout (a dimension called X); with brackets a spec needs two entries or a None
    bracketed = len(written_entries) > 1 or "None" in written_entries
    for written in ((text, f"[{text}]") if bracketed else (text,)) if text else ():
        with pytest.raises(shardsim.LayoutParseError, match="from_partition_spec"):
            shardsim.shard(a, mesh, written)


# -- meshes and collectives ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "same"),
    [
        (lambda: Mesh((2, 2), ("X", "Y")), "Mesh(X=2, Y=2)"),  # type: ignore[call-arg]
        (lambda: Mesh((4, 2), ("data", "model")), "Mesh(data=4, model=2)"),  # type: ignore[call-arg]
        (lambda: Mesh((2, 4)), "Mesh(X=2, Y=4)"),  # type: ignore[arg-type]
    ],
)
def test_jax_positional_meshes_are_refused_with_the_same_mesh_by_name(call: object, same: str) -> None:
    with pytest.raises(shardsim.ArgumentTypeError, match="axes is a mapping") as info:
        call()  # type: ignore[operator]
    assert same in str(info.value)


def test_devices_is_no_axis_name() -> None:
    with pytest.raises(shardsim.MeshAxisError, match=r"collides with JAX's Mesh\(devices"):
        Mesh(X=2, devices=4)
    with pytest.raises(shardsim.MeshAxisError, match="devices"):
        Mesh({"devices": 2})


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda x, p: shardsim.all_gather(x, "Y", axis=1), r"axis=1 is given after the mesh axis.*gather\(x, 'Y'\)"),
        (lambda x, p: shardsim.all_gather(x, axis_name="Y"), "axis_name='Y' is jax.lax's"),
        (lambda x, p: shardsim.all_gather(x, "Y", tiled=True), "always tiled"),
        (lambda x, p: shardsim.all_gather(x, "Y", 1), "takes 2 positional arguments"),
        (lambda x, p: shardsim.all_reduce(p, "X", axis_index_groups=[[0, 1]]), "no axis_index_groups"),
        (lambda x, p: shardsim.reduce_scatter(p, "X", scatter_dimension=0), "dim is JAX's scatter_dimension"),
        (lambda x, p: shardsim.reduce_scatter(p, "X", "B", axis=0), "the dimension it scatters is dim"),
        (lambda x, p: shardsim.all_to_all(x, "Y", split_axis=0, concat_axis=1), "dst_dim is JAX's split_axis"),
        (lambda x, p: shardsim.ppermute(x, "X", perm=[(0, 1), (1, 0)], axis=0), r"ppermute\(x, 'Y', shift\)"),
    ],
)
def test_jax_keywords_on_collectives_are_refused_naming_shardsims_form(call: object, match: str) -> None:
    mesh = Mesh(X=2, Y=2)
    x = shardsim.shard(A, mesh, "B D_Y")
    p = shardsim.from_local(np.ones((2, 2, 4, 4)), mesh, "[B, D]{U_X}")
    with shardsim.trace() as t, pytest.raises(shardsim.ArgumentTypeError, match=match):
        call(x, p)  # type: ignore[operator]
    assert len(t) == 0  # refused before any work


def test_collectives_still_take_their_own_keywords() -> None:
    x = shardsim.shard(A, Mesh(X=2, Y=2), "B D_Y")
    np.testing.assert_array_equal(shardsim.all_gather(x=x, axis="Y", label="g").to_global(), A)
    assert shardsim.ppermute(x, axis="Y", shift=1, label="r").layout == x.layout


# -- the runner's arguments ---------------------------------------------------------------------
P8 = mlp.init(8, 16)
X8 = np.ones((8, 8), np.float32)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mesh": None}, "ddp: mesh must be a shardsim.Mesh"),
        ({"axes": 5}, r"axes=5 must be a mapping of the scheme's roles \['data'\].*axes=\{'data': 'X'\}"),
        ({"axes": ["X"]}, r"axes=\['X'\] must be a mapping"),
    ],
)
def test_run_strategy_refuses_a_mesh_or_axes_of_the_wrong_kind(kwargs: dict, match: str) -> None:
    args = {"mesh": Mesh(X=2), **kwargs}
    with pytest.raises(shardsim.ArgumentTypeError, match=match):
        shardsim.run_strategy("ddp", params=P8, x=X8, dout=X8, **args)


@pytest.mark.parametrize("scheme", strategies.names())
def test_an_empty_batch_is_refused_up_front_by_every_scheme(scheme: str) -> None:
    from shardsim.cli import demo_mesh

    sc = strategies.get(scheme)
    mesh, axes = demo_mesh(sc, None, None)
    empty = np.ones((0, 8), np.float32)
    with shardsim.trace() as t, pytest.raises(shardsim.ModelInputError, match=f"{scheme}: x has 0 tokens"):
        shardsim.run_strategy(scheme, mesh, sc.init(8, 16), empty, empty, axes=axes)
    assert len(t) == 0


def test_a_trainer_step_on_an_empty_batch_is_refused() -> None:
    from shardsim.training import SGD, Trainer

    trainer = Trainer("ddp", Mesh(X=2), P8, SGD(lr=0.1))
    with pytest.raises(shardsim.ModelInputError, match="x has 0 tokens"):
        trainer.step(np.ones((0, 8)), np.ones((0, 8)))
    assert trainer.step_count == 0
