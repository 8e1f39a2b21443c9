"""Where a training step's time goes, per rank: phases, layers, communication calls.

    mpiexec -n 2 python scripts/profile_step.py --net mnist_mlp --scheme feature [--steps 20] [--layers]

Runs the example net on synthetic data under the partitioning scheme of
``bench_scaling.py`` and prints, for every rank, the milliseconds per step of
the step's phases, read from the runtime's tracer: forward, backward
(including the queued weight gradients and the backward exchanges), gradient
sums (node-shared memory or Allreduce), update.  ``--layers`` adds rank 0's
forward/backward time per (sub-)layer and each rank's time inside
communication calls per connection layer or sync.  Compare
with ``-n 1`` to see which phase scales badly.  Set one BLAS thread per rank
(OMP_NUM_THREADS=1) as bench_scaling does.
"""
from __future__ import annotations

import argparse
import shutil
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from bench_scaling import NETS, trainer_on_world  # noqa: E402


def per_step(tracer, cat: str, steps: int) -> dict[str, float]:
    """Milliseconds per step of each span name of ``cat``."""
    return {name: 1e3 * total.seconds / steps for name, total in tracer.by_name(cat).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--net", choices=list(NETS), default="mnist_mlp")
    parser.add_argument("--scheme", choices=["data", "feature", "hybrid"], default="data")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layers", action="store_true", help="per-layer and per-connection times too")
    args = parser.parse_args()

    world, folder, runtime, trainer = trainer_on_world(args.net, args.scheme, "profile")
    tracer, warmup = runtime.tracer, 3
    for step in range(warmup + args.steps):
        if step == warmup:
            tracer.reset()
        world.barrier()
        trainer.train_one_batch(step)
    steps = args.steps
    forward = sum(per_step(tracer, "forward", steps).values())
    backward = sum(per_step(tracer, "backward", steps).values())
    phase = per_step(tracer, "step", steps)
    mine = (f"forward {forward:6.2f}  backward {backward:6.2f}  sums {phase.get('sync', 0):6.2f}  "
            f"update {phase.get('update', 0):6.2f}  step "
            f"{phase.get('train_one_batch', 0) + phase.get('sync', 0) + phase.get('update', 0):6.2f}")
    inside = {k: v for k, v in per_step(tracer, "comm", steps).items() if k != "barrier"}
    layers = {(cat, name): ms for cat in ("forward", "backward") for name, ms in per_step(tracer, cat, steps).items()}
    rows = world.gather_object((mine, inside))
    if world.rank == 0:
        print(f"{args.net} {args.scheme} on {world.size} rank(s), ms per step over {steps} steps:")
        for rank, (line, _) in enumerate(rows):
            print(f"  rank {rank}: {line}")
        if args.layers:
            print("rank 0, ms per step in each (sub-)layer (communication it waits in included):")
            for (direction, name), ms in layers.items():
                print(f"  {direction:<8} {name:<36} {ms:7.2f}")
            print("ms per step inside communication calls (waits included):")
            for rank, (_, calls) in enumerate(rows):
                for label, ms in sorted(calls.items(), key=lambda kv: -kv[1]):
                    if ms >= 0.01:
                        print(f"  rank {rank}  {label:<36} {ms:7.2f}")
    runtime.close()
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
