"""The planner's answer: the plans that fit, ranked, and why the rest were left out.

:class:`PlanTable` prints as a text table (step time, tokens/s, MFU, memory per chip by
category, headroom, what binds), explains why the best plan beats the runner-up (the parts
of their steps side by side) and why the large families of the space were rejected (out of
memory by how much, slower by their lower bound, TP across the slow network...). In a
notebook it shows the same cells as HTML (:func:`shardsim._format.table_html`) with the best
plan's layer time line. :meth:`PlanTable.to_json` gives every figure as plain values.

>>> from shardsim.models import get
>>> from shardsim.planner import plan
>>> t = plan(get("gpt-tiny"), "h100", chips=2, batch_tokens=4 * 16, seq=16, zero=0, recompute="none")
>>> print(chr(10).join(str(t).splitlines()[:2]))  # doctest: +ELLIPSIS
gpt-tiny on 2 h100, 64 tokens per step (4 x 16): ... candidates, ... traced, ... kept in ... s
defaults: attention=flash, precision=bf16 (fp32 master weights and moments), optimizer=adam, efficiency=calibrated
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._format import fmt_time, table_html, table_text
from ..cost.defaults import line
from ..cost.hardware import Hardware
from ..cost.numbers import gb
from ..models import TransformerConfig
from ..plans import ZERO_BUBBLE
from .evaluate import PlanEstimate
from .space import Candidate, Constraints
from .twins import figures


@dataclass(frozen=True)
class Rejection:
    """A candidate left out: ``kind`` ``"memory"`` (its memory lower bound exceeds the chip by
    ``amount`` bytes), ``"oom"`` (its traced memory does, by ``amount``), ``"bound"`` (its time
    lower bound is ``amount`` slower than the best plan, as a fraction), ``"slower"`` (traced,
    it fits but is ``amount`` slower than the best, beyond the window; ``detail`` what binds it)
    or ``"refused"`` (the program refused it: ``detail``). ``step_s`` its step (traced) or
    lower bound, if known; or ``"twin"`` (its program is that of the simpler plan ``detail``,
    kept in its place: :mod:`.twins`)."""

    candidate: Candidate
    kind: str
    amount: float
    step_s: float | None
    detail: str = ""


def family(c: Candidate) -> str:
    """The shape of a plan: its tensor, pipeline and context degrees, and its expert degree
    when it has one (the large families).

    >>> from shardsim.plans import Plan
    >>> family(Candidate(Plan(dp=2, tp=4, pp=2), 1, 2)), family(Candidate(Plan(ep=4), 1, 4))
    ('tp=4,pp=2,cp=1', 'tp=1,pp=1,cp=1,ep=4')
    """
    p = c.plan
    return f"tp={p.tp},pp={p.pp},cp={p.cp}" + (f",ep={p.ep}" if p.ep > 1 else "")


class PlanTable:
    """The ranked plans of one search (see the module doc). ``rows`` fastest first; ``best``
    is ``rows[0]``; ``considered``/``traced``/``kept`` count candidates, distinct layer
    programs traced and plans kept; ``seconds`` the search's wall time."""

    def __init__(
        self,
        model: TransformerConfig,
        hardware: Hardware,
        chips: int,
        batch_tokens: int,
        seq: int,
        rows: list[PlanEstimate],
        rejected: list[Rejection],
        considered: int,
        traced: int,
        seconds: float,
        constraints: Constraints,
        window: float,
    ) -> None:
        self.model, self.hardware, self.chips = model, hardware, chips
        self.batch_tokens, self.seq, self.rows, self.rejected = batch_tokens, seq, rows, rejected
        self.considered, self.traced, self.seconds = considered, traced, seconds
        self.constraints, self.window = constraints, window
        self.defaults: dict[str, str] = {}  # the defaults the search applied (:mod:`shardsim.cost.defaults`)

    # -- the answer -------------------------------------------------------------------------
    @property
    def kept(self) -> int:
        return len(self.rows)

    @property
    def best(self) -> PlanEstimate:
        return self.rows[0]

    @property
    def runner_up(self) -> PlanEstimate | None:
        """The fastest kept plan of another shape (degrees or ZeRO stage) than the best, else the
        next row; never one whose figures are the best's (nothing would tell them apart)."""
        shape, same = _shape(self.best), figures(self.best)
        different = [r for r in self.rows[1:] if figures(r) != same]
        other = [r for r in different if _shape(r) != shape]
        return other[0] if other else (different[0] if different else None)

    def find(self, **degrees: Any) -> list[PlanEstimate]:
        """The kept plans whose plan fields equal ``degrees`` (``tp=8, pp=16, cp=1``), fastest first.

        >>> from shardsim.models import get
        >>> from shardsim.planner import plan
        >>> t = plan(get("gpt-tiny"), "h100", chips=2, batch_tokens=4 * 16, seq=16, zero=0, recompute="none")
        >>> all(r.plan.tp == 2 for r in t.find(tp=2))
        True
        """
        return [r for r in self.rows if all(getattr(r.plan, k) == v for k, v in degrees.items())]

    def slowdown(self, row: PlanEstimate) -> float:
        """How much slower per token ``row`` is than the best (0.05: 5%)."""
        return (row.step_s / row.tokens) / (self.best.step_s / self.best.tokens) - 1

    def why_best(self) -> str:
        """Why the best plan beats the runner-up, in the parts of their steps."""
        b, r = self.best, self.runner_up
        if r is None:
            same = [t.candidate.plan for t in self.rejected if t.kind == "twin" and t.detail == str(b.plan)]
            twins = (
                f"; {', '.join(map(str, same))} {'runs' if len(same) == 1 else 'run'} its very program" if same else ""
            )
            alike = f" (the {len(self.rows) - 1} after it have its figures)" if len(self.rows) > 1 else ""
            return f"{b.plan} is the only plan kept{alike}{twins}."
        diffs = {k: r.parts[k] - b.parts[k] for k in b.parts}
        for axis in set(b.comm_exposed) | set(r.comm_exposed):
            diffs[f"exposed comm {axis}"] = r.comm_exposed.get(axis, 0.0) - b.comm_exposed.get(axis, 0.0)
        main = sorted(diffs.items(), key=lambda kv: -abs(kv[1]))[:3]
        parts = ", ".join(f"{k} {_signed(v)}" for k, v in main if abs(v) > 1e-4 * b.step_s)
        return (
            f"{b.plan} (mb={b.candidate.micro}) beats {r.plan} (mb={r.candidate.micro}) by "
            f"{self.slowdown(r):.1%} per token: the runner-up's {parts or 'parts are equal'}"
            f"; memory {fmt_gb(b.memory['total'])} vs {fmt_gb(r.memory['total'])} per chip."
        )

    def schedules(self) -> str | None:
        """How the best pipelined plan's schedule compares with the best of every other kind
        (zero bubble, interleaved, 1F1B or GPipe): their bubbles and memory, or why none of a
        kind was kept. None without a pipeline."""
        b = self.best
        if b.plan.pp == 1:
            return None
        mine = _schedule_kind(b.plan.schedule)
        best: dict[str, PlanEstimate] = {}
        for e in self.rows:
            if e.plan.pp > 1:
                best.setdefault(_schedule_kind(e.plan.schedule), e)
        text = []
        for kind in ("zero bubble", "interleaved", "1F1B or GPipe"):
            if kind == mine:
                continue
            other = best.get(kind)
            if other is not None:
                text.append(
                    f"{kind} ({other.plan.schedule}, {self.slowdown(other):.1%} slower per token): bubble "
                    f"{fmt_time(other.parts['bubble'])} vs {fmt_time(b.parts['bubble'])}, memory "
                    f"{fmt_gb(other.memory['total'])} vs {fmt_gb(b.memory['total'])}"
                )
                continue
            gone = [
                r
                for r in self.rejected
                if _schedule_kind(r.candidate.plan.schedule) == kind and r.candidate.plan.pp > 1
            ]
            if gone:
                counts = Counter(_REJECTED.get(r.kind, r.kind) for r in gone)
                text.append(f"{kind}: none kept ({', '.join(f'{n} {why}' for why, n in counts.most_common())})")
        return f"{b.plan.schedule} beats " + "; ".join(text) if text else None

    def families(self) -> list[tuple[str, str]]:
        """Each large family (tp, pp, cp and ep) with no kept plan, or whose best is slower, and why."""
        out: dict[str, list[Any]] = {}
        for r in self.rejected:
            out.setdefault(family(r.candidate), [0, []])[1].append(r)
        for e in self.rows:
            out.setdefault(family(e.candidate), [0, []])[0] += 1
        lines = []
        best_family = family(self.best.candidate)
        for fam, (n_kept, rej) in sorted(out.items(), key=lambda kv: -(kv[1][0] + len(kv[1][1]))):
            if fam == best_family:
                continue
            lines.append((fam, self._family_reason(fam, n_kept, rej)))
        return lines

    def _family_reason(self, fam: str, n_kept: int, rej: Sequence[Rejection]) -> str:
        kept = [e for e in self.rows if family(e.candidate) == fam]
        if kept:
            e = kept[0]
            return f"{n_kept} kept; its best is {self.slowdown(e):.1%} slower per token, bound by {e.bound}"
        mem = [r for r in rej if r.kind in ("memory", "oom")]
        bound = [r for r in rej if r.kind == "bound"]
        refused = [r for r in rej if r.kind == "refused"]
        slower = [r for r in rej if r.kind == "slower"]
        if mem and len(mem) == len(rej):
            least = min(mem, key=lambda r: r.amount)
            how = "measured" if least.kind == "oom" else "at least (lower bound)"
            closest = f"{fmt_gb(least.amount)} short ({how}, {least.candidate.describe()})"
            return f"out of memory: {len(mem)} plans, the closest {closest}"
        text = []
        if slower:
            fastest = min(slower, key=lambda r: r.amount)
            text.append(
                f"fits, but its best ({fastest.candidate.describe()}) is {fastest.amount:.1%} slower per token, "
                f"bound by {fastest.detail}"
            )
        if bound:
            least_b = min(bound, key=lambda r: r.amount)
            text.append(f"{len(bound)} slower by their lower bound alone (>= {least_b.amount:.0%} behind the best)")
        if mem:
            closest = fmt_gb(min(r.amount for r in mem))
            text.append(f"{len(mem)} out of memory (closest {closest} short)")
        if refused:
            text.append(f"{len(refused)} refused: {refused[0].detail}")
        tp = int(fam.split(",")[0].split("=")[1])
        net = next(iter(self.hardware.networks.values()))
        domain = getattr(net, "domain", None)
        if domain and tp > domain:
            text.append(f"TP {tp} spans more than one {domain}-chip fast domain: collectives cross the slower network")
        return "; ".join(text)

    def no_plan_reason(self, fits_on: int | None = None) -> str:
        """Why no plan was kept. Out of memory: the plan needing the least, its need against the
        chip's usable memory, and what would close the gap: ``fits_on``, the nearest chip count on
        which the same request has a plan (when the search found one), and the levers the
        constraints hold back."""
        mem = [r for r in self.rejected if r.kind in ("memory", "oom")]
        name = self.model.name or "the model"
        if not mem:
            refused = [r for r in self.rejected if r.kind == "refused"]
            why = refused[0].detail if refused else "every candidate was refused"
            return f"no plan of {name} on {self.chips} {self.hardware.name} chips could be run: {why}"
        least = min(mem, key=lambda r: r.amount)
        cons, hbm = self.constraints, self.hardware.hbm_capacity
        usable = hbm * (1 - cons.headroom)
        fixes = [f"more chips (the same request has a plan on {fits_on:,} chips)" if fits_on else "more chips"]
        fixes.append(f"a shorter sequence than {self.seq:,}")
        if cons.fixed.get("recompute", "full") != "full":
            fixes.append(f"recompute='full' (fixed at {cons.fixed['recompute']!r})")
        if "zero" in cons.fixed or "zero" not in cons.allow:
            fixes.append("a higher ZeRO stage (zero is fixed or not allowed)")
        if cons.micro_range[0] > 1:
            fixes.append(f"a smaller microbatch (micro_range starts at {cons.micro_range[0]})")
        if cons.headroom:
            fixes.append("less headroom")
        if cons.fixed:
            fixes.append("fewer fixed degrees")
        room = f"{fmt_gb(usable)} usable of {fmt_gb(hbm)}" if cons.headroom else f"{fmt_gb(hbm)}"
        return (
            f"{name} fits under no plan on {self.chips} {self.hardware.name} chips: the plan needing the least "
            f"memory, {least.candidate.describe()}, needs {'at least ' if least.kind == 'memory' else ''}"
            f"{fmt_gb(usable + least.amount)} per chip of the chip's {room}, {fmt_gb(least.amount)} short; "
            f"try {', '.join(fixes)}"
        )

    # -- display ----------------------------------------------------------------------------
    def header(self) -> str:
        b = self.batch_tokens
        return (
            f"{self.model.name or 'model'} on {self.chips} {self.hardware.name}, {b} tokens per step "
            f"({b // self.seq} x {self.seq}): {self.considered} candidates, {self.traced} traced, "
            f"{self.kept} kept in {self.seconds:.2f} s"
        )

    def _cells(self, top: int) -> tuple[list[tuple[str, ...]], set[int]]:
        head = ("#", "plan", "mb", "step", "tokens/s", "MFU", "params", "grads", "optimizer", "activations",
                "total", "headroom", "binds")  # fmt: skip
        rows: list[tuple[str, ...]] = [head]
        for i, e in enumerate(self.rows[:top], 1):
            m = e.memory
            rows.append(
                (
                    str(i), str(e.plan), str(e.candidate.micro), fmt_time(e.step_s), f"{e.tokens_per_s:,.0f}",
                    f"{e.mfu:.1%}", fmt_gb(m["params"]), fmt_gb(m["grads"]), fmt_gb(m["optimizer"]),
                    fmt_gb(m["activations"]), fmt_gb(m["total"]), fmt_gb(e.headroom), e.bound,
                )
            )  # fmt: skip
        return rows, {0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}

    def text(self, top: int = 10) -> str:
        """The header, the top ``top`` plans, why the best wins and why families were rejected."""
        rows, right = self._cells(top)
        lines = [self.header(), *([line(self.defaults)] if self.defaults else []), table_text(rows, right), ""]
        lines.append("why: " + self.why_best())
        if (sched := self.schedules()) is not None:
            lines.append("schedule: " + sched)
        fams = self.families()
        if fams:
            lines.append("rejected families:")
            lines += [f"  {f}: {why}" for f, why in fams[:8]]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"<PlanTable {self.header()}>"

    def _repr_html_(self) -> str:
        rows, right = self._cells(10)
        tl = self.best.timeline
        notes = ["why: " + self.why_best(), *[f"{f}: {w}" for f, w in self.families()[:8]]]
        extra = "".join(f"<p>{_esc(s)}</p>" for s in notes)
        picture = f"<pre>{_esc(tl.text(100))}</pre>"
        return table_html(rows, right, caption=self.header()) + extra + picture

    def to_json(self, top: int | None = None) -> str:
        """Every figure as JSON: the search's counts, the ranked rows, the explanations."""
        doc = {
            "model": self.model.name,
            "hardware": self.hardware.name,
            "chips": self.chips,
            "batch_tokens": self.batch_tokens,
            "seq": self.seq,
            "considered": self.considered,
            "traced": self.traced,
            "kept": self.kept,
            "seconds": self.seconds,
            "defaults": self.defaults,
            "rows": [e.row() for e in self.rows[:top]],
            "why": self.why_best(),
            "schedule": self.schedules(),
            "rejected_families": dict(self.families()),
        }
        return json.dumps(doc, indent=2)


_REJECTED = {"bound": "slower by their lower bound", "memory": "out of memory (bound)", "oom": "out of memory",
             "slower": "fit but slower", "refused": "refused"}  # fmt: skip


def _schedule_kind(schedule: str) -> str:
    return "zero bubble" if schedule in ZERO_BUBBLE else "interleaved" if schedule == "interleaved" else "1F1B or GPipe"


def fmt_gb(n: float) -> str:
    """Bytes in GB (10**9), as ``shardsim estimate`` writes them: four significant digits,
    never in exponent form (a toy model's kilobytes too).

    >>> fmt_gb(80e9), fmt_gb(90.912e9), fmt_gb(6.4e6), fmt_gb(28992), fmt_gb(0)
    ('80 GB', '90.91 GB', '0.0064 GB', '0.00002899 GB', '0 GB')
    """
    text = gb(n)
    if "e" in text:  # below 1e-4 GB: the same four digits written out
        text = f"{n / 1e9:.{3 - math.floor(math.log10(abs(n) / 1e9))}f}".rstrip("0")
    return f"{text} GB"


def _shape(e: PlanEstimate) -> tuple[int, ...]:
    p = e.plan
    return (p.dp, p.tp, p.pp, p.cp, p.ep, p.zero)


def _signed(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + fmt_time(abs(seconds))


def _esc(text: str) -> str:
    import html

    return html.escape(text)
