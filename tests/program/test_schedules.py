"""Pipeline schedules as programs (no MPI): the slot orders of GPipe, 1F1B, ZB and interleaved, each rank's stage, the
pipelined plan's programs (proved like any other), and a placement whose 1F1B calls would cross,
which the proof refuses in one line before any rank starts."""
import collections

import pytest

import nets
from singa_mpi.errors import ConfigError
from singa_mpi.planner import plan as make_plan
from singa_mpi.planner import partition
from singa_mpi.program.actions import Compute, GradsFinal, RunQueued
from singa_mpi.program.build import programs
from singa_mpi.program.job import job_programs
from singa_mpi.planner.pipeline import interleaved_stages
from singa_mpi.program.schedules import (interleaved_orders, interleaved_play, slot_times, slots, stages_of, timeline,
                                         unit_stage, virtual_stages)
from singa_mpi.program.units import units_of_plan


def test_gpipe_runs_every_forward_then_every_backward():
    assert slots("gpipe", 3, 0, 2) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]


@pytest.mark.parametrize("stage,expected", [
    (0, "F0 F1 F2 F3 B0 F4 B1 B2 B3 B4"),  # warm-up of S-1-s = 3 forwards
    (2, "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4"),
    (3, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4"),  # the last stage alternates from the start
])
def test_1f1b_warms_up_then_alternates(stage, expected):
    assert " ".join(f"{k}{m}" for k, m in slots("1f1b", 5, stage, 4)) == expected


def test_1f1b_holds_at_most_stages_minus_stage_micro_batches():
    for stage in range(4):
        held = peak = 0
        for kind, _ in slots("1f1b", 8, stage, 4):
            held += 1 if kind == "F" else -1
            peak = max(peak, held)
        assert peak == 4 - stage
        assert max(1 if k == "F" else 0 for k, _ in slots("gpipe", 8, stage, 4)) == 1


def test_the_bubble_of_equal_stages_is_s_minus_1_over_m_plus_s_minus_1():
    for schedule in ("gpipe", "1f1b"):
        placed = slot_times(schedule, 4, 3)
        length = max(t for row in placed.values() for t, _, _ in row) + 1
        busy = sum(len(row) for row in placed.values())
        assert length == 2 * (4 + 3 - 1)  # (M + S - 1) forward and as many backward units
        assert 1 - busy / (3 * length) == pytest.approx((3 - 1) / (4 + 3 - 1))


def test_zb_defers_the_last_stage_s_weight_gradients_past_the_next_backward():
    """Two stages, two micro-batches: 1F1B's last stage computes micro-batch 0's weight gradients
    before micro-batch 1's forward, while the first stage waits for micro-batch 1's gradient; ZB
    runs them after it, as one slot of both micro-batches, and the first stage fills its wait with
    micro-batch 0's."""
    assert " ".join(f"{k}{m}" for k, m in slots("zb", 2, 0, 2)) == "F0 F1 B0 W0 B1 W1"
    assert " ".join(f"{k}{m}" for k, m in slots("zb", 2, 1, 2)) == "F0 B0 F1 B1 W0 W1"
    placed = slot_times("zb", 2, 2)
    length = max(t for row in placed.values() for t, _, _ in row) + 1
    assert length == 7  # 1F1B's picture, its W inside B (two units), is 8 units long
    assert [(t, f"{k}{m}") for t, k, m in placed[1]] == [(1, "F0"), (2, "B0"), (3, "F1"), (4, "B1"), (5, "W0"),
                                                         (6, "W1")]


@pytest.mark.parametrize("stages,micro", [(2, 1), (2, 8), (3, 3), (4, 8), (4, 2), (5, 16)])
def test_zb_runs_1f1b_s_order_each_weight_slot_after_its_backward_holding_at_most_s(stages, micro):
    for stage in range(stages):
        order = slots("zb", micro, stage, stages)
        assert [s for s in order if s[0] != "W"] == slots("1f1b", micro, stage, stages)
        assert sorted(m for k, m in order if k == "W") == list(range(micro))
        held = peak = 0
        for index, (kind, m) in enumerate(order):
            if kind == "W":
                assert order.index(("B", m)) < index
            held += {"F": 1, "B": 0, "W": -1}[kind]
            peak = max(peak, held)
        assert peak <= stages and held == 0


def _mlp(nranks, micro, schedule, scheme="stages", batch=19):
    return nets.job(nets.pipelined(nets.mlp("/tmp/unused.h5", batch, scheme, nranks, steps=2), micro, schedule))


def test_a_pipelined_plan_holds_each_sub_layer_and_exchange_once_per_micro_batch():
    plain = partition(_mlp(3, 1, "1f1b"), 3)
    piped = partition(_mlp(3, 4, "1f1b"), 3)
    assert plain.pipeline is None and piped.pipeline.micro_batches == 4
    assert len(piped.sublayers) == 4 * len(plain.sublayers)
    assert len(piped.exchanges) == 4 * len(plain.exchanges)
    assert [e.id for e in piped.exchanges] == list(range(len(piped.exchanges)))  # each its own tags
    rows = collections.defaultdict(list)
    for sub in piped.sublayers:
        if sub.origin == "fc1":
            rows[sub.micro].append(sub.batch_slice)
    assert [rows[m] for m in range(4)] == [[(0, 5)], [(5, 10)], [(10, 15)], [(15, 19)]]  # contiguous blocks
    assert piped.param_syncs == plain.param_syncs  # a rank's micro-batches share its params


def test_each_rank_s_stage_is_where_its_layers_start():
    assert stages_of(partition(_mlp(4, 2, "1f1b"), 4)) == {0: 0, 1: 1, 2: 2, 3: 3}
    # the first layers split on the batch over every worker: the workers meet in collectives, one stage
    assert set(stages_of(partition(_mlp(2, 2, "1f1b", "stages-hybrid"), 2)).values()) == {0}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb"])
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_pipelined_programs_are_proved_and_sum_every_micro_batch(schedule, nranks):
    cfg = _mlp(nranks, 3, schedule)
    built = job_programs(cfg, nranks, ["train"])  # proved, or it raises
    for rank, prog in built.programs[("train", "shared_memory")].items():
        computes = [a for a in prog.actions if isinstance(a, Compute)]
        layers = {a.layer.rsplit("/mb", 1)[0] for a in computes}
        for layer in layers:  # every micro-batch's forward of each of the rank's layers
            assert sorted(a.layer for a in computes if a.pass_ == "forward" and a.layer.startswith(layer + "/")) \
                == [f"{layer}/mb{m}" for m in range(3)]
        queued = [i for i, a in enumerate(prog.actions) if isinstance(a, RunQueued)]
        finals = [i for i, a in enumerate(prog.actions) if isinstance(a, GradsFinal)]
        assert all(q > finals[0] for q in queued) if finals else True  # weight gradients wait for the last backward


def test_1f1b_over_workers_holding_non_adjacent_stages_is_refused_by_the_proof():
    """Layer i on worker i mod 2: each worker holds two stages; 1F1B would make worker 0 wait for
    micro-batch 1's forward while worker 1 waits for micro-batch 0's gradient."""
    cfg = _mlp(2, 2, "1f1b", "pipeline", batch=16)
    with pytest.raises(ConfigError) as err:
        make_plan(cfg, 2)
    message = str(err.value)
    assert message.startswith("<test>:") and "neuralnet.pipeline.schedule = '1f1b' with 2 micro-batches" in message
    assert "would deadlock" in message and 'schedule: "interleaved"' in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match="would deadlock"):
        job_programs(cfg, 2, ["train"])
    with pytest.raises(ConfigError, match="'zb' with 2 micro-batches.*would deadlock"):  # 1F1B's order too
        make_plan(_mlp(2, 2, "zb", "pipeline", batch=16), 2)
    make_plan(_mlp(2, 2, "gpipe", "pipeline", batch=16), 2)  # GPipe's order cannot cross there


def test_the_plan_shows_the_schedule_as_a_timeline():
    lines = timeline(partition(_mlp(2, 3, "1f1b"), 2))
    assert lines[0].startswith("pipeline: schedule 1f1b, 3 micro-batches over 2 stage(s)")
    assert lines[1].split() == ["rank", "0", "stage", "0", "F0", "F1", ".", "B0", "F2", "B1", ".", "B2"]
    assert lines[2].split() == ["rank", "1", "stage", "1", ".", "F0", "B0", "F1", "B1", "F2", "B2", "."]
    lines = timeline(partition(_mlp(2, 2, "zb"), 2))
    assert lines[0].startswith("pipeline: schedule zb, 2 micro-batches over 2 stage(s); idle share with equal "
                               "stages 14% (each slot one unit: W as long as F or B)")
    assert lines[2].split() == ["rank", "1", "stage", "1", ".", "F0", "B0", "F1", "B1", "W0", "W1"]


def test_evaluation_and_one_worker_are_not_pipelined_and_every_message_has_its_own_tag():
    assert partition(_mlp(1, 4, "1f1b"), 1).pipeline is None
    cfg = _mlp(2, 4, "1f1b")
    assert partition(cfg, 2, "test").pipeline is None
    sends = [c for prog in programs(partition(cfg, 2), None, "shared_memory").values() for c in prog.calls()
             if c.op == "Isend"]
    assert len(sends) == 4 * 3  # per micro-batch: an activation and the labels forward, a gradient back
    assert len({c.tag for c in sends}) == len(sends)


def test_the_dot_picture_draws_micro_batch_0_and_the_schedule_as_a_table():
    from singa_mpi.planner.render import to_dot

    text = to_dot(partition(_mlp(2, 3, "gpipe"), 2))
    assert '"fc1/mb0"' in text and "/mb1" not in text
    table = next(line for line in text.splitlines() if line.lstrip().startswith("schedule "))
    assert "gpipe: 3 micro-batches" in table and table.count(">F2<") == 2 and table.count(">B0<") == 2


# ---------------------------------------------------------------- interleaved

@pytest.mark.parametrize("scheme,nranks", [("pipeline", 2), ("pipeline", 3), ("stages", 2), ("stages", 4),
                                           ("stages-hybrid", 2), ("stages-hybrid", 3), ("stages-middle", 2),
                                           ("stages-middle", 3), ("stages-middle-feature", 4)])
@pytest.mark.parametrize("micro", [2, 3, 8])
def test_interleaved_runs_every_slot_once_after_the_slots_it_needs(scheme, nranks, micro):
    piped = partition(_mlp(nranks, micro, "interleaved", scheme, batch=48), nranks)
    _, ranks, reads = virtual_stages(piped)
    feeds = {v: {w for w, srcs in reads.items() if v in srcs} for v in ranks}
    played = interleaved_play(piped)
    ends: dict = {}
    for rank, row in played.items():
        mine = [v for v, holders in ranks.items() if rank in holders]
        expected = {(k, m, v) for k in "FBW" for m in range(micro) for v in mine}
        assert sorted(slot for _, slot in row) == sorted(expected)  # each once
        times = [t for t, _ in row]
        assert times == sorted(times) and len(set(times)) == len(times)  # one slot at a time
        for t, slot in row:
            ends[(rank,) + slot] = t + 1
    for (rank, kind, m, v), end in ends.items():  # a shared stage's F or B: one meeting, all its ranks at once
        assert kind == "W" or all(ends[(r, kind, m, v)] == end for r in ranks[v])
    for rank, row in played.items():
        for t, (kind, m, v) in row:
            if kind == "F":  # after every source's forward of the same micro-batch, on all its ranks
                needs = [("F", m, src, r) for src in reads[v] for r in ranks[src]]
            elif kind == "B":  # after its own forward and every reader's backward
                needs = [("F", m, v, rank)] + [("B", m, dst, r) for dst in feeds[v] for r in ranks[dst]]
            else:
                needs = [("B", m, v, rank)]
            assert all(ends[(r, k, mm, vv)] <= t for k, mm, vv, r in needs), (rank, kind, m, v)


def test_interleaved_holds_at_most_one_micro_batch_per_virtual_stage_of_the_net():
    piped = partition(_mlp(2, 8, "interleaved", "pipeline"), 2)
    limit = len(virtual_stages(piped)[1])
    for rank, order in interleaved_orders(piped).items():
        runs = len({v for _, _, v in order})
        started, weights_left, peak = set(), collections.Counter(), 0
        for kind, m, _ in order:
            if kind == "F" and m not in started:
                started.add(m)
                weights_left[m] = runs
            if kind == "W":
                weights_left[m] -= 1
            peak = max(peak, sum(1 for left in weights_left.values() if left))
        assert peak <= limit


def test_interleaved_over_runs_of_layers_apart_is_proved_where_1f1b_is_refused():
    """Layer i on worker i mod 2 (the layout 1F1B and ZB cannot order): worker 0 holds data-fc1 and act2,
    worker 1 act1-fc2 and fc3-loss, four virtual stages.  Worker 0 forwards micro-batch 1 over fc1
    before micro-batch 0 over act2 (GPipe's order waits for micro-batch 0's round trip first)."""
    cfg = _mlp(2, 2, "interleaved", "pipeline", batch=16)
    plan = make_plan(cfg, 2)  # proved, or it raises
    stage_of, ranks, _ = virtual_stages(plan)
    assert stage_of == {"data": 0, "fc1": 0, "act1": 1, "fc2": 1, "act2": 2, "fc3": 3, "loss": 3}
    assert ranks == {0: {0}, 1: {1}, 2: {0}, 3: {1}}
    built = job_programs(cfg, 2, ["train"])
    forwards = [a.layer for a in built.programs[("train", "shared_memory")][0].actions
                if isinstance(a, Compute) and a.pass_ == "forward"]
    assert forwards.index("fc1/mb1") < forwards.index("act2/mb0")
    gpipe = job_programs(_mlp(2, 2, "gpipe", "pipeline", batch=16), 2, ["train"])
    forwards = [a.layer for a in gpipe.programs[("train", "shared_memory")][0].actions
                if isinstance(a, Compute) and a.pass_ == "forward"]
    assert forwards.index("fc1/mb1") > forwards.index("act2/mb0")


@pytest.mark.parametrize("scheme", ["stages-middle", "stages-middle-feature"])
def test_interleaved_meets_in_the_collectives_of_a_stage_split_over_every_worker(scheme):
    """fc1 on worker 0, fc2 split over workers 0 and 1, fc3 on worker 1.  The collectives into and out
    of fc2 are in fc2's slots on both workers (worker 0 does not scatter micro-batch 1's rows from its
    first stage while worker 1 gathers micro-batch 0's gradients), so the proof accepts the order
    (it refused it while each member called them in the slot of its own end of the edge)."""
    cfg = _mlp(2, 3, "interleaved", scheme, batch=16)
    plan = make_plan(cfg, 2)  # proved, or it raises
    stage_of, ranks, _ = virtual_stages(plan)
    assert (stage_of["fc1"], stage_of["fc2"], stage_of["fc3"]) == (0, 1, 2)
    assert ranks == {0: {0}, 1: {0, 1}, 2: {1}}
    for rank in (0, 1):
        collectives = [unit for unit in units_of_plan(plan, rank) if unit.sub.role == "collective"]
        assert collectives and {unit_stage(unit, plan) for unit in collectives} == {1}, rank


@pytest.mark.parametrize("nranks", [2, 3, 4])
@pytest.mark.parametrize("net", ["mlp", "convnet"])
def test_gpipe_and_interleaved_order_any_placement_without_crossing_calls(net, nranks):
    """Layers drawn whole on any worker, split on the batch or on features, in any order
    (nets.placed_anywhere): GPipe's and the interleaved play's orders are proved on every one; 1F1B and
    ZB are proved or refused with the advice to use interleaved.  (Before shared stages met, the
    interleaved play crossed the calls of 700 of 968 such MLP layouts.)"""
    anywhere = nets.mlp_anywhere if net == "mlp" else nets.convnet_anywhere
    refused = 0
    for seed in range(60):
        for schedule in ("gpipe", "interleaved", "1f1b", "zb"):
            cfg = nets.job(nets.pipelined(anywhere("/tmp/unused.h5", 4 * nranks + 5, nranks, seed, steps=2), 3,
                                          schedule))
            try:
                make_plan(cfg, nranks)
            except ConfigError as err:
                assert schedule in ("1f1b", "zb") and "would deadlock" in str(err), (seed, schedule, str(err))
                assert 'or schedule: "interleaved"' in str(err)
                refused += 1
    assert refused < 60 * 2  # most placements are contiguous enough for 1F1B too


def test_interleaved_timeline_names_each_slot_s_virtual_stage():
    lines = timeline(partition(_mlp(2, 2, "interleaved", "pipeline", batch=16), 2))
    assert lines[0].startswith("pipeline: schedule interleaved, 2 micro-batches over 4 virtual stage(s) on 2 "
                               "worker(s); idle share with equal slots")
    assert lines[1].split()[4:8] == ["F0.0", "F1.0", "F0.2", "F1.2"]
    assert lines[2].split()[4] == "." and lines[2].split()[5] == "F0.1"


def test_interleaved_stages_deal_runs_round_robin_to_balance_the_workers():
    # the MNIST MLP's shape: a heavy second layer; contiguous halves leave one worker 58% of the work
    work = [0.1, 3.9, 0.1, 15, 0.1, 9, 0.1, 4.5, 0.1, 1.5, 0.1, 0.1, 0.1]
    dealt = interleaved_stages(work, 2)
    totals = [sum(w for w, worker in zip(work, dealt) if worker == k) for k in (0, 1)]
    assert dealt[0] == 0 and max(totals) < 18.5  # contiguous: at best 19.2 against 15.5
    runs = sum(1 for a, b in zip(dealt, dealt[1:]) if a != b) + 1
    assert runs == 4
    # a cut that moves a large output counts: the same work with that cut dear moves it elsewhere
    dear = [0.0] * len(work)
    dear[dealt.index(1)] = 100.0
    assert interleaved_stages(work, 2, cuts=dear) != dealt
    assert interleaved_stages([1.0, 2.0, 3.0], 2) == [0, 0, 1]  # fewer layers than runs: contiguous stages


# ---------------------------------------------------------------- stages apart: exchanges as messages

@pytest.mark.parametrize("schedule", ["1f1b", "zb"])
@pytest.mark.parametrize("scheme,nranks", [("stages-middle", 2), ("stages-middle-feature", 2),
                                           ("stages-middle", 3), ("stages-middle-feature", 4)])
def test_a_layer_split_over_the_workers_of_two_stages_keeps_the_stages_apart(scheme, nranks, schedule):
    """fc1 on worker 0, fc2 split over every worker, fc3 on the last.  Pipelined, the exchanges into
    and out of fc2 are messages, so worker 0 is stage 0 and the others stage 1 (collectives fused them
    into one stage: no overlap at all); the last stage's first forward comes before the first's first
    backward, and the proof accepts the orders.  Unpipelined, the same net keeps its collectives."""
    piped = make_plan(_mlp(nranks, 2, schedule, scheme, batch=16), nranks)
    assert {ex.forward_op for ex in piped.exchanges} == {"Send"}
    assert stages_of(piped) == {0: 0, **{r: 1 for r in range(1, nranks)}}
    progs = programs(piped, None, "allreduce")
    first_backward = next(i for i, a in enumerate(progs[0].actions) if isinstance(a, Compute) and a.pass_ == "backward")
    sends_before = [a for a in progs[0].actions[:first_backward] if getattr(a, "op", "") == "Isend"]
    assert {a.layer.rsplit("/mb", 1)[1] for a in sends_before} == {"0", "1"}  # both micro-batches handed on
    unpiped = make_plan(nets.job(nets.mlp("/tmp/unused.h5", 16, scheme, nranks, steps=2)), nranks)
    split = "Bcast" if scheme.endswith("feature") else "Scatterv"
    assert {split, "Gatherv"} <= {ex.forward_op for ex in unpiped.exchanges}


def test_workers_passing_split_layers_data_both_ways_share_a_stage():
    """fc1 whole on worker 0, then fc2 split on features and fc3 on the batch over both workers (each
    needs the other's part, both ways), fc4 on worker 1: workers 0 and 1 must reach each micro-batch's
    exchanges in one order, so they share a stage, as when those were collectives."""
    from nets import _data_layer, _ip, _loss, job_text

    whole0, whole1 = "partition_dim: -1 location: 0", "partition_dim: -1 location: 1"
    text = job_text([_data_layer("/tmp/unused.h5", 16, (12,), whole0), _ip("fc1", "data", 16, whole0),
                     _ip("fc2", "fc1", 10, "partition_dim: 1"), _ip("fc3", "fc2", 8, "partition_dim: 0"),
                     _ip("fc4", "fc3", 5, whole1), _loss("fc4", whole1)], 2)
    plan = make_plan(nets.job(nets.pipelined(text, 2, "1f1b")), 2)  # proved, or it raises
    assert stages_of(plan) == {0: 0, 1: 0}


@pytest.mark.parametrize("pdim", [0, 1])
def test_the_convnet_with_its_cut_layer_split_over_both_workers_is_a_2_stage_pipeline(pdim):
    text = nets.convnet("/tmp/unused.h5", 16, "stages", 2, pool="AVG", act="kSTanh", nranks=2)
    plan = make_plan(nets.job(nets.pipelined(nets.split_at_cut(text, pdim), 4, "1f1b")), 2)
    assert stages_of(plan) == {0: 0, 1: 1}
    split = [name for name, node in plan.origins.items() if node.conf.partition_dim == pdim and pdim != -1]
    assert len(split) == 1 and {sub.rank for sub in plan.sublayers if sub.origin == split[0]} == {0, 1}


def test_a_pipeline_naming_a_schedule_without_micro_batches_is_noted():
    """`pipeline { schedule: "zb" }` (micro_batches left at its default, 1) planned, checked and trained
    two stages one after the other on the whole batch without a word: a note now says the schedule has
    no effect; `micro_batches: 1` written out asks for exactly that and is not noted."""
    from singa_mpi.program.schedules import idle_pipeline_note

    text = nets.mlp("/tmp/unused.h5", 8, "stages", 2)
    unset = nets.job(text.replace("neuralnet { ", 'neuralnet { pipeline { schedule: "zb" }\n', 1))
    note = idle_pipeline_note(unset, 2, make_plan(unset, 2))
    assert note == (f"note: {unset.where('neuralnet', 'pipeline')}: neuralnet.pipeline sets no micro_batches (1 by "
                    "default): its schedule 'zb' has no effect, each step takes the whole batch through the net in "
                    "one pass (set micro_batches: 2 or more to pipeline)")
    assert idle_pipeline_note(nets.job(nets.pipelined(text, 1, "zb")), 2) is None
    piped = nets.job(nets.pipelined(text, 2, "zb"))
    assert idle_pipeline_note(piped, 2, make_plan(piped, 2)) is None
