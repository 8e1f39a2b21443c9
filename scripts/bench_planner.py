"""How fast the partition planner is: a 100-layer net planned for 8 workers (target: under a second).

    python scripts/bench_planner.py [--layers 100] [--ranks 8] [--width 64] [--repeat 5]
    python scripts/bench_planner.py --growth --ranks 1024 --repeat 1    (8, 16, ... 1,024 ranks)

Goals (issue 20): under 1 s at 64 ranks and under 10 s at 1,024, growing with ranks x layers (the
sub-layers every rank must know), not with the exchange pieces (ranks^2 per batch-to-feature edge,
counted here but never listed one by one).

The net alternates inner-product and ReLU layers with partition_dim cycling 0, 1, -1 (at varying
locations), so the plan has Allgatherv, Alltoallv, Gatherv, Scatterv and bridge connections and
param syncs; the time covers planning, the schedule's safety proof and nothing else.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from singa_mpi.config.load import parse_job  # noqa: E402
from singa_mpi.planner import plan  # noqa: E402
from singa_mpi.planner.regions import as_array, overlap_sizes  # noqa: E402


def net_text(layers: int, ranks: int, width: int = 64) -> str:
    batch = max(256, ranks)  # every batch-split layer needs a row per rank
    lines = ['layer { name: "data" type: kRecordInput store_conf { backend: "hdf5" path: "x.h5" '
             f'batchsize: {batch} shape: 64 }} }}']
    src = "data"
    pdims = ["partition_dim: 0", "partition_dim: 1", "partition_dim: -1 location: {loc}"]
    for i in range((layers - 2) // 2):
        pdim = pdims[i % 3].format(loc=i % ranks)
        lines.append(f'layer {{ name: "fc{i}" type: kInnerProduct srclayers: "{src}" {pdim} '
                     f'innerproduct_conf {{ num_output: {width} }} param {{ name: "w{i}" init {{ type: kGaussian }} }} '
                     f'param {{ name: "b{i}" init {{ type: kConstant value: 0 }} }} }}')
        lines.append(f'layer {{ name: "relu{i}" type: kReLU srclayers: "fc{i}" {pdim} }}')
        src = f"relu{i}"
    lines.append(f'layer {{ name: "loss" type: kSoftmaxLoss srclayers: "{src}" srclayers: "data" }}')
    return ('name: "deep" train_steps: 1 train_one_batch { alg: kBP } '
            'updater { type: kSGD learning_rate { type: kFixed base_lr: 0.1 } }\n'
            'neuralnet {\n' + "\n".join(lines) + "\n}\n")


def plan_seconds(layers: int, ranks: int, width: int, repeat: int):
    """(median seconds, the last plan) of planning and verifying the net on ``ranks`` workers."""
    cfg = parse_job(net_text(layers, ranks, width), "<bench>")
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        the_plan = plan(cfg, ranks)
        times.append(time.perf_counter() - start)
    return statistics.median(times), the_plan


def piece_count(the_plan) -> int:
    """(holder, receiver) blocks of every exchange, counted from the region tables."""
    return sum(int((overlap_sizes(as_array(e.holders)[1], as_array(e.needs)[1]) > 0).sum())
               for e in the_plan.exchanges)


def growth(layers: int, most: int, repeat: int) -> None:
    """Plan time from 8 ranks to ``most``, doubling; layers as wide as the ranks (64 at least), so
    every one splits that far.  Pieces: the (sender, receiver) blocks of all exchanges."""
    print(f"{'ranks':>6}  {'ms per plan':>12}  {'x previous':>10}  {'sub-layers':>11}  {'exchange pieces':>16}")
    ranks, previous = 8, None
    while ranks <= most:
        seconds, the_plan = plan_seconds(layers, ranks, max(64, ranks), repeat)
        ratio = f"{seconds / previous:>10.1f}" if previous else f"{'-':>10}"
        print(f"{ranks:>6}  {1e3 * seconds:>12,.0f}  {ratio}  {len(the_plan.sublayers):>11,}  "
              f"{piece_count(the_plan):>16,}", flush=True)
        previous, ranks = seconds, ranks * 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--layers", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--width", type=int, default=64, help="outputs per inner-product layer")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--growth", action="store_true", help="a table from 8 ranks to --ranks, doubling")
    args = parser.parse_args()
    if args.growth:
        growth(args.layers, args.ranks, args.repeat)
        return 0
    seconds, the_plan = plan_seconds(args.layers, args.ranks, args.width, args.repeat)
    print(f"planned {args.layers} layers on {args.ranks} workers: "
          f"{len(the_plan.sublayers)} sub-layers, {len(the_plan.exchanges)} exchanges, "
          f"{len(the_plan.param_syncs)} param syncs; median {1e3 * seconds:.0f} ms per plan")
    return 0


if __name__ == "__main__":
    sys.exit(main())
