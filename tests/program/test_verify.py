"""The programs' safety proof on hand-made programs (no MPI): :func:`singa_mpi.program.verify.simulate`
must finish every program that MPI would finish and name the stuck calls of one that would hang."""
import pytest

from singa_mpi.errors import ConfigError
from singa_mpi.program.actions import Comm, Wait
from singa_mpi.program.verify import check_collectives, check_pairs, simulate


def send(rank, peer, tag=0):
    return Comm(rank, "Send", peer, (rank, peer), None, tag, (4,), "float32", f"s{tag}", "forward",
                  f"forward:{tag}", 16, 0)


def recv(rank, peer, tag=0):
    return Comm(rank, "Recv", peer, (peer, rank), None, tag, (4,), "float32", f"r{tag}", "forward",
                  f"forward:{tag}", 0, 16)


def coll(rank, key, group):
    return Comm(rank, "Allreduce", None, tuple(group), None, None, (4,), "float32", key, "params",
                  f"params:{key}", 0, 0)


def test_a_ring_of_sends_then_receives_finishes():
    n = 5
    simulate({r: [send(r, (r + 1) % n), recv(r, (r - 1) % n)] for r in range(n)})


def test_receiving_first_all_round_the_ring_deadlocks_and_names_every_rank():
    n = 3
    with pytest.raises(ConfigError, match="would deadlock") as err:
        simulate({r: [recv(r, (r - 1) % n), send(r, (r + 1) % n)] for r in range(n)})
    assert all(f"rank {r}: forward Recv" in str(err.value) for r in range(n))


def test_collectives_entered_in_different_orders_deadlock():
    group = (0, 1)
    sched = {0: [coll(0, "a", group), coll(0, "b", group)], 1: [coll(1, "b", group), coll(1, "a", group)]}
    check_collectives(sched)  # members and ops agree: only the order is wrong
    with pytest.raises(ConfigError, match="would deadlock"):
        simulate(sched)


def test_a_collective_waits_for_a_member_blocked_on_a_receive():
    # stuck: rank 0 sends to rank 2 after a collective that rank 2 reaches only after that send
    group = (0, 1, 2)
    stuck = {0: [coll(0, "a", group), send(0, 2)], 1: [coll(1, "a", group)], 2: [recv(2, 0), coll(2, "a", group)]}
    with pytest.raises(ConfigError, match="rank 2: forward Recv"):
        simulate(stuck)
    fine = {0: [send(0, 2), coll(0, "a", group)], 1: [coll(1, "a", group)], 2: [recv(2, 0), coll(2, "a", group)]}
    simulate(fine)


def test_many_ranks_and_subgroup_collectives_finish():
    n = 64
    sched = {r: [coll(r, "all", range(n)), coll(r, f"pair{r // 2}", (r - r % 2, r - r % 2 + 1)),
                 send(r, (r + 1) % n, 1), recv(r, (r - 1) % n, 1), coll(r, "end", range(n))] for r in range(n)}
    simulate(sched)


def start(rank, key, group):
    """A non-blocking collective (a gradient bucket's Iallreduce): completes at its Wait."""
    return Comm(rank, "Iallreduce", None, tuple(group), None, None, (4,), "float32", key, "params",
                f"params:{key}", 0, 0, blocking=False, by="sync")


def test_a_bucket_started_mid_backward_does_not_hold_the_rank_there():
    # rank 0 starts the bucket, then sends what rank 1 waits for before it starts the bucket: only a
    # blocking reading of the start would deadlock
    group = (0, 1)
    simulate({0: [start(0, "b", group), send(0, 1), Wait("b", "Iallreduce")],
              1: [recv(1, 0), start(1, "b", group), Wait("b", "Iallreduce")]})


def test_a_wait_blocks_until_every_member_started():
    group = (0, 1)
    with pytest.raises(ConfigError, match="rank 0: wait Iallreduce"):
        simulate({0: [start(0, "b", group), Wait("b", "Iallreduce"), send(0, 1)],
                  1: [recv(1, 0), start(1, "b", group), Wait("b", "Iallreduce")]})


def test_the_nth_message_of_a_channel_needs_the_nth_send():
    # CD sends over one bridge once per Gibbs round: the second receive must wait for the second send
    simulate({0: [send(0, 1), send(0, 1)], 1: [recv(1, 0), recv(1, 0)]})
    with pytest.raises(ConfigError, match="rank 1: forward Recv"):
        simulate({0: [send(0, 1), recv(0, 1, tag=5), send(0, 1)],
                  1: [recv(1, 0), recv(1, 0), send(1, 0, tag=5)]})


def test_a_send_without_its_receive_is_named():
    with pytest.raises(ConfigError, match="unpaired bridge"):
        check_pairs({0: [send(0, 1), send(0, 1)], 1: [recv(1, 0)]})


def irecv(rank, peer, tag=0):
    return Comm(rank, "Irecv", peer, (peer, rank), None, tag, (4,), "float32", "gather", "backward",
                f"backward:{tag}", 0, 16, blocking=False)


def test_one_wait_for_several_started_receives_needs_every_one():
    # an exchange sent as messages: rank 0 gets a gradient piece from ranks 1 and 2 and waits once
    finishing = {0: [irecv(0, 1), irecv(0, 2), Wait("gather", "Irecv"), send(0, 1, tag=7)],
                 1: [send(1, 0), recv(1, 0, tag=7)], 2: [send(2, 0)]}
    simulate(finishing)
    # rank 2 sends its piece only after what rank 0 sends after its wait: the wait cannot end
    with pytest.raises(ConfigError, match="rank 0: wait Irecv.*rank 2: forward Recv"):
        simulate({0: [irecv(0, 1), irecv(0, 2), Wait("gather", "Irecv"), send(0, 2, tag=7)],
                  1: [send(1, 0)], 2: [recv(2, 0, tag=7), send(2, 0)]})
