"""How good the cost model is: predicted against measured step time, per net, scheme and rank count.

    mpiexec -n 2 singa-mpi calibrate        (once per machine; else the communicator's rates are assumed)
    python scripts/bench_cost.py [--ranks 1 2 4] [--schemes data feature hybrid pipeline 1f1b-2] [--repeat 3]
    mpiexec -n N python scripts/bench_cost.py --in-job     (every scheme in the launched world: e.g.
        across nodes, sudo scripts/two_nodes.sh --ranks-per-node 1 -- python scripts/bench_cost.py --in-job)

Each configuration of scripts/bench_scaling.py (synthetic data, one BLAS thread per rank) is predicted
with singa_mpi.cost (the plan `singa-mpi plan --cost` prints) and then measured under mpiexec; the
table gives both step times and predicted / measured.  The goal (issue #20) is within 20 % at 1-4 ranks
on a machine with a core per rank.

Each row prints as it is measured; Ctrl-C or SIGTERM (a time limit) prints the summary of the rows
done and writes them to --json (under --in-job once the prediction or the measured run under way is done:
every rank stops at the same point, rank 0 reports; exit 143 or 130; a rank that fails there ends every
rank, exit 1).  A run that fails is said in one line, the other configurations go on, and the exit code is 1.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import sys
import tempfile
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_scaling import AUTO_PIPELINE, NETS, RunFailed, launch, layout, measure, partitioned, scheme_name  # noqa: E402 - scripts/ is on the path
from bench_serial import job_on_synthetic_data  # noqa: E402
from benchkit import blas_threads_as_train, exit_code_of, positive_int, report_if_cut_short, stop_requests  # noqa: E402

SCHEMES = ["data", "feature", "hybrid", "pipeline"]


def predicted(net: str, scheme: str, ranks: int, kernels, rates, method: str = "shared_memory") -> float | None:
    """Predicted step seconds of the bench_scaling configuration, None where the planner refuses it."""
    from singa_mpi.cost.model import predict
    from singa_mpi.errors import ConfigError
    from singa_mpi.planner import plan

    conf, shape, _ = NETS[net]
    # what the cost model chooses once for a run (auto, auto-pipeline); the other schemes choose their own
    chosen = layout(net, scheme, ranks) if scheme in ("auto", AUTO_PIPELINE) else None
    with tempfile.TemporaryDirectory() as folder:
        cfg = partitioned(job_on_synthetic_data(conf, folder, shape, 256), scheme, chosen, stages=ranks)
        try:
            the_plan = plan(cfg, ranks, method=method)
        except ConfigError:
            return None
        return predict(the_plan, method, kernels, rates).step


def row(net: str, scheme: str, ranks: int, guess: float, measured: float, blas: list[int] | None = None) -> dict:
    return {"net": net, "scheme": scheme, "ranks": ranks, "predicted_ms": 1e3 * guess, "measured_ms": 1e3 * measured,
            "ratio": guess / measured, "oversubscribed": ranks > (os.cpu_count() or 1), "blas_threads": blas}


def print_row(r: dict, where: str = "") -> None:
    print(f"{r['net']:<16} {r['scheme']:<9} n={r['ranks']}{'*' if r['oversubscribed'] else ' '}{where} "
          f"predicted {r['predicted_ms']:8.2f} ms  measured {r['measured_ms']:8.2f} ms  "
          f"predicted/measured {r['ratio']:.2f}"
          + (f"  BLAS threads per rank {', '.join(map(str, r['blas_threads']))}" if r.get("blas_threads") else ""),
          flush=True)


def in_job(args, rows: list[dict], stops: list[int], world) -> None:
    """Under mpiexec: every net and scheme on ``world``, predicted for the nodes it spans (ranks in
    blocks per host: node-local rates within one, the network's between) and measured there; rank 0
    appends the rows to ``rows``.  A stop signal (``stops``, benchkit.stop_requests) ends it on every
    rank together, after the prediction or the measured run under way (a row of the runs done)."""
    import socket

    from singa_mpi import threads
    from singa_mpi.cost import rates as rate_module
    from singa_mpi.cost.kernels import KernelTimes, corunners_for

    hosts = world.allgather_object(socket.gethostname())
    nodes = len(set(hosts))
    # as the runtime chooses: node-shared memory on one node unless SINGA_MPI_SHM=0
    method = "shared_memory" if nodes == 1 and os.environ.get("SINGA_MPI_SHM", "1") != "0" else "allreduce"
    configs = [(net, scheme) for net in args.nets for scheme in args.schemes
               if scheme != "pipeline" or world.size == 2]
    guesses = None
    if world.rank == 0:
        with threads.limit_blas(1):
            kernels = KernelTimes(corunners=corunners_for(hosts.count(hosts[0])))  # beside each node peer
            network = rate_module.Network(rate_module.load(nodes=1), rate_module.load(nodes=nodes),
                                          hosts.count(hosts[0])) if nodes > 1 else rate_module.load()
            print(f"{world.size} ranks on {nodes} node(s); communicator rates: {network.source}", flush=True)
            guesses = predictions(configs, world.size, kernels, network, method, stops)
            kernels.save()
    guesses = world.root_value(guesses, "predictions")  # the others asleep while rank 0 times kernels
    for (net, scheme), guess in zip(configs, guesses):
        if world.any(bool(stops)):  # a point every rank reaches
            break
        if guess is None:
            continue
        steps = args.steps if net == "mnist_mlp" else max(5, args.steps // 2)
        results = [measure(net, scheme, steps)]
        while len(results) < args.repeat and not world.any(bool(stops)):  # each run is a point to stop at
            results.append(measure(net, scheme, steps))
        if world.rank == 0:
            rows.append(row(net, scheme, world.size, guess, statistics.median(r["step_ms"] for r in results) / 1e3,
                            results[-1]["blas_threads"]))
            rows[-1]["repeats"] = len(results)  # fewer than --repeat where a stop cut the configuration short
            print_row(rows[-1], f" ({nodes} node(s))")


def predictions(configs: list[tuple[str, str]], ranks: int, kernels, rates, method: str,
                stops: list[int]) -> list[float | None]:
    """Rank 0's predictions of ``configs``, None for those a stop signal (``stops``) left unpredicted.  The
    signal may also have ended the kernel co-runners (it reaches every process of the job): the prediction
    under way then fails, and that failure is the stop, not an error."""
    guesses: list[float | None] = []
    for net, scheme in configs:
        if stops:
            break
        try:
            guesses.append(predicted(net, scheme, ranks, kernels, rates, method))
        except Exception:
            if not stops:
                raise
    return guesses + [None] * (len(configs) - len(guesses))


def run_in_job(args, rows: list[dict], report) -> int:
    """--in-job on every rank; rank 0 reports (also when a stop signal cut it short: the rows done)."""
    from singa_mpi.communication import mpi as comm_module

    world = comm_module.world()
    with stop_requests() as stops:
        try:
            in_job(args, rows, stops, world)
        except Exception:  # the other ranks would wait for this one in their next collective for ever
            traceback.print_exc()
            print(f"bench_cost: rank {world.rank} failed (above): ending every rank", file=sys.stderr, flush=True)
            if world.rank == 0:
                with contextlib.suppress(Exception):
                    report()  # the rows measured before it
            world.abort(1)
    if world.rank == 0:
        if stops:
            print(f"\ncut short ({'SIGTERM' if exit_code_of(stops) == 143 else 'Ctrl-C'}): the rows done so far",
                  flush=True)
        report()
    return exit_code_of(stops)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--ranks", type=positive_int, nargs="+", default=[1, 2])
    parser.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    parser.add_argument("--schemes", nargs="+", default=SCHEMES, type=scheme_name, metavar="SCHEME",
                        help="as bench_scaling.py's: data, feature, hybrid, auto, auto-pipeline, pipeline, gpipe-M, 1f1b-M")
    parser.add_argument("--steps", type=positive_int, default=20, help="timed steps per run (the convnet: half)")
    parser.add_argument("--repeat", type=positive_int, default=3, help="measured runs per configuration (median)")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--in-job", action="store_true",
                        help="run under mpiexec: every net and scheme on the launched ranks (--ranks ignored)")
    args = parser.parse_args()
    blas_threads_as_train()  # as `singa-mpi train` chooses (benchkit); before any numpy work
    rows: list[dict] = []
    failed: list[str] = []  # one line per run that ended without a result

    def report() -> None:  # the rows were printed as they were measured: the summary of them
        if failed:
            print(f"{len(failed)} run(s) failed: " + "; ".join(failed), flush=True)
        within = [r for r in rows if not r["oversubscribed"]]
        if within:
            worst = max(within, key=lambda r: abs(r["ratio"] - 1))
            print(f"largest error where every rank has a core: {100 * (worst['ratio'] - 1):+.0f}% "
                  f"({worst['net']} {worst['scheme']} n={worst['ranks']}; {len(rows)} row(s))")
        print("* oversubscribed: more ranks than cores (the model assumes a core per rank)", flush=True)
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")

    if args.in_job:
        return run_in_job(args, rows, report)

    from singa_mpi import threads
    from singa_mpi.cost import rates as rate_module
    from singa_mpi.cost.kernels import KernelTimes, corunners_for

    with threads.limit_blas(1), report_if_cut_short(report):
        kernel_sets: dict[int, KernelTimes] = {}  # by co-runners: kernels timed beside the other ranks
        rates = rate_module.load()
        print(f"communicator rates: {rates.source}")
        for net in args.nets:
            for scheme in args.schemes:
                for ranks in args.ranks:
                    if scheme == "pipeline" and ranks != 2:
                        continue  # whole layers on two workers
                    corunners = corunners_for(ranks)
                    kernels = kernel_sets.setdefault(corunners, KernelTimes(corunners=corunners))
                    guess = predicted(net, scheme, ranks, kernels, rates)
                    if guess is None:
                        continue
                    steps = args.steps if net == "mnist_mlp" else max(5, args.steps // 2)
                    try:
                        measured = statistics.median(launch(net, scheme, ranks, steps)["step_ms"]
                                                     for _ in range(args.repeat)) / 1e3
                    except RunFailed as err:  # said in one line; the other configurations go on
                        failed.append(str(err))
                        print(f"  {err}", flush=True)
                        continue
                    rows.append(row(net, scheme, ranks, guess, measured))
                    print_row(rows[-1])
                    kernels.save()
    report()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
