"""Tracing overhead: ms per training step with every span recorded (``singa-mpi train --trace``)
and without (the default: totals only).

    OMP_NUM_THREADS=1 python scripts/bench_trace.py [--steps 20] [--rounds 7]

For conf/mnist_mlp.conf (and the small default job, conf/digits_mlp.conf) on synthetic data of
the right shape (``bench_serial.job_on_synthetic_data``), one trainer runs alternating rounds of
``--steps`` steps with recording off and on, so that noise on a shared machine hits both alike.
Prints the median ms/step of each, the overhead (target <= 5% on the MNIST MLP), what an MPI rank's
writing of each step's spans to its part file costs (``singa_mpi.timeline_parts``: in the recorded
rounds), what writing the Chrome trace at the end of the run costs per recorded step, and the tracer's own cost per span
with and without recording (a tight loop, immune to the noise that whole steps see on a busy
machine) times the spans per step.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_serial import job_on_synthetic_data  # noqa: E402
from singa_mpi import timeline, timeline_parts  # noqa: E402
from singa_mpi.runtimes.serial import SerialRuntime  # noqa: E402
from singa_mpi.tracing import Tracer  # noqa: E402
from singa_mpi.trainer import Trainer  # noqa: E402

JOBS = {"mnist_mlp": ("mnist_mlp.conf", (784,), 2048), "digits_mlp": ("digits_mlp.conf", (64,), 1024)}


def bench(conf: str, shape: tuple[int, ...], count: int, steps: int, rounds: int, folder: str) -> dict:
    cfg = job_on_synthetic_data(conf, folder, shape, count)
    workspace = tempfile.mkdtemp(prefix="bench_trace_ws_", dir=folder)
    tracer = Tracer(0)
    trainer = Trainer(cfg, workspace, SerialRuntime(cfg, 1, workspace, tracer), log=lambda line: None)
    step = 0
    for _ in range(3):  # warm-up
        trainer.train_one_batch(step)
        step += 1
    times: dict[bool, list[float]] = {False: [], True: []}
    export, parts = [], []
    part = timeline_parts.PartWriter(os.path.join(folder, "trace.json"), tracer, "bench")
    for i in range(rounds):
        for record in ((False, True) if i % 2 == 0 else (True, False)):  # neither always goes first
            tracer.record = record
            tracer.restart_clock()
            start = time.perf_counter()
            flushing = 0.0
            for _ in range(steps):
                trainer.train_one_batch(step)
                step += 1
                if record:  # what an MPI rank does after each step: its new spans to its part file
                    began = time.perf_counter()
                    part.flush()
                    flushing += time.perf_counter() - began
            times[record].append((time.perf_counter() - start) / steps)
            if record:
                parts.append(flushing / steps)
            if record:
                start = time.perf_counter()
                timeline.write(os.path.join(folder, "trace.json"), [timeline.rank_trace(tracer)])
                export.append((time.perf_counter() - start) / steps)
    part.close(remove=True)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    return {"off_ms": 1e3 * off, "on_ms": 1e3 * on, "overhead": on / off - 1,
            "export_ms": 1e3 * statistics.median(export), "part_ms": 1e3 * statistics.median(parts),
            "spans": len(tracer.events) / steps}


def span_cost(record: bool, n: int = 200_000) -> float:
    """Seconds per begin/end pair of a comm-like span (the tracer alone: no noise from the net)."""
    tracer = Tracer(0, record=record)
    args = {"op": "Allreduce", "peer": "group", "tag": None}
    start = time.perf_counter()
    for _ in range(n):
        tracer.end(tracer.begin("bucket0", "comm", args), 8)
    return (time.perf_counter() - start) / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--steps", type=int, default=20, help="steps per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds with recording off, then on")
    parser.add_argument("--jobs", nargs="+", choices=list(JOBS), default=list(JOBS))
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="bench_trace_")
    threads = os.environ.get("OPENBLAS_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "default"))
    print(f"ms per training step, median of {args.rounds} rounds of {args.steps} steps (BLAS threads: {threads})")
    print("(--trace ms: an MPI rank's step, which also appends its spans to its part file: part ms/step)")
    print(f"{'job':<12}{'spans/step':>11}{'off ms':>9}{'--trace ms':>12}{'overhead':>10}{'part ms/step':>14}"
          f"{'export ms/step':>16}")
    results = {}
    for name in args.jobs:
        r = results[name] = bench(*JOBS[name], args.steps, args.rounds, folder)
        print(f"{name:<12}{r['spans']:>11.0f}{r['off_ms']:>9.3f}{r['on_ms']:>12.3f}{100 * r['overhead']:>9.1f}%"
              f"{r['part_ms']:>14.3f}{r['export_ms']:>16.3f}")
    off = min(span_cost(False) for _ in range(3))
    on = min(span_cost(True) for _ in range(3))
    print(f"one span: {1e6 * off:.2f} us with totals only, {1e6 * on:.2f} us recorded "
          f"(+{1e6 * (on - off):.2f} us); so recording adds, per step:")
    for name, r in results.items():
        extra_ms = 1e3 * r["spans"] * (on - off)
        print(f"  {name:<12}{extra_ms:.4f} ms = {100 * extra_ms / r['off_ms']:.2f}% of {r['off_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
