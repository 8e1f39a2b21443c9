"""Emergency checkpoints (singa_mpi.checkpoints.emergency): the pieces the survivors of a death saved
make a checkpoint only when together, at one step, they hold every element of every param and the
updater state of every param's owners; otherwise the reason names what died with the rank."""
from __future__ import annotations

import numpy as np

from singa_mpi.checkpoints import hdf5
from singa_mpi.checkpoints.emergency import assemble, pieces_in, piece_path, request

W = np.arange(12, dtype=np.float32).reshape(3, 4)
B = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
HEADER = {"job_name": "j", "job_config": "name: 'j'", "plan": {"nranks": 3, "layers": {}}, "seed": 1, "nranks": 3,
          "job_identity": "0123456789abcdef"}


def _piece(rank: int, step: int, rows: tuple[int, int] = (0, 3), owns: bool = True, **extra) -> dict:
    lo, hi = rows
    params = [("w", (3, 4), ("nd", ((lo, hi), (0, 4))), W[lo:hi] + step), ("b", (4,), ("nd", ((0, 4),)), B + step)]
    owned = [("w", (3, 4), ("nd", ((lo, hi), (0, 4))), {"history": W[lo:hi] * 0 + rank}),
             ("b", (4,), ("nd", ((0, 4),)), {"history": B * 0 + rank})] if owns else []
    piece = {"rank": rank, "pid": 100 + rank, "step": step, "params": params, "owned": owned,
             "readers": {"train": {"data": {"position": step * 64}}}, "counters": {}, "carried": [],
             "refused": None, "elapsed": 1.5 + rank, "trains": True, "expected": {"w": (3, 4), "b": (4,)}, "header": dict(HEADER)}
    piece.update(extra)
    return piece


def test_one_survivor_with_whole_replicas_makes_the_checkpoint_at_its_step():
    ckpt, note = assemble([_piece(0, 2517), _piece(2, 2516)])
    assert note == "step 2517, from what ranks 0 held (rank 2 was at step 2516)"  # rank 0 ahead: the newest whole step
    assert ckpt.step == 2517 and np.array_equal(ckpt.params["w"], W + 2517) and np.array_equal(ckpt.params["b"], B + 2517)
    assert ckpt.updater["w"]["history"].shape == (3, 4) and ckpt.readers == {"train": {"data": {"position": 2517 * 64}}}
    assert (ckpt.job_identity, ckpt.nranks, ckpt.elapsed) == ("0123456789abcdef", 3, 1.5)


def test_rank_0_s_step_bounds_the_choice_so_metrics_go_on_without_a_gap():
    """Asynchronous groups (Hogwild): a faster group's replica would skip steps rank 0 never reported."""
    ckpt, note = assemble([_piece(0, 2750), _piece(2, 2881)])
    assert ckpt.step == 2750 and note == "step 2750, from what ranks 0 held (rank 2 was at step 2881)"
    assert assemble([_piece(1, 2750), _piece(2, 2881)])[0].step == 2881  # rank 0 saved nothing: the newest


def test_shards_held_by_several_survivors_at_one_step_add_up():
    ckpt, note = assemble([_piece(0, 40, (0, 2)), _piece(2, 40, (2, 3))])
    assert ckpt is not None and note == "step 40, from what ranks 0, 2 held"
    assert np.array_equal(ckpt.params["w"], W + 40)
    assert np.array_equal(ckpt.updater["w"]["history"], np.array([[0] * 4, [0] * 4, [2] * 4], np.float32))


def test_a_shard_or_an_owner_s_state_lost_with_the_dead_rank_gives_the_reason():
    ckpt, note = assemble([_piece(0, 40, (0, 2))])  # rows 2: of w only on the dead rank
    assert ckpt is None and note == "param w was held in part by the dead rank alone (67% held by survivors)"
    ckpt, note = assemble([_piece(0, 40, owns=False)])  # a worker of servers: values, no updater state
    assert ckpt is None and note.startswith("the updater state of param b was kept by the dead rank or by server ranks")
    # survivors at different steps: the newest step that is whole wins, an incomplete newer one is passed over
    ckpt, note = assemble([_piece(0, 41, (0, 2)), _piece(2, 40)])
    assert ckpt.step == 40 and note == "step 40, from what ranks 2 held (rank 0 was at step 41)"


def test_servers_ranges_at_the_workers_step_complete_what_the_workers_left_to_them():
    """Sandblaster: a worker saves only its data position; each server saves its ranges, one piece per
    step they reached (a range updated with the dead worker's gradient is a step ahead)."""
    worker = _piece(0, 40, owns=False)
    worker["params"] = []
    w_range = {"rank": 3, "pid": 9, "step": 40, "params": [("w", (3, 4), ("flat", 0, 12), (W + 40).reshape(-1))],
               "owned": [("w", (3, 4), ("flat", 0, 12), {"history": np.ones(12, np.float32)})], "readers": {},
               "counters": {}, "carried": [], "refused": None, "elapsed": 0.0, "expected": {}, "header": None,
               "trains": False}
    b_range = dict(w_range, rank=4, params=[("b", (4,), ("flat", 0, 4), B + 40)],
                   owned=[("b", (4,), ("flat", 0, 4), {"history": np.ones(4, np.float32)})])
    ckpt, note = assemble([worker, w_range, b_range])
    assert note == "step 40, from what ranks 0, 3, 4 held" and np.array_equal(ckpt.params["w"], W + 40)
    assert np.array_equal(ckpt.updater["w"]["history"], np.ones((3, 4), np.float32))
    ckpt, note = assemble([worker, w_range, dict(b_range, step=41)])  # b updated with the dead worker's gradient
    assert ckpt is None and note == ("param b was at step 41 on rank 4, the workers at step 40 (a server had "
                                     "applied the dead worker's gradient)")


def test_refusals_and_per_row_state_say_why_there_is_none():
    refused = {"rank": 3, "pid": 9, "step": None, "refused": "a server: no range was updated in this run yet"}
    assert assemble([refused]) == (None, "rank 3: a server: no range was updated in this run yet")
    assert assemble([]) == (None, "no survivor saved anything")
    ckpt, note = assemble([_piece(0, 40, carried=["lstm1"]), refused])
    assert ckpt is None and "layers lstm1 carry per-row state" in note
    # a checkpoint the others make whole still names the survivor that refused
    stuck = {"rank": 2, "pid": 9, "step": None, "refused": "its update waited on a dead rank for over 10s"}
    ckpt, note = assemble([_piece(0, 40), stuck])
    assert ckpt.step == 40 and note == ("step 40, from what ranks 0 held (rank 2: its update waited on a dead rank "
                                        "for over 10s)")


def test_pieces_are_saved_and_read_back_and_the_checkpoint_writes_like_any_other(tmp_path):
    import pickle

    folder = tmp_path / "rescue1"
    request(str(folder))
    assert (folder / "request").exists()
    with open(piece_path(str(folder), 0), "wb") as f:
        pickle.dump(_piece(0, 7), f)
    (folder / "rank2.pkl").write_bytes(b"torn")  # a piece cut short: left out
    (pieces,) = [pieces_in(str(folder))]
    assert [p["rank"] for p in pieces] == [0]
    ckpt, _ = assemble(pieces)
    path = hdf5.write(hdf5.checkpoint_path(str(tmp_path), ckpt.step), ckpt)
    back = hdf5.read(path)
    assert back.step == 7 and np.array_equal(back.params["w"], W + 7) and back.job_identity == "0123456789abcdef"
    assert np.array_equal(back.updater["b"]["history"], np.zeros(4, np.float32))
