"""The time line: prefetch overlap, data dependencies, overlap off, pictures."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from shardsim import Mesh
from shardsim.cost import estimate

D, F = 8192, 32768
V_WEIGHT = 2 * D * F  # bytes of one bf16 weight
AG_S = V_WEIGHT / 1.8e11  # one weight AllGather on a v5p ring with wraparound


def fsdp4(per_chip: int, overlap: bool = True):
    return estimate("fsdp", Mesh(X=16), "tpu-v5p", 16 * per_chip, D, F, layers=4, overlap=overlap, efficiency="ideal")


def test_fsdp_prefetch_hides_the_next_layers_weights():
    est = fsdp4(4096)  # compute-bound: each matmul outlasts one weight AllGather
    bars = est.timeline.bars
    gathers = [b for b in bars if b.op == "all_gather" and b.phase == "forward"]
    matmuls = [b for b in bars if b.op == "matmul" and b.phase == "forward"]
    assert len(gathers) == 8 and len(matmuls) == 8
    # W_in of layer l+1 is gathered while the last matmul of layer l runs
    for layer in range(3):
        nxt = next(b for b in gathers if b.layer == layer + 1 and b.label == f"W_in.{layer + 1}")
        cur = [b for b in matmuls if b.layer == layer][-1]
        assert cur.start <= nxt.start < cur.end
        assert nxt.hidden == pytest.approx(nxt.seconds)
    # only the very first AllGather waits: nothing runs before it
    assert est.comm_exposed_s == pytest.approx(AG_S)
    assert est.comm_hidden_s == pytest.approx(est.comm_s - AG_S)


def test_turning_overlap_off_adds_the_hidden_time():
    for per_chip in (1024, 4096):
        on, off = fsdp4(per_chip), fsdp4(per_chip, overlap=False)
        assert off.step_s == pytest.approx(on.step_s + on.comm_hidden_s)
        assert off.step_s == pytest.approx(off.compute_s + off.comm_s)
        assert off.comm_hidden_s == pytest.approx(0.0, abs=1e-12)


def test_communication_bound_fsdp_step_is_its_communication():
    # far below 2550 tokens per chip the weights' stream sets the pace: the step is the
    # sum of collective times plus the matmuls that cannot overlap anything
    est = fsdp4(256)
    assert est.bound == "communication"
    assert est.comm_s == pytest.approx(4 * 6 * AG_S)
    assert est.step_s >= est.comm_s


def test_doubling_the_batch_doubles_compute_not_weight_traffic():
    small, big = fsdp4(4096), fsdp4(8192)
    assert big.compute_s == pytest.approx(2 * small.compute_s)
    assert big.comm_s == pytest.approx(small.comm_s)
    weights = [b.seconds for b in big.timeline.bars if b.op == "all_gather"]
    assert weights == pytest.approx([AG_S] * len(weights))


def test_compute_waits_for_gathered_weights_through_transposes():
    # the backward matmuls read W.T, an untraced transpose of the gathered W
    est = fsdp4(256)  # communication-bound, so the waits show
    bars = est.timeline.bars
    for b in bars:
        if b.op == "matmul" and b.phase == "backward" and "W_" in b.label:
            weight = b.label.split(" @ ")[1].removesuffix(".T")  # the gathered W, read transposed
            gathers = [g for g in bars if g.op == "all_gather" and g.label == weight and g.phase == "backward"]
            assert len(gathers) == 1 and gathers[0].layer == b.layer
            gather = gathers[0]
            assert b.start >= gather.end - 1e-15


def test_tp_layers_chain_through_their_activations():
    est = estimate("tp", Mesh(Y=8), "tpu-v5p", 8 * 1024, D, F, layers=2, efficiency="ideal")
    bars = est.timeline.bars
    rs0 = next(b for b in bars if b.op == "reduce_scatter" and b.phase == "forward" and b.layer == 0)
    ag1 = next(b for b in bars if b.op == "all_gather" and b.phase == "forward" and b.layer == 1)
    assert ag1.start >= rs0.end  # layer 1's input is layer 0's output
    # the activation collectives sit on the critical path: all of them are exposed
    assert est.comm_exposed_s == pytest.approx(est.comm_s)


def test_ddp_allreduces_run_behind_the_backward_pass():
    est = estimate("ddp", Mesh(X=16), "tpu-v5p", 16 * 8192, D, F, layers=4, efficiency="ideal")
    ars = [b for b in est.timeline.bars if b.op == "all_reduce"]
    assert len(ars) == 8
    assert sum(b.exposed for b in ars[:-1]) == pytest.approx(0.0, abs=1e-12)
    assert est.comm_exposed_s == pytest.approx(ars[-1].exposed)  # only the last one trails


def test_fsdp_tp_axes_overlap_each_other():
    est = estimate("fsdp_tp", Mesh(X=8, Y=8), "tpu-v5p", 64 * 512, D, F, layers=2, efficiency="ideal")
    assert est.timeline.streams() == ["compute", "comm Y", "comm X"]
    x = [b for b in est.timeline.bars if b.stream == "comm X"]
    y = [b for b in est.timeline.bars if b.stream == "comm Y"]
    assert any(a.start < b.end and b.start < a.end for a in x for b in y)


def test_text_gantt_marks_exposed_and_hidden():
    text = fsdp4(2048).timeline.text(width=80)
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith(("compute ", "comm X"))}
    assert set(rows) == {"compute", "comm"}
    assert "#" in rows["comm"] and "=" in rows["comm"]
    assert "f" in rows["compute"] and "b" in rows["compute"]


def test_png_gantt(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "fsdp.png"
    fsdp4(2048).timeline.plot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_without_matplotlib_says_how_to_install(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ImportError, match=r"pip install 'shardsim\[plot\]'"):
        fsdp4(2048).timeline.plot()


def test_importing_the_cost_model_does_not_import_matplotlib():
    code = "import sys, shardsim, shardsim.cost; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("per_chip", [256, 2048, 4096])
def test_schedule_follows_data_flow_not_statement_order(per_chip):
    # fsdp_tp with Y = 1 is FSDP with its statements in another order (the ReduceScatter of
    # dW_out is written before the AllGather of W_out): the same data flow, the same step
    fsdp = estimate("fsdp", Mesh(X=16), "tpu-v5p", 16 * per_chip, D, F, layers=3, efficiency="ideal")
    mixed = estimate("fsdp_tp", Mesh(X=16, Y=1), "tpu-v5p", 16 * per_chip, D, F, layers=3, efficiency="ideal")
    assert mixed.step_s == pytest.approx(fsdp.step_s, rel=1e-12)
    assert mixed.comm_exposed_s == pytest.approx(fsdp.comm_exposed_s, rel=1e-12)


def test_pipeline_stages_get_their_own_compute_streams():
    from shardsim import strategies

    if "pp" not in strategies.names():
        pytest.skip("no pipeline scheme registered")
    est = estimate("pp", Mesh(Z=4), "tpu-v5p", 4 * 4096, D, F, layers=4, efficiency="ideal")
    streams = est.timeline.streams()
    assert [s for s in streams if s.startswith("compute")] == [f"compute Z{z}" for z in range(4)]
    everything = sum(b.seconds for b in est.timeline.bars if b.is_compute)
    # stages work at once: the step is shorter than all matmuls back to back, and no stream
    # runs two matmuls at a time
    assert est.compute_s <= est.step_s < everything
    for s in streams[:4]:
        bars = sorted((b for b in est.timeline.bars if b.stream == s), key=lambda b: b.start)
        assert all(a.end <= b.start + 1e-15 for a, b in itertools.pairwise(bars))
