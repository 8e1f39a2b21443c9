"""How good the cost model is: predicted against measured step time, per net, scheme and rank count.

    mpiexec -n 2 singa-mpi calibrate        (once per machine; else the communicator's rates are assumed)
    python scripts/bench_cost.py [--ranks 1 2 4] [--schemes data feature hybrid pipeline] [--repeat 3]

Each configuration of scripts/bench_scaling.py (synthetic data, one BLAS thread per rank) is predicted
with singa_mpi.cost (the plan `singa-mpi plan --cost` prints) and then measured under mpiexec; the
table gives both step times and predicted / measured.  The goal (issue #20) is within 20 % at 1-4 ranks
on a machine with a core per rank.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_scaling import NETS, launch, partitioned  # noqa: E402 - scripts/ is on the path from here on
from bench_serial import job_on_synthetic_data  # noqa: E402

SCHEMES = ["data", "feature", "hybrid", "pipeline"]


def predicted(net: str, scheme: str, ranks: int, kernels, rates) -> float | None:
    """Predicted step seconds of the bench_scaling configuration, None where the planner refuses it."""
    from singa_mpi.cost.model import predict
    from singa_mpi.errors import ConfigError
    from singa_mpi.planner import SHARED_MEMORY, plan

    conf, shape, _ = NETS[net]
    with tempfile.TemporaryDirectory() as folder:
        cfg = partitioned(job_on_synthetic_data(conf, folder, shape, 256), scheme)
        try:
            the_plan = plan(cfg, ranks, method=SHARED_MEMORY)
        except ConfigError:
            return None
        return predict(the_plan, SHARED_MEMORY, kernels, rates).step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    parser.add_argument("--schemes", nargs="+", default=SCHEMES, choices=SCHEMES)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run (the convnet: half)")
    parser.add_argument("--repeat", type=int, default=3, help="measured runs per configuration (median)")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()

    from singa_mpi import threads
    from singa_mpi.cost import rates as rate_module
    from singa_mpi.cost.kernels import KernelTimes

    with threads.limit_blas(1):
        kernels = KernelTimes()
        rates = rate_module.load()
        print(f"communicator rates: {rates.source}")
        rows = []
        for net in args.nets:
            for scheme in args.schemes:
                for ranks in args.ranks:
                    if scheme == "pipeline" and ranks != 2:
                        continue  # whole layers on two workers
                    guess = predicted(net, scheme, ranks, kernels, rates)
                    if guess is None:
                        continue
                    steps = args.steps if net == "mnist_mlp" else max(5, args.steps // 2)
                    measured = statistics.median(launch(net, scheme, ranks, steps)["step_ms"]
                                                 for _ in range(args.repeat)) / 1e3
                    row = {"net": net, "scheme": scheme, "ranks": ranks, "predicted_ms": 1e3 * guess,
                           "measured_ms": 1e3 * measured, "ratio": guess / measured,
                           "oversubscribed": ranks > (os.cpu_count() or 1)}
                    rows.append(row)
                    print(f"{net:<16} {scheme:<9} n={ranks}{'*' if row['oversubscribed'] else ' '} "
                          f"predicted {row['predicted_ms']:8.2f} ms  measured {row['measured_ms']:8.2f} ms  "
                          f"predicted/measured {row['ratio']:.2f}", flush=True)
        kernels.save()
    within = [r for r in rows if not r["oversubscribed"]]
    if within:
        worst = max(within, key=lambda r: abs(r["ratio"] - 1))
        print(f"largest error where every rank has a core: {100 * (worst['ratio'] - 1):+.0f}% "
              f"({worst['net']} {worst['scheme']} n={worst['ranks']})")
    print("* oversubscribed: more ranks than cores (the model assumes a core per rank)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
