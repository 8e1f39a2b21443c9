"""How far a partitioned run drifts from the serial one along a whole trajectory (a measurement, not a test).

    mpiexec -n 3 env SINGA_MPI_TEST_TMP=/tmp/drift python tests/mpi/drift.py --steps 1 10 50

Every rank trains the job partitioned and serially; rank 0 prints, for each
job and each requested step, the largest relative parameter difference
(max |partitioned - serial| / max |serial| over each param, the worst param)
and the relative loss difference.  Beside each whole-trajectory figure it
prints the lock-step figures: the worst difference, over the steps so far, of
one step taken by both from the serial run's state (params and updater state):
the momentum history it leaves (the update, relative to its largest value) and
the loss.  That is what float32 summation order alone produces.

``--perturb 1e-7`` replaces the partitioned whole-trajectory run with a serial
one whose initial params are multiplied by (1 + 1e-7·N(0, 1)): rounding-sized
noise without partitioning.  ``--smooth`` swaps ReLU for STanh and max for
average pooling in every job, which removes the decisions that can flip.

    cd /tmp/cifar && singa-mpi data synthetic --like /path/to/conf/cifar10_hybrid.conf
    mpiexec -n 2 env SINGA_MPI_TEST_TMP=/tmp/drift python tests/mpi/drift.py \\
        --jobs /path/to/conf/cifar10_hybrid.conf --steps 1 10 50 91
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import nets  # noqa: E402
import oracle  # noqa: E402
from singa_mpi.communication import mpi as comm_module  # noqa: E402

JOBS = {
    "mlp data": lambda path, batch, n: nets.mlp(path, batch, "data", n, steps=10_000),
    "mlp feature": lambda path, batch, n: nets.mlp(path, batch, "feature", n, steps=10_000),
    "mlp hybrid": lambda path, batch, n: nets.mlp(path, batch, "hybrid", n, steps=10_000),
    "convnet hybrid": lambda path, batch, n: nets.convnet(path, batch, "hybrid", steps=10_000),
    "convnet data": lambda path, batch, n: nets.convnet(path, batch, "data", steps=10_000),
    "convnet filters": lambda path, batch, n: nets.convnet(path, batch, "filters", steps=10_000),
    "convnet hybrid avgpool": lambda path, batch, n: nets.convnet(path, batch, "hybrid", steps=10_000, pool="AVG"),
    "convnet data avgpool": lambda path, batch, n: nets.convnet(path, batch, "data", steps=10_000, pool="AVG"),
    "cifar hybrid": lambda path, batch, n: nets.cifar_convnet(path, batch, "hybrid", steps=10_000),
    "cifar data": lambda path, batch, n: nets.cifar_convnet(path, batch, "data", steps=10_000),
}
SHAPES = {"mlp": (12,), "convnet": (2, 8, 8), "cifar": (3, 16, 16)}  # per sample
CLASSES = {"mlp": 5, "convnet": 5, "cifar": 10}


def worst_error(got: dict, want: dict) -> float:
    return max(oracle.relative_error(got[name], value) for name, value in want.items())


def worst_name(got: dict, want: dict) -> str:
    return max(want, key=lambda name: oracle.relative_error(got[name], want[name]))


def measure(world, name: str, batch: int, marks: list[int], perturb: float = 0.0, smooth: bool = False) -> list[tuple]:
    """(step, trajectory param error, trajectory loss error, lock-step update error, lock-step loss error)."""
    if name.endswith(".conf"):
        with open(name) as f:
            text = f.read()
    else:
        kind = name.split()[0]
        path = nets.make_data(oracle.scratch(f"drift_data_{kind}", world.rank) + ".h5", 256, SHAPES[kind], CLASSES[kind])
        text = JOBS[name](path, batch, world.size)
    if smooth:
        text = text.replace("type: kReLU", "type: kSTanh").replace("pool: MAX", "pool: AVG")
    tag = f"drift_{os.path.basename(name).replace(' ', '_')}_{batch}"
    if perturb:  # left to drift
        free = oracle.serial(text, oracle.scratch(tag + "_perturbed", world.rank))
        rng = np.random.default_rng(world.rank)
        for param in free.train_net.params:
            param.data *= (1 + perturb * rng.standard_normal(param.data.shape)).astype(np.float32)
    else:
        free = oracle.partitioned(text, oracle.scratch(tag, world.rank), world)
    locked = oracle.partitioned(text, oracle.scratch(tag + "_locked", world.rank), world)  # reset every step
    serial = oracle.serial(text, oracle.scratch(tag, world.rank))
    rows, worst_locked = [], (0.0, 0.0)
    for index in range(max(marks)):
        oracle.load(locked, oracle.snapshot(serial, index))
        free_loss, locked_loss, serial_loss = (oracle.step(t, index) for t in (free, locked, serial))
        locked_ckpt, want = oracle.snapshot(locked, index + 1), oracle.snapshot(serial, index + 1)
        if world.rank == 0:  # momentum history after the step: -lr·gradient + m·(the same history)
            update_error = worst_error({n: slots["history"] for n, slots in locked_ckpt.updater.items()},
                                       {n: slots["history"] for n, slots in want.updater.items()})
            worst_locked = max(worst_locked[0], update_error), max(worst_locked[1], abs(locked_loss / serial_loss - 1))
        if index + 1 in marks:
            free_ckpt = oracle.snapshot(free, index + 1)
            if world.rank == 0:
                rows.append((index + 1, worst_error(free_ckpt.params, want.params), abs(free_loss / serial_loss - 1),
                             *worst_locked, worst_name(free_ckpt.params, want.params)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--jobs", nargs="+", default=list(JOBS),
                        help=f"of: {', '.join(JOBS)}; or job .conf files (run where their data is, batch as given)")
    parser.add_argument("--batch", type=int, nargs="+", help="default: 4n and 4n + 1 (n ranks)")
    parser.add_argument("--perturb", type=float, default=0.0,
                        help="trajectory of a serial run with params perturbed by this relative noise instead")
    parser.add_argument("--smooth", action="store_true", help="STanh for ReLU, average for max pooling")
    args = parser.parse_args()
    world = comm_module.world()
    if world.rank == 0:
        print(f"{world.size} ranks; relative to the serial value's largest magnitude, worst param")
        print(f"{'':<36}{'trajectory':>20}{'lock-step':>20}")
        print(f"{'job':<24}{'batch':>6}{'step':>6}{'params':>10}{'loss':>10}{'update':>10}{'loss':>10}  worst param")
    for name in args.jobs:
        for batch in [0] if name.endswith(".conf") else args.batch or (4 * world.size, 4 * world.size + 1):
            for mark, *errors, worst in measure(world, name, batch, sorted(args.steps), args.perturb, args.smooth):
                print(f"{name:<24}{batch:>6}{mark:>6}" + "".join(f"{e:>10.1e}" for e in errors) + f"  {worst}",
                      flush=True)


if __name__ == "__main__":
    main()
