"""ExchangeLayer: every exchange kind of real plans, run on LocalComm threads.

For each exchange of a plan, every member builds its side of the exchange; each holder feeds its
slice of a known logical array.  Forward: each needing rank must receive exactly its region.
Backward: each holder must get the sum, over the needing ranks, of their gradients restricted to
its region (the numpy oracle below).  Bytes: what the tracer records per rank under the
exchange's table row equals the planner's prediction for it.  The same jobs pipelined ("... as
messages") send every exchange's pieces as point-to-point messages: the same regions and sums.
"""
import numpy as np
import pytest

import nets
from nets import _act, _data_layer, _ip, _loss, job_text
from singa_mpi.communication.local import run_ranks
from singa_mpi.runtimes.exchange import ExchangeLayer
from singa_mpi.planner import partition
from singa_mpi.planner.schedule import predicted_bytes, table_label
from singa_mpi.program.passes import connection_calls
from singa_mpi.proto import job_pb2

BATCH = 7  # uneven over 2, 3 and 4 ranks


def place(pdim: int, location: int | None = None) -> str:
    return f"partition_dim: {pdim}" + (f" location: {location}" if location is not None else "")


def split_then_gather(path: str, n: int) -> str:
    """fc0 whole on rank n-1 -> features (Bcast/Reduce) -> batch (Alltoallv) -> whole on rank 0
    (Gatherv/Scatterv); labels from rank n-1 to rank 0 (a label bridge)."""
    return job_text([
        _data_layer(path, BATCH, (12,), place(-1, n - 1)), _ip("fc0", "data", 6, place(-1, n - 1)),
        _ip("fc1", "fc0", 7, place(1)), _act("act1", "fc1", pdim=place(1)),
        _ip("fc2", "act1", 5, place(0)), _act("act2", "fc2", pdim=place(0)),
        _ip("fc3", "act2", 5, place(-1, 0)), _loss("fc3", place(-1, 0))])


def slice_then_allgather(path: str, n: int) -> str:
    """fc0 whole on rank n-1 -> batch (Scatterv/Gatherv) -> features (Allgatherv/Reduce_scatter)
    -> batch (Alltoallv); labels sliced from rank n-1 (a label Scatterv)."""
    return job_text([
        _data_layer(path, BATCH, (12,), place(-1, n - 1)), _ip("fc0", "data", 6, place(-1, n - 1)),
        _ip("fc1", "fc0", 7, place(0)), _act("act1", "fc1", pdim=place(0)),
        _ip("fc2", "act1", 5, place(1)), _act("act2", "fc2", pdim=place(1)),
        _ip("fc3", "act2", 5, place(0)), _loss("fc3", place(0))])


def concat_to_one(path: str, n: int) -> str:
    """Batch-split layers gathered on rank n-1, labels too (a label Gatherv)."""
    return job_text([
        _data_layer(path, BATCH, (12,), place(0)), _ip("fc1", "data", 6, place(0)),
        _ip("fc2", "fc1", 5, place(-1, n - 1)), _loss("fc2", place(-1, n - 1))])


CASES = {
    "pipeline": (lambda paths, n: nets.mlp(paths["mlp"], BATCH, "pipeline", n), [2, 3, 4]),
    "split_then_gather": (lambda paths, n: split_then_gather(paths["mlp"], n), [2, 3, 4]),
    "slice_then_allgather": (lambda paths, n: slice_then_allgather(paths["mlp"], n), [2, 3, 4]),
    "concat_to_one": (lambda paths, n: concat_to_one(paths["mlp"], n), [2, 3, 4]),
    "conv_filters": (lambda paths, n: nets.convnet(paths["conv"], BATCH, "filters"), [2, 3]),  # (C, H, W) rest
}
# every exchange of a pipelined step travels as messages (micro-batches of 4 and 3 rows: 2-3 ranks)
CASES.update({f"{case} as messages": ((lambda make: lambda paths, n: nets.pipelined(make(paths, n), 2, "gpipe"))(make),
                                      [n for n in counts if n <= 3])
              for case, (make, counts) in list(CASES.items()) if case != "pipeline"})
PARAMS = [(case, n) for case, (_, ns) in CASES.items() for n in ns]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stores")
    return {"mlp": nets.make_data(str(folder / "mlp.h5"), 10, (12,), 5),
            "conv": nets.make_data(str(folder / "conv.h5"), 10, (2, 8, 8), 5)}


def make_plan(paths, case: str, n: int):
    return partition(nets.job(CASES[case][0](paths, n)), n)


# ------------------------------------------------------------------ the numpy oracle

def logical_shape(ex) -> tuple[int, ...]:
    rows = max(region.rows[1] for region in ex.holders.values())
    if ex.kind == "aux":
        return (rows,)
    return (rows, max(region.features[1] for region in ex.holders.values())) + tuple(ex.rest_shape)


def part(array: np.ndarray, region) -> np.ndarray:
    """``region`` of a logical array (rows x features, or rows of labels)."""
    rows = slice(*region.rows)
    return array[rows] if array.ndim == 1 else array[rows, slice(*region.features)]


def expected_gradients(ex, grads: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Holder -> the sum of every needing rank's gradient over the holder's region."""
    total = np.zeros(logical_shape(ex))
    for rank, grad in grads.items():
        part(total, ex.needs[rank])[...] += grad
    return {rank: part(total, region) for rank, region in ex.holders.items()}


# ------------------------------------------------------------------ running one exchange

def run_exchange(plan, ex, values: np.ndarray, grads: dict[int, np.ndarray]) -> list:
    """Forward then backward of ``ex`` on every rank: per rank (received, gradient, bytes per label)."""
    subs = [s for s in plan.sublayers if s.exchange is ex]

    def rank(comm):
        received = gradient = None
        for sub in (s for s in subs if s.rank == comm.rank):
            layer = ExchangeLayer(sub, comm, job_pb2.LayerProto(name=sub.name), connection_calls(sub))
            holds = comm.rank in ex.holders and bool(sub.srcs)
            out = layer.forward([part(values, ex.holders[comm.rank])] if holds else [], True)
            if comm.rank in ex.needs:
                received = (layer.aux if ex.kind == "aux" else out).copy()
            if ex.with_backward:
                back = layer.backward(grads.get(comm.rank), [True] if holds else [])
                gradient = back[0].copy() if holds else None
        measured: dict[str, int] = {}
        for name, total in comm.tracer.by_name("comm").items():
            measured[table_label(name)] = measured.get(table_label(name), 0) + total.bytes
        return received, gradient, measured

    return run_ranks(plan.nranks, rank, timeout=10.0)


def byte_mismatches(plan, ex, results) -> list[tuple[int, str, int, int]]:
    """(rank, table row, measured, predicted) for every row of ``ex`` where the two differ."""
    predicted = predicted_bytes(plan)
    labels = sorted({table_label(s.name) for s in plan.sublayers if s.exchange is ex})
    return [(r, label, measured.get(label, 0), predicted[r].get(label, 0))
            for r, (_, _, measured) in enumerate(results) for label in labels
            if measured.get(label, 0) != predicted[r].get(label, 0)]


def exchanges_run(paths, case: str, n: int):
    """Every exchange of the case's plan run once: (plan, exchange, values, grads, results)."""
    plan = make_plan(paths, case, n)
    rng = np.random.default_rng(n)
    for ex in plan.exchanges:
        shape = logical_shape(ex)
        values = (rng.integers(0, 5, shape).astype(np.int32) if ex.kind == "aux"
                  else rng.normal(size=shape).astype(np.float32))
        grads = {r: rng.normal(size=part(values, need).shape).astype(np.float32) for r, need in ex.needs.items()}
        yield plan, ex, values, grads, run_exchange(plan, ex, values, grads)


@pytest.mark.parametrize("case, n", PARAMS)
def test_every_exchange_delivers_regions_sums_gradients_and_counts_predicted_bytes(paths, case, n):
    for plan, ex, values, grads, results in exchanges_run(paths, case, n):
        expected = expected_gradients(ex, grads) if ex.with_backward else {}
        what = f"exchange {ex.id} {ex.forward_op}/{ex.backward_op} ({ex.kind}) on {n} ranks"
        for r, (received, gradient, _) in enumerate(results):
            if r in ex.needs:
                np.testing.assert_array_equal(received, part(values, ex.needs[r]), err_msg=what)
            if r in expected:
                np.testing.assert_allclose(gradient, expected[r], rtol=1e-5, atol=1e-6, err_msg=what)
        wrong = byte_mismatches(plan, ex, results)
        assert not wrong, f"{what}: (rank, row, measured, predicted) {wrong}"


@pytest.mark.parametrize("case, n", [("slice_then_allgather", 3), ("concat_to_one", 3), ("split_then_gather", 3)])
def test_non_root_members_of_scatterv_and_gatherv_count_their_piece(paths, case, n):
    wrong = [(ex.forward_op, *m) for plan, ex, _, _, results in exchanges_run(paths, case, n)
             for m in byte_mismatches(plan, ex, results)]
    assert not wrong, f"(op, rank, row, measured, predicted) {wrong}"


def test_the_cases_cover_every_exchange_kind(paths):
    kinds = {(ex.forward_op, ex.backward_op, ex.kind, ex.with_backward)
             for case, n in PARAMS for ex in make_plan(paths, case, n).exchanges}
    assert kinds >= {
        ("Send", "Recv", "data", True), ("Send", None, "aux", False),
        ("Bcast", "Reduce", "data", True),
        ("Scatterv", "Gatherv", "data", True), ("Scatterv", None, "aux", False),
        ("Gatherv", "Scatterv", "data", True), ("Gatherv", None, "aux", False),
        ("Allgatherv", "Reduce_scatter", "data", True),
        ("Alltoallv", "Alltoallv", "data", True),
    }
    assert any(ex.rest_shape for ex in make_plan(paths, "conv_filters", 3).exchanges)


def test_a_pipelined_step_sends_every_exchange_as_messages(paths):
    """Pipelined, the collectives of the same plans become pieces between pairs of ranks: a member
    sends to, and receives from, several others; one Wait completes its backward receives."""
    from singa_mpi.program.passes import message_calls

    several = 0
    for case, n in PARAMS:
        if not case.endswith("as messages"):
            continue
        plan = make_plan(paths, case, n)
        assert {(ex.forward_op, ex.backward_op or "Recv") for ex in plan.exchanges} == {("Send", "Recv")}
        for sub in (s for s in plan.sublayers if s.role == "collective"):
            forward = message_calls(sub, "forward")
            assert [c.op for c in forward] == sorted((c.op for c in forward), key=("Isend", "Recv").index)
            assert sum(c.send_bytes for c in forward) == sub.exchange.sent_by(sub.rank)
            assert sum(c.recv_bytes for c in forward) == sub.exchange.received_by(sub.rank)
            several += len({c.peer for c in forward}) > 1
    assert several, "no member of an exchange sent as messages talks to several ranks"


def test_a_second_step_reuses_buffers_and_still_adds_up(paths):
    """Buffers are allocated once and reused: a second forward/backward must not keep the first's."""
    plan = make_plan(paths, "slice_then_allgather", 3)
    ex = next(e for e in plan.exchanges if e.forward_op == "Alltoallv")
    subs = [s for s in plan.sublayers if s.exchange is ex]
    rng = np.random.default_rng(0)
    steps = [(rng.normal(size=logical_shape(ex)).astype(np.float32),
              {r: rng.normal(size=part(np.zeros(logical_shape(ex)), need).shape).astype(np.float32)
               for r, need in ex.needs.items()}) for _ in range(2)]

    def rank(comm):
        sub = next(s for s in subs if s.rank == comm.rank)
        layer = ExchangeLayer(sub, comm, job_pb2.LayerProto(name=sub.name), connection_calls(sub))
        seen = []
        for values, grads in steps:
            out = layer.forward([part(values, ex.holders[comm.rank])], True).copy()
            seen.append((out, layer.backward(grads[comm.rank], [True])[0].copy()))
        return seen

    for r, seen in enumerate(run_ranks(3, rank, timeout=10.0)):
        for (values, grads), (out, gradient) in zip(steps, seen):
            np.testing.assert_array_equal(out, part(values, ex.needs[r]))
            np.testing.assert_allclose(gradient, expected_gradients(ex, grads)[r], rtol=1e-5, atol=1e-6)
