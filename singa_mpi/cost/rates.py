"""Machine rates for the cost model: memory bandwidth, and latency + bandwidth of the communicator.

Memory bandwidth (an element-wise pass, as the updaters and shared-memory sums make) is measured here
in one process.  The communicator's rates are measured on the launched communicator by
``mpiexec -n N singa-mpi calibrate`` (:func:`calibrate_comm`): ping-pong between rank 0 and a peer (on
another node where there are several), an Allreduce, a concat's Allgatherv and an Alltoallv over all,
at sizes from 8 bytes to 32 MiB; a message's time is interpolated between the measured sizes and follows
``latency + bytes / bandwidth`` outside them.  They are cached per machine, MPI library and node count
(one node: shared-memory transport; several: the network), and :class:`Network` prices each message
of a job on several nodes with the rates of the link it crosses.
Without a calibration, ``plan --cost`` assumes a point-to-point copy at half the memory bandwidth and
5 µs of latency, and says so.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import statistics
import tempfile
import time

import numpy as np

from singa_mpi.cost.kernels import cache_path, cpu_model

SIZES = (8, 64 << 10, 1 << 20, 8 << 20, 32 << 20)  # bytes per message measured (a gradient bucket is 8 MiB)
COLLECTIVE_SIZES = SIZES[:4]  # an Allgatherv of n x 32 MiB would need gigabytes at 16 ranks
DEFAULT_LATENCY = 5e-6


@dataclasses.dataclass
class Link:
    """time(bytes): between measured sizes, interpolated from the measurements (``points``); beyond
    them, or without any, latency + bytes / bandwidth (the fit, and the numbers that are printed).

    One line does not fit every size: across TCP, 1 MiB moved at 3.6 GB/s and 8 MiB at 1.8 GB/s
    (copies out of cache), so a fit weighted to the small messages priced the gradient buckets at
    half their time."""

    latency: float
    bandwidth: float  # bytes/s
    points: tuple[tuple[float, float], ...] = ()  # (bytes, seconds), ascending

    def time(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        if len(self.points) >= 2 and self.points[0][0] <= nbytes:
            sizes, seconds = zip(*self.points)
            if nbytes <= sizes[-1]:
                return float(np.interp(nbytes, sizes, seconds))
            # past the largest: its time plus the last segment's pace
            pace = (seconds[-1] - seconds[-2]) / (sizes[-1] - sizes[-2])
            return seconds[-1] + (nbytes - sizes[-1]) * max(pace, 1.0 / self.bandwidth)
        return self.latency + nbytes / self.bandwidth


@dataclasses.dataclass
class Rates:
    memory: float  # bytes/s of an element-wise pass (bytes read + written)
    p2p: Link
    allreduce: Link  # per ring step: time = 2 (n-1) latency + 2 (n-1)/n bytes / bandwidth
    collective: Link  # a concat's Allgatherv with its packing: bytes = what one member receives
    source: str  # "calibrated (...)" or "assumed"
    alltoall: Link | None = None  # an Alltoallv with its packing, bytes as above (None: as ``collective``)

    def exchange(self, op: str) -> Link:
        """The link an exchange's collective runs at: Alltoallv its own, the others a concat's."""
        return self.alltoall if op == "Alltoallv" and self.alltoall is not None else self.collective

    def ring_allreduce(self, nbytes: float, n: int) -> float:
        """2 (n - 1) ring steps of bytes / n each (the allreduce link is calibrated per step)."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        return 2 * (n - 1) * self.allreduce.time(nbytes / n)

    def copy(self, nbytes: float) -> float:
        return nbytes / self.memory


@dataclasses.dataclass
class Network:
    """The rates a message takes: the node's own where every rank involved is on one node, the
    network's where they span nodes (a ring or a collective runs at the pace of its slowest link).
    Ranks fill the nodes in blocks of ``per_node``, as mpiexec places them by default."""

    local: Rates
    remote: Rates | None = None
    per_node: int = 0  # 0: one node

    def node(self, rank: int) -> int:
        return rank // self.per_node if self.per_node and self.remote is not None else 0

    def among(self, ranks) -> Rates:
        spans = len({self.node(r) for r in ranks}) > 1
        return self.remote if spans else self.local

    @property
    def source(self) -> str:
        if self.remote is None or not self.per_node:
            return self.local.source
        return (f"within a node {self.local.source}; between nodes ({self.per_node} ranks per node) "
                f"{self.remote.source}")


def network(nranks: int, nodes: int = 1, flavor: str | None = None) -> Network:
    """The cached rates for ``nranks`` ranks on ``nodes`` nodes (ranks in equal blocks)."""
    if nodes <= 1:
        return Network(load(flavor, 1))
    return Network(load(flavor, 1), load(flavor, nodes), -(-nranks // nodes))


def rates_path():
    return cache_path().with_name("rates.json")


def measure_memory() -> float:
    """Bytes/s (read + written) of ``a += b`` on 32 MiB float32 arrays, the best of five."""
    a, b = np.ones(8 << 20, np.float32), np.ones(8 << 20, np.float32)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        a += b
        best = min(best, time.perf_counter() - start)
    return 3 * a.nbytes / best


def comm_key(flavor: str, nodes: int) -> str:
    """One entry for one node and one for several: between nodes the network's rates are the same
    however many nodes there are (the model takes the slowest link)."""
    return f"{platform.node()}|{cpu_model()}|{flavor}|nodes{min(nodes, 2)}"


def load(flavor: str | None = None, nodes: int = 1) -> Rates:
    """The cached rates of this machine and MPI (default: $SINGA_MPI_FLAVOR, else MPICH, as the launcher
    picks), or assumed ones (memory bandwidth measured now)."""
    flavor = flavor or os.environ.get("SINGA_MPI_FLAVOR") or "mpich"
    table = _read_table()
    entry = table.get(comm_key(flavor, nodes))
    if entry and "collective" not in entry:  # written by an older calibrate
        entry = None
    calibrated = _calibrated(entry, flavor, nodes) if entry else None
    if calibrated is not None:
        return calibrated
    memory = measure_memory()
    assumed = Link(DEFAULT_LATENCY, memory / 2)
    how = ("mpiexec -n 2 singa-mpi calibrate" if nodes <= 1 else
           "singa-mpi calibrate under mpiexec with ranks on two or more nodes")
    what = (f"the calibration in {rates_path()} is damaged, assumed rates instead" if entry else
            "assumed: no calibration of the communicator")
    return Rates(memory, assumed, assumed, assumed, f"{what} (run: {how})", assumed)


def _read_table() -> dict:
    """rates.json's entries by :func:`comm_key` (empty where the file is missing or not such a table)."""
    try:
        table = json.loads(rates_path().read_text())
    except (OSError, ValueError):
        return {}
    return {key: entry for key, entry in table.items() if isinstance(entry, dict)} if isinstance(table, dict) else {}


def _calibrated(entry: dict, flavor: str, nodes: int) -> Rates | None:
    """The rates a calibration saved, None where the entry is not what calibrate writes (a field
    missing, a time or a rate not a positive number)."""
    try:  # a calibration without Alltoallv (older): Alltoallv priced as the concat's Allgatherv
        rates = Rates(float(entry["memory"]), _link(entry["p2p"]), _link(entry["allreduce"]),
                      _link(entry["collective"]),
                      f"calibrated ({entry['when']}, {entry['ranks']} ranks, {flavor}, {nodes} node(s))",
                      _link(entry["alltoall"]) if "alltoall" in entry else None)
    except (KeyError, TypeError, ValueError):
        return None
    links = [rates.p2p, rates.allreduce, rates.collective] + ([rates.alltoall] if rates.alltoall else [])
    numbers = [rates.memory] + [n for link in links for n in (link.latency, link.bandwidth, *sum(link.points, ()))]
    if not all(math.isfinite(n) and n > 0 for n in numbers):
        return None
    for link in links:  # (bytes, seconds) at ascending sizes, as fit keeps them
        if any(len(point) != 2 for point in link.points) or \
                any(a[0] >= b[0] for a, b in zip(link.points, link.points[1:])):
            return None
    return rates


def _link(entry: dict) -> Link:
    return Link(float(entry["latency"]), float(entry["bandwidth"]),
                tuple(tuple(float(n) for n in p) for p in entry.get("points", ())))


def fit(points: list[tuple[int, float]]) -> Link:
    """Least squares of time = latency + bytes / bandwidth, keeping the measurements themselves."""
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    slope, intercept = np.polyfit(x, y, 1, w=1 / y)  # relative errors: small messages count as much as big
    # times must not fall with size (a noisy point): each at least the one before
    kept = tuple((float(b), float(t)) for b, t in zip(x, np.maximum.accumulate(y)))
    return Link(max(intercept, 1e-7), 1.0 / max(slope, 1e-15), kept)


def calibrate_comm(comm, repeats: int = 20, peer: int = 1) -> dict | None:
    """Measure ping-pong (ranks 0 and ``peer``: on several nodes, a rank on another node than 0's),
    Allreduce, a concat's Allgatherv and an Alltoallv (all) on ``comm``; rank 0 gets the fitted entry."""
    p2p, allreduce, collective, alltoall = [], [], [], []
    token = np.zeros(1, np.float32)
    for nbytes in SIZES:
        buf = np.zeros(max(1, nbytes // 4), np.float32)
        runs = repeats if nbytes < 8 << 20 else max(3, repeats // 4)  # big ones vary little
        times = []
        for _ in range(runs):
            # the ranks left out wait asleep: spinning in a barrier they would take the cores (or the
            # hyperthreads) of the two that ping-pong (2+2 ranks on two cores: 1.6-2.1 GB/s, not 3.4)
            comm.root_value(None, "calibrate")
            if comm.rank == 0:  # a token there and back first: the partner is awake when the clock starts
                comm.Send(token, peer, 7, "calibrate")
                comm.Recv(token, peer, 7, "calibrate")
            elif comm.rank == peer:
                comm.Recv(token, 0, 7, "calibrate")
                comm.Send(token, 0, 7, "calibrate")
            start = time.perf_counter()
            if comm.rank == 0:
                comm.Send(buf, peer, 7, "calibrate")
                comm.Recv(buf, peer, 7, "calibrate")
            elif comm.rank == peer:
                comm.Recv(buf, 0, 7, "calibrate")
                comm.Send(buf, 0, 7, "calibrate")
            times.append((time.perf_counter() - start) / 2)
        p2p.append((buf.nbytes, statistics.median(times)))
        slowest = _slowest_median(comm, runs, lambda: comm.Allreduce(buf, "calibrate"))
        n = comm.size
        # one ring step moves bytes/n; a ring Allreduce takes 2 (n - 1) of them
        allreduce.append((buf.nbytes / n, slowest / (2 * (n - 1))))
        if nbytes not in COLLECTIVE_SIZES:
            continue
        # as a feature-split layer's concat runs it: this rank's columns of a (64, n * width) output
        # packed, gathered, and unpacked into every rank's column block
        width = max(1, buf.size // 64)
        mine = np.ones((64, width), np.float32)
        out = np.empty((64, n * width), np.float32)
        whole = np.empty(64 * width * n, np.float32)
        counts, displs = [64 * width] * n, [64 * width * i for i in range(n)]
        def concat():
            comm.Allgatherv(np.ascontiguousarray(mine), whole, counts, displs, "calibrate")
            out[...] = whole.reshape(n, 64, width).transpose(1, 0, 2).reshape(64, n * width)
        collective.append((buf.nbytes * (n - 1), _slowest_median(comm, repeats, concat)))
        alltoall.append(_alltoall_point(comm, buf.nbytes, repeats))
    if comm.rank != 0:
        return None
    return {"memory": measure_memory(), "p2p": dataclasses.asdict(fit(p2p)),
            "allreduce": dataclasses.asdict(fit(allreduce)),
            "collective": dataclasses.asdict(fit(collective)), "alltoall": dataclasses.asdict(fit(alltoall)),
            "ranks": comm.size,
            "when": time.strftime("%Y-%m-%d")}


def _alltoall_point(comm, nbytes: int, repeats: int) -> tuple[int, float]:
    """(bytes one member receives, the slowest member's median seconds) of an Alltoallv as a layer
    whose parts need other parts runs it (LRN across a feature split, a concat into fewer workers):
    a block of ``nbytes`` per member packed from a (64, width) array's columns, sent to every member,
    and the blocks received unpacked into one (64, n * width) array."""
    n = comm.size
    width = max(1, nbytes // 4 // 64)
    mine = np.ones((64, n * width), np.float32)
    send, recv = np.empty(64 * width * n, np.float32), np.empty(64 * width * n, np.float32)
    out = np.empty((64, n * width), np.float32)
    counts, displs = [64 * width] * n, [64 * width * i for i in range(n)]

    def exchange():
        send[...] = mine.reshape(64, n, width).transpose(1, 0, 2).reshape(-1)
        comm.Alltoallv(send, counts, displs, recv, counts, displs, "calibrate")
        out[...] = recv.reshape(n, 64, width).transpose(1, 0, 2).reshape(64, n * width)
    return 64 * width * 4 * (n - 1), _slowest_median(comm, repeats, exchange)


def _slowest_median(comm, repeats: int, run) -> float:
    """The slowest member's median seconds of the collective ``run``, each run started after a barrier."""
    times = []
    for _ in range(repeats):
        comm.barrier("calibrate")
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return max(comm.allgather_object(statistics.median(times)))


def save(entry: dict, flavor: str, nodes: int) -> None:
    path = rates_path()
    table = _read_table()
    table[comm_key(flavor, nodes)] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".rates")
    with os.fdopen(handle, "w") as f:
        json.dump(table, f, indent=1)
    os.replace(temporary, path)
