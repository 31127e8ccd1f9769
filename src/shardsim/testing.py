"""Testing your own code against shardsim: hold a scheme to its reference, and draw sharded inputs.

:func:`check_scheme` runs a scheme (registered, by name, or a :class:`~shardsim.strategies.Scheme`
of your own) forward and backward over generated meshes, shapes, activations and dtypes, and
compares its output and every gradient with the scheme's single-device ``reference``; the
first mismatch raises ``AssertionError`` with the inputs that produced it and the call that
repeats it. It draws its cases with NumPy from a seed, so it needs nothing else.

:func:`meshes`, :func:`layouts` and :func:`sharded_arrays` are hypothesis strategies in the
style of ``hypothesis.extra.numpy``; hypothesis is imported only when one of them is called.

>>> runs = check_scheme("fsdp_tp", examples=2)
>>> [str(r.result.mesh) for r in runs]
['Mesh(X=2, Y=2)', 'Mesh(X=4, Y=2)']
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .array import ShardedArray, compact_shape, from_local
from .errors import ShardingError
from .layout import Dim, Layout
from .mesh import Mesh

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from .cli.demo_run import DemoRun
    from .strategies import Scheme

AXIS_NAMES = (("X", "Y", "Z", "W"), ("data", "model", "pipe", "expert"))  # short, and brace-printed long
DIM_NAMES = ("B", "D", "F", "L")
ACTIVATIONS = ("identity", "relu", "gelu")
DTYPES = ("float32", "float64")


# -- check a scheme against its reference ---------------------------------------------------------
def check_scheme(
    scheme: str | Scheme,
    *,
    examples: int = 10,
    seed: int = 0,
    axis_sizes: Sequence[int] = (1, 2, 4),
    max_chips: int = 8,
    sizes: Sequence[int] = (1, 2, 3),
    activations: Sequence[str] = ACTIVATIONS,
    dtypes: Sequence[str] = DTYPES,
    options: Mapping[str, Any] | None = None,
) -> list[DemoRun]:
    """Run ``scheme`` on ``examples`` generated cases and hold each to the scheme's reference.

    Each case draws one mesh axis per role of the scheme, of a size from ``axis_sizes`` (at most
    ``max_chips`` chips, at least one axis above 1 when the sizes allow it), a batch, ``d_model``
    and ``d_ff`` that are multiples of the chip count (times a factor from ``sizes``; the batch
    twice that, so microbatches divide), an activation and a dtype. ``options`` go to the scheme
    and its reference, as ``run_strategy(..., **options)`` does. Values are compared as
    ``shardsim demo`` compares them: within a few ulps times the square root of the longest
    contraction, relative to the largest expected value.

    Returns the runs (:class:`shardsim.cli.DemoRun`) when every case matches; otherwise raises
    ``AssertionError`` naming the first case, the value that differs, its error and tolerance,
    and the ``shardsim.cli.run_demo`` call that repeats the case alone. An exception the scheme
    raises on a case is reported the same way, with the exception chained.

    >>> runs = check_scheme("pp", examples=2, options={"schedule": "gpipe"})
    >>> [(str(r.result.mesh), r.inputs["x"].shape, r.ok) for r in runs]
    [('Mesh(Z=4)', (16, 8), True), ('Mesh(Z=2)', (12, 6), True)]
    """
    from . import strategies
    from .cli.demo_run import default_mesh, run_demo

    the_scheme = scheme if isinstance(scheme, strategies.Scheme) else strategies.get(scheme)
    _, roles = default_mesh(the_scheme)  # role -> axis name, as the demo names them
    runs = []
    for k in range(examples):
        rng = np.random.default_rng([seed, k])
        mesh = _draw_mesh(rng, list(roles.values()), axis_sizes, max_chips)
        chips = math.prod(mesh.values())
        case: dict[str, Any] = {
            "batch": 2 * chips * int(rng.choice(sizes)),
            "d_model": chips * int(rng.choice(sizes)),
            "d_ff": chips * int(rng.choice(sizes)),
            "mesh": mesh,
            "axes": roles,
            "activation": str(rng.choice(list(activations))),
            "dtype": str(rng.choice(list(dtypes))),
            "seed": seed * 1000 + k,
            "options": dict(options or {}),
        }
        try:
            run = run_demo(the_scheme, **case)
        except Exception as e:
            why = f"the scheme raised {type(e).__name__}: {e}"
            if isinstance(e, ShardingError):
                why += "\n  (if the scheme cannot take such inputs, narrow the cases: axis_sizes=, sizes=, options=)"
            raise AssertionError(_report(the_scheme, k, case, why)) from e
        bad = [c for c in run.checks if not c[3]]
        if bad:
            name, err, tol, _ = bad[0]
            why = f"{name} differs from the reference: max abs error {err:.3g} > tolerance {tol:.3g}"
            raise AssertionError(_report(the_scheme, k, case, why))
        runs.append(run)
    return runs


def _draw_mesh(
    rng: np.random.Generator, axes: Sequence[str], axis_sizes: Sequence[int], max_chips: int
) -> dict[str, int]:
    """One size per axis from ``axis_sizes``, at most ``max_chips`` chips; redrawn (a few times) if all are 1."""
    sizes: dict[str, int] = {}
    for _ in range(8):
        sizes, budget = {}, max_chips
        for i in rng.permutation(len(axes)):  # no axis always gets what the others left
            fits = [s for s in axis_sizes if s <= budget] or [1]
            sizes[axes[i]] = int(rng.choice(fits))
            budget //= sizes[axes[i]]
        if math.prod(sizes.values()) > 1:
            break
    return {a: sizes[a] for a in axes}


def _report(scheme: Scheme, k: int, case: Mapping[str, Any], why: str) -> str:
    from . import strategies

    shown = ", ".join(f"{key}={value!r}" for key, value in case.items())
    registered = scheme.name in strategies.names() and strategies.get(scheme.name) is scheme
    return (
        f"check_scheme({scheme.name!r}): case {k}: {why}\n"
        f"  inputs: {shown}\n"
        f"  repeat it: shardsim.cli.run_demo({repr(scheme.name) if registered else 'scheme'}, {shown})"
    )


# -- hypothesis strategies --------------------------------------------------------------------------
def meshes(*, min_axes: int = 1, max_axes: int = 3, max_size: int = 8, max_chips: int = 64) -> SearchStrategy[Mesh]:
    """Meshes of ``min_axes`` to ``max_axes`` axes (up to 4), each of 1 to ``max_size`` chips, at most
    ``max_chips`` in all; axes named ``X, Y, Z, W`` or ``data, model, pipe, expert``.

    >>> from hypothesis import given
    >>> @given(meshes(max_axes=2))
    ... def test(mesh):
    ...     assert 1 <= len(mesh.axis_names) <= 2 and mesh.size <= 64
    >>> test()
    """
    _require_hypothesis()
    from hypothesis import strategies as st

    @st.composite
    def draw_mesh(draw: st.DrawFn) -> Mesh:
        n = draw(st.integers(min_axes, max_axes))
        names = draw(st.sampled_from(AXIS_NAMES))[:n]
        sizes: list[int] = []
        budget = max_chips
        for _ in names:
            size = draw(st.integers(1, max(1, min(max_size, budget))))
            sizes.append(size)
            budget //= size
        return Mesh(dict(zip(names, sizes)))

    return draw_mesh()


def layouts(
    mesh: Mesh, ndim: int, *, partial: bool = False, names: Sequence[str] = DIM_NAMES
) -> SearchStrategy[Layout]:
    """Legal layouts of ``ndim`` dimensions on ``mesh``: each mesh axis splits one dimension (in any
    order with the others there), is a partial sum (with ``partial=True``) or is unused.

    Dimensions are called ``names`` (``d4``, ``d5``... past their end).

    >>> from hypothesis import given
    >>> from shardsim import Mesh
    >>> @given(layouts(Mesh(X=2, Y=2), 2, partial=True))
    ... def test(layout):
    ...     assert layout.rank == 2 and len(layout.used_axes()) <= 2
    >>> test()
    """
    _require_hypothesis()
    from hypothesis import strategies as st

    dim_names = [names[i] if i < len(names) else f"d{i}" for i in range(ndim)]

    @st.composite
    def draw_layout(draw: st.DrawFn) -> Layout:
        slots: list[list[str]] = [[] for _ in range(ndim + 1)]  # one per dim, then the partial sum
        for axis in draw(st.permutations(mesh.axis_names)):
            where = draw(st.integers(-1, ndim if partial else ndim - 1))  # -1: replicated
            if where >= 0:
                slots[where].append(axis)
        return Layout(tuple(Dim(dim_names[i], tuple(slots[i])) for i in range(ndim)), tuple(slots[ndim]))

    return draw_layout()


def sharded_arrays(
    mesh: Mesh | SearchStrategy[Mesh] | None = None,
    layout: Layout | str | None = None,
    *,
    ndim: int | None = None,
    dtype: Any = np.float64,
    partial: bool = False,
    max_local: int = 3,
    elements: SearchStrategy[Any] | None = None,
) -> SearchStrategy[ShardedArray]:
    """Sharded values: on ``mesh`` (default: drawn by :func:`meshes`), as ``layout`` (default: drawn
    by :func:`layouts`, of ``ndim`` dimensions, 1 to 3 if not given), with a global shape that
    divides (1 to ``max_local`` elements per chip along each dimension) and every chip's block
    drawn from ``elements`` (default: finite values of ``dtype`` in [-1000, 1000]), as
    ``hypothesis.extra.numpy.arrays`` draws them. A partial-sum layout's chips get their own
    blocks, whose sum is the value.

    >>> from hypothesis import given
    >>> from shardsim import Mesh
    >>> @given(sharded_arrays(Mesh(X=2), "[B_X, D]"))
    ... def test(x):
    ...     assert x.global_shape[0] % 2 == 0 and str(x.layout) == "[B_X, D]"
    >>> test()
    """
    _require_hypothesis()
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    dt = np.dtype(dtype)
    if elements is None:
        bounds: dict[str, Any] = {"min_value": 0 if dt.kind == "u" else -1000, "max_value": 1000}
        if dt.kind in "fc":
            bounds.update(allow_nan=False, allow_infinity=False)
        elements = hnp.from_dtype(dt, **(bounds if dt.kind in "fiuc" else {}))
    mesh_strategy = mesh if mesh is not None and not isinstance(mesh, Mesh) else None

    @st.composite
    def draw_array(draw: st.DrawFn) -> ShardedArray:
        m = draw(mesh_strategy) if mesh_strategy is not None else mesh if isinstance(mesh, Mesh) else draw(meshes())
        if layout is not None:
            lay = Layout.parse(layout, m.axis_names)
        else:
            lay = draw(layouts(m, ndim if ndim is not None else draw(st.integers(1, 3)), partial=partial))
        local = tuple(draw(st.integers(1, max_local)) for _ in lay.dims)
        blocks = draw(hnp.arrays(dt, compact_shape(m, lay, local), elements=elements))  # one block per replica group
        return from_local(np.broadcast_to(blocks, m.shape + local), m, lay)

    return draw_array()


def _require_hypothesis() -> None:
    if importlib.util.find_spec("hypothesis") is None:  # pragma: no cover - depends on the environment
        raise ShardingError("shardsim.testing's strategies need hypothesis: pip install hypothesis (or shardsim[test])")


__all__ = ["check_scheme", "layouts", "meshes", "sharded_arrays"]
