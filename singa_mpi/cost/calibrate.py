"""``singa-mpi calibrate`` under mpiexec: this machine's communicator rates (latency and bandwidth of
point-to-point, Allreduce, Allgatherv, Alltoallv, memory), saved for ``plan --cost``; on several nodes
the network's and rank 0's node's own."""
from __future__ import annotations

import socket

from singa_mpi import threads
from singa_mpi.cost import rates


def calibrate(world, library: str) -> list[str]:
    """Measure and save the rates (collective over ``world``); one line per measurement saved."""
    flavor = "openmpi" if "Open MPI" in library else "mpich"
    hosts = world.allgather_object(socket.gethostname(), "calibrate(hosts)")
    lines = []
    for where, comm, peer, nodes in measurements(world, hosts):
        with threads.limit_blas(1):
            entry = rates.calibrate_comm(comm, peer=peer)
        if entry is not None:
            rates.save(entry, flavor, nodes)
            lines.append(f"calibrated {library} on {comm.size} ranks ({where}): point-to-point "
                         f"{1e6 * entry['p2p']['latency']:.1f} us + {entry['p2p']['bandwidth'] / 1e9:.2f} GB/s, "
                         f"Allreduce ring step {1e6 * entry['allreduce']['latency']:.1f} us + "
                         f"{entry['allreduce']['bandwidth'] / 1e9:.2f} GB/s, Allgatherv "
                         f"{1e6 * entry['collective']['latency']:.1f} us + "
                         f"{entry['collective']['bandwidth'] / 1e9:.2f} GB/s, "
                         f"Alltoallv {1e6 * entry['alltoall']['latency']:.1f} us + "
                         f"{entry['alltoall']['bandwidth'] / 1e9:.2f} GB/s, "
                         f"memory {entry['memory'] / 1e9:.1f} GB/s; saved in {rates.rates_path()}")
    return lines


def measurements(world, hosts: list[str]) -> list[tuple]:
    """(what, communicator, rank 0's ping-pong partner, nodes) to measure: on one node, the node's
    rates; on several, the network's from rank 0 to a rank elsewhere and over everyone, then the
    node's own among the ranks on rank 0's node (plan --cost --nodes N mixes the two)."""
    if world.on_one_node():
        return [("one node", world, 1, 1)]
    elsewhere = next((r for r, host in enumerate(hosts) if host != hosts[0]), world.size - 1)
    runs = [("between nodes", world, elsewhere, 2)]
    neighbours = tuple(r for r, host in enumerate(hosts) if host == hosts[0])
    if len(neighbours) > 1 and world.rank in neighbours:
        runs.append(("within rank 0's node", world.sub(neighbours), 1, 1))
    return runs
