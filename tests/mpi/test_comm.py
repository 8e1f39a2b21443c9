"""Communicator calls the MPI runs depend on beyond the layers' exchanges (under mpiexec)."""
import time

from conftest import agree


def test_root_value_reaches_every_rank_while_the_others_sleep_through_a_slow_root(world):
    started = time.perf_counter()
    if world.rank == 0:
        time.sleep(0.3)  # timing kernels, as the cost model does before choosing
    value = world.root_value({"chosen": [0, 1, -1], "by": world.rank} if world.rank == 0 else None, "test")
    waited = time.perf_counter() - started
    agree(world, value == {"chosen": [0, 1, -1], "by": 0}, f"got {value}")
    agree(world, world.rank == 0 or waited >= 0.25, f"waited only {waited:.3f} s")


def test_waiting_for_the_root_costs_little_cpu(world):
    if world.size == 1:
        return
    before = time.process_time()
    if world.rank == 0:
        time.sleep(0.5)
    world.root_value(None, "test")
    used = time.process_time() - before
    agree(world, world.rank == 0 or used < 0.25, f"spent {used:.3f} s of CPU waiting 0.5 s")
