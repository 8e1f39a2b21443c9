"""Machine rates for the cost model: memory bandwidth, and latency + bandwidth of the communicator.

Memory bandwidth (an element-wise pass, as the updaters and shared-memory sums make) is measured here
in one process.  The communicator's rates are measured on the launched communicator by
``mpiexec -n N singa-mpi calibrate`` (:func:`calibrate_comm`): ping-pong between ranks 0 and 1 and an
Allreduce over all, at a few sizes, each fitted to ``latency + bytes / bandwidth``; they are cached per
machine, MPI library and node count (one node: shared-memory transport; several: the network).
Without a calibration, ``plan --cost`` assumes a point-to-point copy at half the memory bandwidth and
5 µs of latency, and says so.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time

import numpy as np

from singa_mpi.cost.kernels import cache_path, cpu_model

SIZES = (8, 64 << 10, 1 << 20, 8 << 20)  # bytes per message in the fits
DEFAULT_LATENCY = 5e-6


@dataclasses.dataclass
class Link:
    """time(bytes) = latency + bytes / bandwidth."""

    latency: float
    bandwidth: float  # bytes/s

    def time(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth if nbytes > 0 else 0.0


@dataclasses.dataclass
class Rates:
    memory: float  # bytes/s of an element-wise pass (bytes read + written)
    p2p: Link
    allreduce: Link  # per ring step: time = 2 (n-1) latency + 2 (n-1)/n bytes / bandwidth
    collective: Link  # a concat's Allgatherv with its packing: bytes = what one member receives
    source: str  # "calibrated (...)" or "assumed"

    def ring_allreduce(self, nbytes: float, n: int) -> float:
        if n <= 1 or nbytes <= 0:
            return 0.0
        return 2 * (n - 1) * self.allreduce.latency + 2 * (n - 1) / n * nbytes / self.allreduce.bandwidth

    def copy(self, nbytes: float) -> float:
        return nbytes / self.memory


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
    return f"{platform.node()}|{cpu_model()}|{flavor}|nodes{nodes}"


def load(flavor: str | None = None, nodes: int = 1) -> Rates:
    """The cached rates of this machine and MPI (default: $SINGA_MPI_FLAVOR, else MPICH, as the launcher
    picks), or assumed ones (memory bandwidth measured now)."""
    flavor = flavor or os.environ.get("SINGA_MPI_FLAVOR") or "mpich"
    try:
        table = json.loads(rates_path().read_text())
    except (OSError, ValueError):
        table = {}
    entry = table.get(comm_key(flavor, nodes))
    if entry and "collective" not in entry:  # written by an older calibrate
        entry = None
    if entry:
        return Rates(entry["memory"], Link(**entry["p2p"]), Link(**entry["allreduce"]), Link(**entry["collective"]),
                     f"calibrated ({entry['when']}, {entry['ranks']} ranks, {flavor}, {nodes} node(s))")
    memory = measure_memory()
    assumed = Link(DEFAULT_LATENCY, memory / 2)
    return Rates(memory, assumed, assumed, assumed, "assumed: no calibration of the communicator (run: mpiexec -n 2 singa-mpi calibrate)")


def fit(points: list[tuple[int, float]]) -> Link:
    """Least squares of time = latency + bytes / bandwidth."""
    x = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    slope, intercept = np.polyfit(x, y, 1, w=1 / y)  # relative errors: small messages count as much as big
    return Link(max(intercept, 1e-7), 1.0 / max(slope, 1e-15))


def calibrate_comm(comm, repeats: int = 20) -> dict | None:
    """Measure ping-pong (ranks 0 and 1) and Allreduce (all) on ``comm``; rank 0 gets the fitted entry."""
    p2p, allreduce, collective = [], [], []
    for nbytes in SIZES:
        buf = np.zeros(max(1, nbytes // 4), np.float32)
        times = []
        for _ in range(repeats):
            comm.barrier("calibrate")
            start = time.perf_counter()
            if comm.rank == 0:
                comm.Send(buf, 1, 7, "calibrate")
                comm.Recv(buf, 1, 7, "calibrate")
            elif comm.rank == 1:
                comm.Recv(buf, 0, 7, "calibrate")
                comm.Send(buf, 0, 7, "calibrate")
            times.append((time.perf_counter() - start) / 2)
        p2p.append((buf.nbytes, statistics.median(times)))
        times = []
        for _ in range(repeats):
            comm.barrier("calibrate")
            start = time.perf_counter()
            comm.Allreduce(buf, "calibrate")
            times.append(time.perf_counter() - start)
        slowest = max(comm.allgather_object(statistics.median(times)))
        n = comm.size
        # one ring step moves bytes/n; a ring Allreduce takes 2 (n - 1) of them
        allreduce.append((buf.nbytes / n, slowest / (2 * (n - 1))))
        # as a feature-split layer's concat runs it: this rank's columns of a (64, n * width) output
        # packed, gathered, and unpacked into every rank's column block
        width = max(1, buf.size // 64)
        mine = np.ones((64, width), np.float32)
        out = np.empty((64, n * width), np.float32)
        whole = np.empty(64 * width * n, np.float32)
        counts, displs = [64 * width] * n, [64 * width * i for i in range(n)]
        times = []
        for _ in range(repeats):
            comm.barrier("calibrate")
            start = time.perf_counter()
            comm.Allgatherv(np.ascontiguousarray(mine), whole, counts, displs, "calibrate")
            out[...] = whole.reshape(n, 64, width).transpose(1, 0, 2).reshape(64, n * width)
            times.append(time.perf_counter() - start)
        collective.append((buf.nbytes * (n - 1), max(comm.allgather_object(statistics.median(times)))))
    if comm.rank != 0:
        return None
    return {"memory": measure_memory(), "p2p": dataclasses.asdict(fit(p2p)),
            "allreduce": dataclasses.asdict(fit(allreduce)),
            "collective": dataclasses.asdict(fit(collective)), "ranks": comm.size,
            "when": time.strftime("%Y-%m-%d")}


def save(entry: dict, flavor: str, nodes: int) -> None:
    path = rates_path()
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    table[comm_key(flavor, nodes)] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".rates")
    with os.fdopen(handle, "w") as f:
        json.dump(table, f, indent=1)
    os.replace(temporary, path)
