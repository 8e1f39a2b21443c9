"""Deterministic mode in the plan: a worker's rows are whole canonical blocks, and `check` (or the
planner, for what only a plan shows) refuses what the mode does not cover in one line naming
file:line, the field or layer, and what was expected."""
import math

import pytest

import nets
from singa_mpi.checks.job import validate
from singa_mpi.config.load import default_block_rows
from singa_mpi.errors import ConfigError
from singa_mpi.planner import partition
from singa_mpi.planner.deterministic import Deterministic
from singa_mpi.planner.syncs import (DETERMINISTIC, DETERMINISTIC_SHARED, FORMED_LABEL, GATHER_LABEL, METHODS,
                                     SHARED_ROWS_LABEL, buckets, formed_counts, forming_tiles, gather_counts,
                                     gathered_rows, methods_of)
from singa_mpi.params import gradient_tiles
from singa_mpi.program.build import SERVERS, program
from singa_mpi.algorithms import make_algorithm


def _mode(text: str, block_rows: int = 4) -> str:
    return f"deterministic {{ block_rows: {block_rows} }}\n" + text


def _refusal(text: str, nranks: int | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        cfg = nets.job(text, "job.conf")
        validate(cfg)
        if nranks is not None:
            partition(cfg, nranks)
    message = str(err.value)
    assert "\n" not in message and message.startswith("job.conf:")
    return message


@pytest.mark.parametrize("batch,nranks", [(16, 2), (19, 2), (19, 3), (64, 4), (17, 4), (5, 1)])
def test_workers_hold_whole_blocks_in_rank_order(batch, nranks):
    mode = Deterministic(4)
    rows = [mode.rows_of(batch, nranks, r) for r in range(nranks)]
    assert rows[0][0] == 0 and rows[-1][1] == batch
    assert all(a[1] == b[0] for a, b in zip(rows, rows[1:]))  # contiguous, in rank order
    assert all(lo % 4 == 0 and (hi % 4 == 0 or hi == batch) for lo, hi in rows)  # on block boundaries
    counts = [mode.count(hi - lo) for lo, hi in rows]
    assert max(counts) - min(counts) <= 1  # the blocks as even as they go


def test_a_data_split_plan_splits_on_blocks_and_gathers_every_replicated_param():
    plan = partition(nets.job(_mode(nets.mlp("/tmp/unused.h5", 19, "data", 3, steps=2))), 3)
    assert plan.deterministic == Deterministic(4)
    fc1 = sorted((s.rank, s.batch_slice) for s in plan.sublayers if s.origin == "fc1")
    assert fc1 == [(0, (0, 8)), (1, (8, 16)), (2, (16, 19))]  # 5 blocks over 3 workers: 2, 2, 1
    assert methods_of(plan) == (DETERMINISTIC_SHARED, DETERMINISTIC)  # on one node, or by messages
    rows = gathered_rows(plan, DETERMINISTIC)
    assert sorted(name for name, _ in rows) == ["b_fc1", "b_fc2", "b_fc3", "w_fc1", "w_fc2", "w_fc3"]
    assert all(spec.terms == (8, 8, 3) and spec.kind == "rows" for spec in rows.values())
    assert buckets(plan, DETERMINISTIC) == []  # no partial sums at all
    # per row: w_fc1 16 + 12, b_fc1 16, w_fc2 10 + 16, b_fc2 10, w_fc3 5 + 10, b_fc3 5
    assert gather_counts(plan, DETERMINISTIC) == [n * 100 for n in (8, 8, 3)]
    calls = program(plan, 1, make_algorithm(nets.job(_mode(nets.mlp("/tmp/unused.h5", 19, "data", 3))).proto
                                             .train_one_batch), DETERMINISTIC).calls()
    sync = [c for c in calls if c.by == "sync"]
    # the rows, then the tiles each rank formed: the three biases and w_fc1 by rank 0 (223 floats),
    # w_fc2 and w_fc3 by rank 2 (210): rank 1 forms none of these small gradients
    assert formed_counts(plan, DETERMINISTIC) == [223, 0, 210]
    assert [(c.op, c.shape, c.layer) for c in sync] == [("Allgatherv", (800,), GATHER_LABEL),
                                                        ("Allgatherv", (0,), FORMED_LABEL)]
    # on one node: fences around node-shared memory instead, and the other ranks' terms read there
    calls = program(plan, 1, make_algorithm(nets.job(_mode(nets.mlp("/tmp/unused.h5", 19, "data", 3))).proto
                                             .train_one_batch), DETERMINISTIC_SHARED).calls()
    assert [(c.op, c.layer, c.recv_bytes) for c in calls if c.by == "sync"] == [
        ("Barrier(shm)", SHARED_ROWS_LABEL, 0), ("read(shm)", SHARED_ROWS_LABEL, 4 * (1900 - 800)),
        ("Barrier(shm)", "shm(values)", 0)]


def test_the_gradients_tiles_are_dealt_to_the_ranks_in_contiguous_runs_of_about_equal_work():
    text = _mode(nets.mlp("/tmp/unused.h5", 32, "data", 4, steps=2)).replace("num_output: 16", "num_output: 600")
    text = text.replace("num_output: 10", "num_output: 500")
    for nranks in (2, 3, 4):  # (one worker alone forms every tile itself: Param.grad, params.form_rows)
        plan = partition(nets.job(text), nranks)
        tiles = forming_tiles(plan, DETERMINISTIC)
        assert list(tiles) == list(gathered_rows(plan, DETERMINISTIC))  # the order every rank packs
        ranks = [rank for each in tiles.values() for _, _, rank in each]
        assert ranks == sorted(ranks) and set(ranks) == set(range(nranks))  # one contiguous run per rank
        for key, each in tiles.items():  # the canonical tiles, whatever the rank count
            shape = tuple(hi - lo for lo, hi in key[1])
            assert [(lo, hi) for lo, hi, _ in each] == gradient_tiles(shape, len(shape) == 2)
        counts = formed_counts(plan, DETERMINISTIC)
        assert sum(counts) == sum(math.prod(hi - lo for lo, hi in key[1]) for key in tiles)
        assert max(counts) <= 1.5 * sum(counts) / nranks, counts  # w_fc1 600x12, w_fc2 500x600: 128-row tiles


def test_the_default_mode_is_unchanged():
    plan = partition(nets.job(nets.mlp("/tmp/unused.h5", 19, "data", 3, steps=2)), 3)
    assert plan.deterministic is None and methods_of(plan) == METHODS
    assert sorted((s.rank, s.batch_slice) for s in plan.sublayers if s.origin == "fc1") == [
        (0, (0, 7)), (1, (7, 13)), (2, (13, 19))]
    assert gathered_rows(plan, DETERMINISTIC) == {}


def test_fewer_blocks_than_workers_is_refused_saying_what_block_rows_would_do():
    message = _refusal(_mode(nets.mlp("/tmp/unused.h5", 16, "data", 4, steps=2), 8), nranks=4)
    assert "partition_dim" in message and "at least 4 canonical blocks" in message
    assert "set block_rows to at most 4" in message


def test_a_feature_split_is_refused_naming_the_layer():
    message = _refusal(_mode(nets.mlp("/tmp/unused.h5", 16, "hybrid", 2, steps=2)), nranks=2)
    assert "layer 'fc2'" in message and "partition_dim" in message
    assert "a split of features cuts the sum of the input gradient" in message


def test_a_convolutions_gradients_are_gathered_as_one_term_per_block():
    plan = partition(nets.job(_mode(nets.convnet("/tmp/unused.h5", 19, "data", steps=2))), 2)
    rows = gathered_rows(plan, DETERMINISTIC)
    conv = {name: spec for (name, _), spec in rows.items() if spec.kind == "blocks"}
    assert conv and all(spec.terms == (3, 2) for spec in conv.values())  # 5 blocks of 4 rows: 12 and 7 rows
    weight = next(name for name in conv if name.startswith("w"))
    assert conv[weight].width == next(s.size for s in plan.param_syncs if s.name == weight)


def test_a_layer_without_a_canonical_order_is_refused_naming_it():
    text = _mode(nets.mlp("/tmp/unused.h5", 16, "data", 2, steps=2)).replace(
        'layer { name: "fc1"', 'layer { name: "out" type: kCSVOutput srclayers: "data" '
        'store_conf { backend: "textfile" path: "/tmp/unused.csv" } }\n  layer { name: "fc1"', 1)
    message = _refusal(text)
    assert "layer 'out'" in message and "kCSVOutput has no canonical order for its sums over the batch" in message
    assert "remove the deterministic setting" in message


def test_batch_norm_is_covered_its_statistics_one_pair_per_block():
    plan = partition(nets.job(_mode(nets.convnet("/tmp/unused.h5", 19, "data", steps=2, bn=True))), 3)
    bn = [s for s in plan.sublayers if s.origin == "bn1"]
    assert [s.statistics_blocks for s in bn] == [5, 5, 5]  # 19 rows in blocks of 4
    calls = program(plan, 0, make_algorithm(nets.job(_mode(nets.convnet("/tmp/unused.h5", 19, "data", steps=2,
                                                                       bn=True))).proto.train_one_batch),
                    DETERMINISTIC_SHARED).calls()
    assert {c.shape for c in calls if c.layer == "bn1(statistics)"} == {(5, 2, 6)}  # 6 channels


def test_an_unrolled_grus_copies_each_add_a_set_of_terms():
    text = _mode(nets.char_rnn("/tmp/unused/t.txt", "/tmp/unused/v.txt", 6, "data", steps=2, unroll=5), 2)
    rows = gathered_rows(partition(nets.job(text), 3), DETERMINISTIC)
    gru = rows[next(key for key in rows if key[0] == "z_hx")]
    assert (gru.kind, gru.uses, gru.terms) == ("rows", 5, (2, 2, 2))  # five copies, 3 blocks of 2 rows


def test_an_rbms_weight_is_trained_by_its_hidden_layer_two_terms_per_row():
    plan = partition(nets.job(_mode(nets.rbm("/tmp/unused.h5", 19, "data", steps=2))), 2)
    rows = gathered_rows(plan, DETERMINISTIC)
    assert {name: (spec.kind, spec.terms) for (name, _), spec in rows.items()} == {
        "w_rbm": ("pairs", (24, 14)), "b_hid": ("pairs", (24, 14)), "b_vis": ("rows", (12, 7))}


def test_asynchronous_frameworks_are_refused():
    text = _mode(nets.mlp("/tmp/unused.h5", 16, "data", 2, steps=2))
    text += "cluster { nworker_groups: 2 nserver_groups: 2 }\n"
    assert "asynchronously" in _refusal(text)


def test_sandblaster_is_accepted_and_its_workers_gather_their_terms_before_the_servers_combine():
    text = _mode(nets.mlp("/tmp/unused.h5", 16, "data", 2, steps=2))
    validate(nets.job(text + "cluster { server_worker_separate: true nserver_groups: 1 nservers_per_group: 1 }\n"))
    plan = partition(nets.job(text), 2)
    algorithm = make_algorithm(nets.job(text).proto.train_one_batch)
    sync = [c for c in program(plan, 0, algorithm, SERVERS).calls() if c.by == "sync"]
    assert [(c.op, c.layer) for c in sync] == [("Allgatherv", GATHER_LABEL)]  # no second: the servers add
    assert list(forming_tiles(plan, SERVERS)) == list(gathered_rows(plan, DETERMINISTIC))


def test_a_pipeline_is_refused():
    text = _mode(nets.pipelined(nets.mlp("/tmp/unused.h5", 16, "stages", 2, steps=2), 2))
    assert "pipelines are not deterministic yet" in _refusal(text)


def test_block_rows_must_be_positive():
    assert "deterministic.block_rows = 0: expected a positive number" in _refusal(_mode(
        nets.mlp("/tmp/unused.h5", 16, "data", 2, steps=2), 0))


def test_without_block_rows_the_blocks_split_the_batch_evenly_for_2_and_4_workers():
    assert [default_block_rows(b) for b in (64, 100, 96, 50, 128, 359, 19)] == [16, 25, 24, 25, 16, 16, 16]
    text = nets.mlp("/tmp/unused.h5", 100, "data", 2, steps=2)
    assert partition(nets.job("deterministic { }\n" + text), 2).deterministic == Deterministic(25)
    assert partition(nets.job("deterministic { block_rows: 16 }\n" + text), 2).deterministic == Deterministic(16)


@pytest.mark.parametrize("mode, rows", [("deterministic { }", 25), ("deterministic { block_rows: 20 }", 20), ("", None)])
def test_the_serial_net_cuts_the_batch_into_the_blocks_a_plan_cuts(tmp_path, mode, rows):
    """One rank runs the serial net: its layers must cut the same blocks as every plan, the default
    blocks too (25 rows for a batch of 100; it used the field's default of 16, so that an RBM with a
    batch of 100 trained other bits on one rank than on two)."""
    from singa_mpi.net import build_serial_net

    cfg = nets.job(mode + "\n" + nets.mlp(nets.make_data(str(tmp_path / "d.h5"), 100, (12,), 5), 100, "data", 2, steps=2))
    validate(cfg)
    net = build_serial_net(cfg, "train", 5, str(tmp_path), {})
    assert {layer.ctx.block_rows for layer in net.layers} == {rows}
    assert partition(cfg, 2).deterministic == (Deterministic(rows) if rows else None)
