"""LocalComm: every method against a numpy reference on 1-4 threads, bytes against the convention.

The byte oracle is written from the convention alone (communication.base): a matrix ``moved[i][j]``
of items rank i's payload carries to rank j; a rank counts the row and the column of others.
"""
import numpy as np
import pytest

from singa_mpi.communication.local import LocalAbort, LocalGroup, run_ranks

NS = [1, 2, 3, 4]
F32 = np.float32


def run(n, fn, timeout=10.0):
    return run_ranks(n, fn, timeout=timeout)


def traced(comm, label="x") -> int:
    return comm.tracer.by_name("comm")[label].bytes


def convention(moved, rank: int, itemsize: int = 4) -> int:
    """Bytes leaving ``rank`` for others plus bytes arriving from others."""
    off = np.array(moved, dtype=np.int64)
    np.fill_diagonal(off, 0)
    return itemsize * int(off[rank].sum() + off[:, rank].sum())


def uneven(n: int) -> list[int]:
    """Uneven counts with a zero from 3 ranks on: [1], [1, 2], [1, 2, 0], [1, 2, 0, 1]."""
    return [(r + 1) % 3 for r in range(n)]


def reversed_displs(counts) -> list[int]:
    """Blocks packed in reverse rank order: displacements really matter."""
    return [int(sum(counts[r + 1:])) for r in range(len(counts))]


def block(owner: int, count: int, to: int = 0) -> np.ndarray:
    return (100 * owner + 10 * to + np.arange(count)).astype(F32)


def call(comm, blocking: bool, name: str, *args):
    """The blocking call, or its I-twin followed by comm.Wait."""
    if blocking:
        return getattr(comm, name)(*args)
    comm.Wait(getattr(comm, "I" + name[0].lower() + name[1:])(*args), args[-1])


# ------------------------------------------------------------------ point to point

@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_of_isend_recv_and_irecv(n):
    def rank(comm):
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        send = block(comm.rank, 5)
        request = comm.Isend(send, right, 7, "x")
        send[...] = -1  # Isend copied: MPI forbids this, LocalComm is immune to it
        early = np.empty(5, F32)
        pending = comm.Irecv(early, left, 8, "y")  # posted before the message exists
        comm.Send(block(comm.rank, 5, 1), right, 8, "y")
        got = np.empty(5, F32)
        comm.Recv(got, left, 7, "x")
        comm.Wait(request, "x")
        pending.Wait()
        return got, early, traced(comm, "x"), traced(comm, "y")

    for r, (got, early, x_bytes, y_bytes) in enumerate(run(n, rank)):
        left = (r - 1) % n
        np.testing.assert_array_equal(got, block(left, 5))
        np.testing.assert_array_equal(early, block(left, 5, 1))
        moved = np.zeros((n, n))
        moved[r, (r + 1) % n] = moved[left, r] = 5
        assert x_bytes == y_bytes == convention(moved, r)


def test_messages_of_one_tag_arrive_in_order_and_receives_match_in_posting_order():
    def rank(comm):
        if comm.rank == 0:
            for i in range(3):
                comm.Isend(np.full(2, i, np.int32), 1, 0, "x")
            return None
        first, second, third = (np.empty(2, np.int32) for _ in range(3))
        r1 = comm.Irecv(first, 0, 0, "x")
        comm.Recv(second, 0, 0, "x")  # posted after r1: gets the second message
        r3 = comm.Irecv(third, 0, 0, "x")
        r3.Wait()
        r1.Wait()
        return [int(a[0]) for a in (first, second, third)]

    assert run(2, rank)[1] == [0, 1, 2]


def test_recv_of_the_wrong_size_or_dtype_fails():
    def rank(comm):
        if comm.rank == 0:
            comm.Send(np.zeros(3, F32), 1, 0, "x")
        else:
            comm.Recv(np.zeros(4, F32), 0, 0, "x")

    with pytest.raises(ValueError, match="3 float32 items arrive for a buffer of 4"):
        run(2, rank)


# ------------------------------------------------------------------ rooted collectives

@pytest.mark.parametrize("n", NS)
def test_bcast_from_the_last_rank(n):
    root = n - 1

    def rank(comm):
        array = block(7, 6).reshape(2, 3) if comm.rank == root else np.zeros((2, 3), F32)
        comm.Bcast(array, root, "x")
        return array, traced(comm)

    for r, (array, nbytes) in enumerate(run(n, rank)):
        np.testing.assert_array_equal(array, block(7, 6).reshape(2, 3))
        moved = np.zeros((n, n))
        moved[root, :] = 6
        assert nbytes == convention(moved, r)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("blocking", [True, False])
def test_reduce_sums_on_a_root_other_than_zero(n, blocking):
    root = n // 2

    def rank(comm):
        recv = np.zeros(4, F32) if comm.rank == root else None
        call(comm, blocking, "Reduce", block(comm.rank, 4), recv, root, "x")
        return recv, traced(comm)

    for r, (recv, nbytes) in enumerate(run(n, rank)):
        if r == root:
            np.testing.assert_array_equal(recv, sum(block(q, 4) for q in range(n)))
        moved = np.zeros((n, n))
        moved[:, root] = 4
        assert nbytes == convention(moved, r)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("blocking", [True, False])
def test_scatterv_uneven_counts_with_zeros(n, blocking):
    counts, root = uneven(n), n - 1
    displs = reversed_displs(counts)

    def rank(comm):
        send = None
        if comm.rank == root:
            send = np.zeros(sum(counts), F32)
            for q, (c, d) in enumerate(zip(counts, displs)):
                send[d:d + c] = block(q, c)
        recv = np.empty(counts[comm.rank], F32)
        call(comm, blocking, "Scatterv", send, counts, displs, recv, root, "x")
        return recv, traced(comm)

    for r, (recv, nbytes) in enumerate(run(n, rank)):
        np.testing.assert_array_equal(recv, block(r, counts[r]))
        moved = np.zeros((n, n))
        moved[root, :] = counts
        assert nbytes == convention(moved, r)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("blocking", [True, False])
def test_gatherv_uneven_counts_with_zeros(n, blocking):
    counts, root = uneven(n), n - 1
    displs = reversed_displs(counts)

    def rank(comm):
        recv = np.full(sum(counts), -1, F32) if comm.rank == root else None
        call(comm, blocking, "Gatherv", block(comm.rank, counts[comm.rank]), recv, counts, displs, root, "x")
        return recv, traced(comm)

    for r, (recv, nbytes) in enumerate(run(n, rank)):
        if r == root:
            for q, (c, d) in enumerate(zip(counts, displs)):
                np.testing.assert_array_equal(recv[d:d + c], block(q, c))
        moved = np.zeros((n, n))
        moved[:, root] = counts
        assert nbytes == convention(moved, r)


# ------------------------------------------------------------------ group collectives

@pytest.mark.parametrize("n", NS)
def test_allgatherv(n):
    counts = uneven(n)
    displs = reversed_displs(counts)

    def rank(comm):
        recv = np.full(sum(counts), -1, np.int32)
        comm.Allgatherv(block(comm.rank, counts[comm.rank]).astype(np.int32), recv, counts, displs, "x")
        return recv, traced(comm)

    for r, (recv, nbytes) in enumerate(run(n, rank)):
        for q, (c, d) in enumerate(zip(counts, displs)):
            np.testing.assert_array_equal(recv[d:d + c], block(q, c))
        moved = np.repeat(np.array(counts)[:, None], n, axis=1)  # moved[i][j] = counts[i]
        assert nbytes == convention(moved, r)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("blocking", [True, False])
def test_reduce_scatter(n, blocking):
    counts = uneven(n)
    total = sum(counts)

    def rank(comm):
        recv = np.empty(counts[comm.rank], F32)
        call(comm, blocking, "Reduce_scatter", block(comm.rank, total), recv, counts, "x")
        return recv, traced(comm)

    whole = sum(block(q, total) for q in range(n))
    for r, (recv, nbytes) in enumerate(run(n, rank)):
        lo = sum(counts[:r])
        np.testing.assert_array_equal(recv, whole[lo:lo + counts[r]])
        moved = np.repeat(np.array(counts)[None, :], n, axis=0)  # moved[i][j] = counts[j]
        assert nbytes == convention(moved, r)


def sends(n: int) -> np.ndarray:
    """Alltoallv: items rank i sends rank j, uneven, with zeros, and a non-zero diagonal."""
    return np.array([[(i + 2 * j) % 3 for j in range(n)] for i in range(n)])


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("blocking", [True, False])
def test_alltoallv(n, blocking):
    moved = sends(n)

    def rank(comm):
        me = comm.rank
        scounts, rcounts = list(moved[me]), list(moved[:, me])
        sdispls, rdispls = reversed_displs(scounts), [int(sum(rcounts[:q])) for q in range(n)]
        send = np.zeros(sum(scounts), F32)
        for q in range(n):
            send[sdispls[q]:sdispls[q] + scounts[q]] = block(me, scounts[q], q)
        recv = np.full(sum(rcounts), -1, F32)
        call(comm, blocking, "Alltoallv", send, scounts, sdispls, recv, rcounts, rdispls, "x")
        return recv, traced(comm)

    for r, (recv, nbytes) in enumerate(run(n, rank)):
        np.testing.assert_array_equal(recv, np.concatenate([block(q, moved[q, r], r) for q in range(n)]))
        assert nbytes == convention(moved, r)


@pytest.mark.parametrize("n", NS)
def test_allreduce_counts_a_ring_and_iallreduce_completes_when_waited_later(n):
    def rank(comm):
        array = block(comm.rank, 10).reshape(2, 5)
        pending = comm.Iallreduce(array, "late")
        array_copy = array.copy()
        other = np.full(3, comm.rank, F32)
        comm.Allreduce(other, "x")  # a second collective while the first is in flight
        comm.Wait(pending, "late")
        return array, array_copy, other, traced(comm, "late"), traced(comm, "x")

    whole = sum(block(q, 10) for q in range(n)).reshape(2, 5)
    for r, (array, before, other, late_bytes, x_bytes) in enumerate(run(n, rank)):
        np.testing.assert_array_equal(array, whole)
        np.testing.assert_array_equal(before, block(r, 10).reshape(2, 5))  # untouched until Wait
        np.testing.assert_array_equal(other, np.full(3, n * (n - 1) / 2))
        assert late_bytes == 2 * (2 * 40 * (n - 1) // n)
        assert x_bytes == 2 * (2 * 12 * (n - 1) // n)


@pytest.mark.parametrize("n", NS)
def test_objects_votes_metrics_and_barrier(n):
    root = n - 1

    def rank(comm):
        comm.barrier("b")
        gathered = comm.allgather_object({"rank": comm.rank})
        at_root = comm.gather_object([comm.rank] * comm.rank, root)
        vote = comm.any(comm.rank == root)
        quiet = comm.any(False)
        metrics = comm.allreduce_dict({"loss": float(comm.rank), f"only{comm.rank}": 1.0})
        return gathered, at_root, vote, quiet, metrics, comm.tracer.by_name("comm")

    for r, (gathered, at_root, vote, quiet, metrics, totals) in enumerate(run(n, rank)):
        assert gathered == [{"rank": q} for q in range(n)]
        assert at_root == ([[q] * q for q in range(n)] if r == root else None)
        assert vote and not quiet
        assert metrics == {"loss": n * (n - 1) / 2, **{f"only{q}": 1.0 for q in range(n)}}
        # as MPIComm: objects count nothing, the vote its int32, the metrics their float64s
        assert totals["b"].bytes == totals["allgather(objects)"].bytes == totals["gather(objects)"].bytes == 0
        assert totals["stop-signal vote"].bytes == 2 * 4
        assert totals["metrics"].bytes == 8 * (n + 1)


# ------------------------------------------------------------------ communicators and memory

def test_sub_communicators_match_collectives_per_communicator():
    def rank(comm):
        odd = comm.rank % 2
        sub = comm.sub([1, 3] if odd else [0, 2])
        value = np.array([comm.rank], np.int32)
        if odd:  # an extra collective on the sub-communicator only: the world's calls are not shifted
            sub.barrier()
        sub.Allreduce(value, "sub")
        world = np.array([1], np.int32)
        comm.Allreduce(world, "world")
        return sub.rank, sub.size, int(value[0]), int(world[0]), comm.sub([0, 1, 2, 3]) is comm

    assert run(4, rank) == [(0, 2, 2, 4, True), (0, 2, 4, 4, True), (1, 2, 2, 4, True), (1, 2, 4, 4, True)]


def test_sub_communicators_created_in_different_orders_fail():
    def rank(comm):
        order = {0: [(0, 1, 2), (0, 1)], 1: [(0, 1), (0, 1, 2)], 2: [(0, 1, 2)], 3: []}[comm.rank]
        for ranks in order:
            comm.sub(ranks)

    with pytest.raises(RuntimeError, match="different orders"):
        run(4, rank)


def test_split_orders_by_key_and_a_freed_sub_communicator_refuses_calls():
    def rank(comm):
        part = comm.split(comm.rank % 2, -comm.rank)
        members = part.allgather_object(comm.rank)
        sub = comm.sub([0, 1]) if comm.rank < 2 else None
        if sub is not None:
            comm.free()
            with pytest.raises(RuntimeError, match="after free"):
                sub.barrier()
        return part.rank, members

    assert run(4, rank) == [(1, [2, 0]), (1, [3, 1]), (0, [2, 0]), (0, [3, 1])]


@pytest.mark.parametrize("n", NS)
def test_shared_arrays_are_one_memory_and_a_fence_orders_writes(n):
    counts = uneven(n)

    def rank(comm):
        win, segments = comm.shared_arrays(counts)
        segments[comm.rank][...] = comm.rank + 1
        comm.memory_fence(win, "fence")
        seen = [s.copy() for s in segments]
        return segments, seen, comm.on_one_node(), traced(comm, "fence")

    results = run(n, rank)
    for segments, seen, one_node, nbytes in results:
        assert all(s is t for s, t in zip(segments, results[0][0]))
        for q, s in enumerate(seen):
            np.testing.assert_array_equal(s, np.full(counts[q], q + 1))
        assert one_node and nbytes == 0


# ------------------------------------------------------------------ failures become test failures

def test_a_deadlock_fails_with_a_timeout_naming_the_pending_calls():
    def rank(comm):
        comm.Recv(np.empty(1, F32), 1 - comm.rank, 0, "bridge")

    with pytest.raises(TimeoutError, match=r"2 of 2 ranks .*Recv from rank 1 tag 0 in layer bridge"):
        run(2, rank, timeout=0.5)


def test_a_collective_one_rank_skips_fails_with_a_timeout():
    def rank(comm):
        if comm.rank:
            comm.barrier("forgotten")

    with pytest.raises(TimeoutError, match="rank 1: .*Barrier group in layer forgotten"):
        run(3, rank, timeout=0.5)


def test_mismatched_collectives_fail_on_every_rank():
    def rank(comm):
        recv = np.zeros(1, F32)
        if comm.rank == 0:
            comm.Reduce(np.ones(1, F32), recv, 0, "x")
        else:  # a non-blocking collective never matches a blocking one (MPI-3)
            comm.Wait(comm.Ireduce(np.ones(1, F32), None, 0, "x"), "x")

    with pytest.raises(RuntimeError, match=r"mismatched: rank 0 Reduce\(root 0\), rank 1 Ireduce\(root 0\)"):
        run(2, rank)


def test_an_exception_on_one_rank_is_raised_naming_it_and_releases_the_others():
    def rank(comm):
        if comm.rank == 2:
            raise KeyError("boom")
        comm.barrier()

    with pytest.raises(KeyError, match="boom") as info:
        run(3, rank)
    assert "raised on rank 2 of 3" in info.value.__notes__[-1]


def test_abort_raises_in_every_rank():
    def rank(comm):
        if comm.rank == 1:
            comm.abort(3)
        comm.Recv(np.empty(1, F32), 1, 0, "x")

    with pytest.raises(LocalAbort, match=r"rank 1 called abort\(3\)") as info:
        run(3, rank)
    assert info.value.origin == 1


def test_a_lone_endpoint_times_out_instead_of_hanging():
    comm = LocalGroup(1, timeout=0.2).comms[0]
    comm.Isend(np.ones(2, F32), 0, 1, "self")  # to itself: eager, then received
    got = np.empty(2, F32)
    comm.Recv(got, 0, 1, "self")
    np.testing.assert_array_equal(got, 1)
    with pytest.raises(TimeoutError, match="Recv from rank 0 tag 2"):
        comm.Recv(got, 0, 2, "self")


# ------------------------------------------------------------------ what a server's loop uses

def test_waitany_returns_the_ready_receive_and_its_source_and_cancel_withdraws_the_rest():
    import numpy as np

    from singa_mpi.communication.local import run_ranks

    def rank(comm):
        if comm.rank == 0:
            boxes = {r: np.zeros(2, np.float32) for r in (1, 2)}
            requests = [comm.Irecv(boxes[r], r, 7, "t") for r in (1, 2)]
            index, source = comm.Waitany(requests, "t")  # only rank 2 has sent: rank 1 waits for "go"
            order = [(index, source, boxes[source].tolist())]
            comm.send_object("go", 1, 8, "t")
            index, source = comm.Waitany(requests, "t")  # the one still active
            order.append((index, source, boxes[source].tolist()))
            late = [comm.Irecv(np.zeros(2, np.float32), 1, 8, "t")]
            comm.Cancel(late, "t")
            comm.Waitall(late, "t")  # a cancelled request needs no message
            comm.send_object({"done": order}, 1, 9, "t")
            return order
        if comm.rank == 2:
            comm.Send(np.full(2, 2.0, np.float32), 0, 7, "t")
            return None
        assert comm.recv_object(0, 8, "t") == "go"
        comm.Send(np.full(2, 1.0, np.float32), 0, 7, "t")
        return comm.recv_object(0, 9, "t")

    results = run_ranks(3, rank, timeout=20)
    assert results[0] == [(1, 2, [2.0, 2.0]), (0, 1, [1.0, 1.0])]
    assert results[1] == {"done": results[0]}


def test_the_ranks_share_the_cores_blas_threads_and_the_users_setting_wins(monkeypatch):
    """n ranks as threads of one process: numpy's BLAS has cores // n threads while they run, and its
    own count again afterwards; with OMP_NUM_THREADS etc. set nothing is limited."""
    from blas_threads import numpy_blas_threads
    from singa_mpi import threads

    def numpy_blas(comm=None) -> int:
        return numpy_blas_threads()

    for name in threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "cores_available", lambda: 6)
    before = numpy_blas()
    assert [run(n, numpy_blas) for n in (2, 3, 4)] == [[3, 3], [2, 2, 2], [1, 1, 1, 1]]
    assert run(1, numpy_blas) == [before]  # one rank shares nothing
    assert numpy_blas() == before
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "5")
    assert run(2, numpy_blas) == [before, before]
