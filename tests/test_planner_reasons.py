"""A search with no plan says why and names the nearest request that has one, and that request
does have one (the planner is run on it).

The three reasons, each on a request whose answer is derived by hand:

- the batch: a 13B-class model (Llama 2 13B's shape: 40 heads, d_ff 13824, vocabulary 32000)
  on 4,096 TPU v5p chips with only data parallelism, ZeRO and TP. TP divides the 40 heads and
  the 4,096 chips: 1, 2, 4 or 8, which leaves data-parallel degrees 4,096, 2,048, 1,024 and
  512. 3M tokens of 4,096 are 768 = 2^8 x 3 sequences, a multiple of none of them; the nearest
  multiples are 512 (of 512) and 1,024 (of 1,024 and 512);
- memory: the same model on 2 H100s (80 GB). Its layers hold Psi = 40 (4 D^2 + 3 D F) weights;
  at (2 + 2 + 12) bytes a weight (bf16 weights and gradients, float32 master weights and Adam
  moments) split over both chips by ZeRO-3, 8 Psi = 101.5 GB a chip, past 80 GB. On 3 chips
  nothing splits the state (d_model 5120 and the 40 heads do not divide by 3); on 4, 4 Psi =
  50.8 GB leaves room for the activations: 4 is the nearest count;
- the mesh: 12 H100s are not whole nodes of 8 (the nearest that are: 8 and 16), and 29 TPU
  v5p chips (a prime past the pod's longest axis, 28) are no slice of its torus, where 28 and
  30 are (420 sequences divide over both).
"""

from __future__ import annotations

import re
import warnings

import pytest

from shardsim.cost import get_hardware
from shardsim.cost.layer_program import LayerCache
from shardsim.errors import PlannerError
from shardsim.models import get
from shardsim.planner import plan

LLAMA13 = get("llama2-7b").scaled(layers=40, d_model=5120, heads=40, kv_heads=40, d_ff=13824, name="llama2-13b")
DENSE = ("dp", "zero", "tp")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TPU has no measured curves: a CalibrationWarning each search
        yield


def test_a_batch_that_divides_over_no_data_parallel_degree_names_the_nearest_batches():
    with pytest.raises(PlannerError) as err:
        plan(LLAMA13, "tpu-v5p", 4096, "3M", seq=4096, allow=DENSE)
    text = str(err.value)
    assert "takes a batch of 768 sequences of 4096 tokens" in text
    assert "divides over none of the data-parallel degrees the other degrees leave (512, 1,024, 2,048, 4,096)" in text
    assert (
        "the nearest batches that do: 512 sequences (batch_tokens='2M') or 1,024 sequences (batch_tokens='4M')" in text
    )
    for tokens, dp in (("2M", {512}), ("4M", {512, 1024})):
        table = plan(LLAMA13, "tpu-v5p", 4096, tokens, seq=4096, allow=DENSE)
        assert table.rows and {r.plan.dp for r in table.rows} <= dp


def test_nothing_fits_names_the_least_memory_plan_its_need_and_the_nearest_chip_count_that_fits():
    cache = LayerCache(LLAMA13, "h100", seq=4096)
    with pytest.raises(PlannerError) as err:
        plan(LLAMA13, "h100", 2, "64K", seq=4096, allow=DENSE, cache=cache)
    text = str(err.value)
    d, f = LLAMA13.d_model, LLAMA13.d_ff
    state = 16 * LLAMA13.layers * (4 * d * d + 3 * d * f) / 2 / 1e9  # ZeRO-3 over 2 chips: 101.5 GB
    need = re.search(r"the plan needing the least memory, (\S+) mb=\d+, needs at least ([\d.]+) GB per chip of the "
                     r"chip's 80 GB, ([\d.]+) GB short", text)  # fmt: skip
    assert need, text
    assert "zero=3" in need[1] and state <= float(need[2]) <= state + 2.5  # the state and one microbatch's inputs
    assert float(need[3]) == pytest.approx(float(need[2]) - 80, abs=0.05)  # each to four digits
    assert "try more chips (the same request has a plan on 4 chips), a shorter sequence than 4,096" in text
    table = plan(LLAMA13, "h100", 4, "64K", seq=4096, allow=DENSE, cache=cache)
    assert table.rows and table.best.memory["total"] <= 80e9


def test_chips_that_form_no_mesh_name_the_nearest_counts_that_do():
    with pytest.raises(PlannerError) as err:
        plan(LLAMA13, "h100", 12, "48K", seq=4096, allow=DENSE, micro_range=(1, 2))
    text = str(err.value)
    assert text.startswith("12 chips of h100 do not form whole nodes of 8; use a multiple of 8")
    assert text.endswith("the nearest chip counts that form this request's meshes: 8 or 16 chips")
    cache = LayerCache(LLAMA13, "h100", seq=4096)
    for chips in (8, 16):
        assert plan(LLAMA13, "h100", chips, "48K", seq=4096, allow=DENSE, micro_range=(1, 2), cache=cache).rows

    tiny, cache = get("llama-tiny"), LayerCache(get("llama-tiny"), "tpu-v5p", seq=16)
    with pytest.raises(PlannerError) as err:
        plan(tiny, "tpu-v5p", 29, 420 * 16, seq=16, allow=DENSE, micro_range=(1, 4))
    text = str(err.value)
    assert "29 chips of tpu-v5p cannot be laid out" in text
    assert text.endswith("the nearest chip counts that form this request's meshes: 28 or 30 chips")
    for chips in (28, 30):
        assert plan(tiny, "tpu-v5p", chips, 420 * 16, seq=16, allow=DENSE, micro_range=(1, 4), cache=cache).rows


def test_a_space_no_chip_count_opens_says_so_without_a_count():
    # TP 16 over 4 heads: no chip count makes it divide, so no count is named
    with pytest.raises(PlannerError, match=r"satisfies the constraints .*microbatch range$"):
        plan(get("llama-tiny"), "h100", 16, 16 * 16, seq=16, tp=16, pp=1, dp=1)


def test_the_chip_count_named_for_memory_is_the_nearest_whole_number_of_nodes():
    # 405B at 16 sequences of 8K on 8 H100s: the ladder tries 16, 32, 64, then 128 fits and the
    # counts of whole nodes between 64 and 128 are tried too: none has a plan
    cache = LayerCache(get("llama3-405b"), "h100", seq=8192)
    with pytest.raises(
        PlannerError, match=r"727.5 GB short; try more chips \(the same request has a plan on 128 chips\)"
    ):
        plan("llama3-405b", "h100", 8, 16 * 8192, seq=8192, cache=cache)
    assert plan("llama3-405b", "h100", 128, 16 * 8192, seq=8192, cache=cache).rows
    for below in (96, 120):  # out of memory, or 16 sequences over no degree these chips leave
        with pytest.raises(PlannerError, match=rf"(no plan of llama3-405b|fits under no plan) on {below} "):
            plan("llama3-405b", "h100", below, 16 * 8192, seq=8192, cache=cache, nearest=False)


def test_the_nearest_chip_count_may_lie_between_two_doublings():
    # a toy of d_model 48 (ZeRO splits it over 3) on chips of 420 kB, with data parallelism and
    # ZeRO only: on 1 and 2 chips every plan needs more, on 3 one fits, so the answer is 3, not
    # the doubling 4 that the ladder reaches first
    toy = get("llama-tiny").scaled(d_model=48, heads=6, kv_heads=6, d_ff=96, name="tiny48")
    small = get_hardware("h100").with_(hbm_capacity=420e3)
    with pytest.raises(PlannerError, match=r"try more chips \(the same request has a plan on 3 chips\)"):
        plan(toy, small, 1, 12 * 16, seq=16, allow=("dp", "zero"))
    with pytest.raises(PlannerError, match="fits under no plan on 2 h100 chips"):
        plan(toy, small, 2, 12 * 16, seq=16, allow=("dp", "zero"), nearest=False)
    assert plan(toy, small, 3, 12 * 16, seq=16, allow=("dp", "zero")).best.memory["total"] <= 420e3
