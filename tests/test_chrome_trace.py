"""Trace and time-line export to the Trace Event Format (Perfetto, chrome://tracing), and Trace.to_records.

The JSON is checked against the format's rules (every event's required keys, one named thread
per track, complete events that nest on each thread) and against the program's own numbers:
every slice's args are its event's fields, every time its bar's.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import shardsim as ss
from shardsim import mlp
from shardsim.cost import build_timeline, get_hardware, place, scheme_program, timeline_of
from shardsim.tracing import Event

TOL_US = 2e-3  # times are written to the nanosecond


def run(name: str, mesh: ss.Mesh, **options) -> ss.strategies.StrategyResult:
    params = mlp.init(8, 16, seed=0) if name not in ("pp", "dp_pp") else ss.strategies.get(name).init(8, 16, seed=0)
    x = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    return ss.run_strategy(name, mesh, params, x, x, **options)


def check_format(doc: dict) -> dict[int, str]:
    """Validate the document; return each thread's name."""
    assert set(doc) >= {"traceEvents"}
    events = doc["traceEvents"]
    names = {}
    for e in events:
        assert {"ph", "pid", "tid", "name"} <= set(e), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "thread_sort_index") and "args" in e
            if e["name"] == "thread_name":
                assert e["tid"] not in names, "one name per thread"
                names[e["tid"]] = e["args"]["name"]
        else:
            assert e["ph"] == "X" and {"ts", "dur", "cat", "args"} <= set(e), e
            assert e["dur"] >= 0 and e["ts"] >= 0
    assert len(set(names.values())) == len(names), "one thread per track"
    threads: dict[int, list[dict]] = {}
    for e in events:
        if e["ph"] == "X":
            assert e["tid"] in names, "every slice is on a named thread"
            threads.setdefault(e["tid"], []).append(e)
    for tid, slices in threads.items():
        slices.sort(key=lambda e: (e["ts"], -e["dur"], e["cat"] != "phase"))
        open_: list[dict] = []
        for e in slices:
            while open_:  # close the slices that end before this one starts
                p, end = open_[-1], open_[-1]["ts"] + open_[-1]["dur"]
                instant_in_phase = p["cat"] == "phase" != e["cat"] and e["dur"] == 0 and e["ts"] <= end + TOL_US
                if e["ts"] < end - TOL_US or instant_in_phase:
                    break
                open_.pop()
            if open_:  # inside the slice still open: it must end inside it too
                parent = open_[-1]
                assert e["ts"] + e["dur"] <= parent["ts"] + parent["dur"] + TOL_US, (names[tid], parent, e)
            if e["cat"] == "phase":
                assert not open_, "phases are the outer slices"
            else:
                assert open_ and open_[-1]["cat"] == "phase", f"{e['name']} lies in no phase"
                assert open_[-1]["name"] == e["args"]["phase"], "a slice lies in its own phase"
            open_.append(e)
    return names


def leaves(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != "phase"]


def as_json(value):
    return json.loads(json.dumps(value))


# -- the trace, in event order ------------------------------------------------------------------------
def test_a_trace_exports_one_slice_per_event_with_its_fields(tmp_path) -> None:
    t = run("fsdp_tp", ss.Mesh(X=2, Y=2), activation="relu").trace
    path = tmp_path / "trace.json"
    returned = t.to_chrome_trace(path)
    doc = json.loads(path.read_text())
    assert doc == as_json(returned)
    names = check_format(doc)
    assert sorted(names.values()) == ["chips", "network X", "network Y"]
    slices = leaves(doc)
    assert len(slices) == len(t.events)
    for s in slices:
        e = t.events[s["args"]["index"]]
        assert s["args"] == as_json(dataclasses.asdict(e))  # bytes, FLOPs, layouts: the event's own
        assert (s["ts"], s["dur"]) == (e.index, 1)  # event order as time
        want = "network " + ",".join(e.axes) if e.is_collective else "chips"
        assert names[s["tid"]] == want
        assert s["cat"] == ("collective" if e.is_collective else "compute")
    assert sum(s["args"]["sent_bytes"] for s in slices) == t.total("sent_bytes")
    assert sum(s["args"]["flops"] for s in slices) == t.total("flops")


def test_phases_are_slices_around_their_events() -> None:
    t = run("ddp", ss.Mesh(X=2)).trace
    doc = t.to_chrome_trace()
    names = check_format(doc)
    phases = [(names[e["tid"]], e["name"], e["ts"], e["dur"]) for e in doc["traceEvents"] if e.get("cat") == "phase"]
    n_fwd = len([e for e in t.events if e.phase == "forward"])
    n = len(t.events)
    # the forward pass is all matmuls; the backward both matmuls and AllReduces, on their own track
    assert ("chips", "forward", 0, n_fwd) in phases
    bwd = [p for p in phases if p[1] == "backward"]
    assert {p[0] for p in bwd} == {"chips", "network X"}
    assert min(p[2] for p in bwd) >= n_fwd and max(p[2] + p[3] for p in bwd) == n


def test_pipeline_stages_get_a_track_each() -> None:
    t = run("pp", ss.Mesh(Z=2), microbatches=2).trace
    names = check_format(t.to_chrome_trace())
    wheres = {e.where for e in t.events}
    assert wheres == {"Z0", "Z1"}
    want = {f"chips {e.where}" for e in t.events if not e.is_collective}
    want |= {f"network {','.join(e.axes)} {e.where}" for e in t.events if e.is_collective}
    assert set(names.values()) == want and {"chips Z0", "chips Z1"} <= want


# -- the cost model's time line ----------------------------------------------------------------------------
def test_a_time_line_exports_its_bars_at_their_times(tmp_path) -> None:
    v5p, mesh = get_hardware("tpu-v5p"), ss.Mesh(X=4, Y=2)
    prog = scheme_program("fsdp_tp", mesh, batch=8 * 1024, d_model=4096, d_ff=16384, layers=3)
    tl = build_timeline(prog.steps, v5p, place(v5p, mesh))
    doc = tl.to_chrome_trace(tmp_path / "tl.json")
    assert json.loads((tmp_path / "tl.json").read_text()) == as_json(doc)
    names = check_format(doc)
    assert set(names.values()) <= set(tl.streams()) | {f"{s} (2)" for s in tl.streams()}
    assert {"compute", "comm X", "comm Y"} <= set(names.values())
    slices = leaves(doc)
    assert len(slices) == len(tl.bars)
    bars = {b.index: b for b in tl.bars}
    for s in slices:
        b = bars[s["args"]["index"]]
        assert s["ts"] == pytest.approx(b.start * 1e6, abs=TOL_US)
        assert s["dur"] == pytest.approx(b.seconds * 1e6, abs=TOL_US)
        assert names[s["tid"]].split(" (")[0] == b.stream
        assert (s["args"]["nbytes"], s["args"]["flops"], s["args"]["hidden"]) == (b.nbytes, b.flops, b.hidden)
    end = max(s["ts"] + s["dur"] for s in slices)
    assert end == pytest.approx(tl.step_s * 1e6, abs=TOL_US)


def test_a_trace_takes_the_time_line_made_from_it() -> None:
    mesh = ss.Mesh(X=4)
    p = {k: ss.ShapeDtype(v.shape, "bfloat16") for k, v in mlp.init(1024, 4096).items()}
    x = ss.ShapeDtype((4 * 512, 1024), "bfloat16")
    t = ss.run_strategy("fsdp", mesh, p, x, x).trace
    tl = timeline_of(t, "tpu-v5p", mesh)
    doc = t.to_chrome_trace(timeline=tl)
    check_format(doc)
    slices = leaves(doc)
    assert len(slices) == len(tl.bars) == len(t.events)
    for s in slices:
        b, e = tl.bars[[b.index for b in tl.bars].index(s["args"]["index"])], t.events[s["args"]["index"]]
        assert s["args"]["sent_bytes"] == e.sent_bytes and s["args"]["start_s"] == b.start
        assert s["ts"] == pytest.approx(b.start * 1e6, abs=TOL_US)
    other = ss.run_strategy("ddp", mesh, p, x, x).trace
    with pytest.raises(ss.ShardingError, match="timeline_of"):
        other.to_chrome_trace(timeline=tl)


def test_overlapping_slices_on_one_track_go_to_a_second_lane() -> None:
    from shardsim.trace_events import TraceSlice, write_chrome_trace

    a, b, c = (TraceSlice("comm X", n, "forward", t0, t1, {"phase": "forward"}) for n, t0, t1 in
               (("a", 0.0, 10.0), ("b", 5.0, 12.0), ("c", 10.0, 11.0)))  # fmt: skip
    doc = write_chrome_trace([a, b, c], None, "p")
    names = check_format(doc)
    lanes = {names[s["tid"]]: [x["name"] for x in leaves(doc) if x["tid"] == s["tid"]] for s in leaves(doc)}
    assert lanes == {"comm X": ["a", "c"], "comm X (2)": ["b"]}


# -- records ------------------------------------------------------------------------------------------------
def test_records_are_the_events_fields() -> None:
    t = run("tp", ss.Mesh(Y=2)).trace
    records = t.to_records()
    fields = [f.name for f in dataclasses.fields(Event)]
    assert len(records) == len(t.events)
    for r, e in zip(records, t.events):
        assert type(r) is dict and list(r) == fields
        assert r == {f: getattr(e, f) for f in fields}
    assert sum(r["sent_bytes"] for r in records) == t.total("sent_bytes")


def test_records_make_a_dataframe() -> None:
    pd = pytest.importorskip("pandas")
    t = run("tp", ss.Mesh(Y=2)).trace
    frame = pd.DataFrame(t.to_records())
    assert len(frame) == len(t.events) and frame["sent_bytes"].sum() == t.total("sent_bytes")


def test_args_are_strict_json(tmp_path) -> None:
    """JSON has no inf or nan (trace viewers refuse them); NumPy numbers and tuples become plain."""
    from shardsim.trace_events import TraceSlice, write_chrome_trace

    args = {"phase": "forward", "intensity": float("inf"), "flops": np.int64(8), "axes": ("X", "Y")}
    write_chrome_trace([TraceSlice("compute", "m", "forward", 0.0, 1.0, args)], tmp_path / "t.json", "p")
    doc = json.loads((tmp_path / "t.json").read_text())
    assert leaves(doc)[0]["args"] == {"phase": "forward", "intensity": "inf", "flops": 8, "axes": ["X", "Y"]}


def test_several_programs_go_in_one_file_a_process_each(tmp_path) -> None:
    """What ``--chrome-trace`` writes for a demo of several schemes, or a trace beside its time line."""
    from shardsim.trace_events import export_chrome_trace

    mesh = ss.Mesh(X=2, Y=2)
    traces = {n: run(n, mesh).trace for n in ("ddp", "fsdp_tp")}
    shape_only = {k: ss.ShapeDtype(v.shape, "bfloat16") for k, v in mlp.init(512, 2048).items()}
    x = ss.ShapeDtype((1024, 512), "bfloat16")
    tl = timeline_of(ss.run_strategy("fsdp", ss.Mesh(X=4), shape_only, x, x).trace, "tpu-v5e", ss.Mesh(X=4))
    doc = export_chrome_trace({**traces, "fsdp on v5e": tl}, tmp_path / "all.json")
    assert json.loads((tmp_path / "all.json").read_text()) == doc
    processes = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert processes == {1: "ddp", 2: "fsdp_tp", 3: "fsdp on v5e"}
    for pid, program in zip(processes, [*traces.values(), tl]):
        alone = program.to_chrome_trace()
        mine = [e for e in doc["traceEvents"] if e["pid"] == pid]
        assert [{**e, "pid": 1} for e in mine[1:]] == alone["traceEvents"][1:]  # the same, under its own pid
        check_format({"traceEvents": mine})
