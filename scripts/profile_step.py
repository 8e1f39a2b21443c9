"""Where a training step's time goes, per rank and layer, for the example nets under a partitioning scheme.

    mpiexec -n 2 python scripts/profile_step.py --net mnist_mlp --scheme feature [--steps 20]
    mpiexec -n 2 python scripts/profile_step.py --net mnist_mlp --scheme zb-2

``--scheme`` takes every scheme of ``bench_scaling.py``, the pipelines too (``gpipe-M``, ``1f1b-M``,
``zb-M``, ``interleaved-M``, ``auto-pipeline``): a pipelined layer's time is summed over its
micro-batches, and each rank's time in communication calls is, for a pipeline, mostly its wait for
the neighbouring stage (fill and drain).

For any job, use ``singa-mpi train JOB --profile`` (or ``mpiexec -n N python -m singa_mpi train
JOB --profile``): it prints the same table at the end of the run and writes it to
WORKSPACE/profile.json.  This script is the quick variant for the two example nets: synthetic
data, the partitioning scheme of ``bench_scaling.py``, warm-up steps left out, ranks lined up by
a barrier before every step (left out of the table).  Compare with ``-n 1`` to see which phase
scales badly.  ``--beside`` adds the cost model's prediction of each layer beside the measured table
(as ``train --profile`` prints it): where a prediction at many ranks is off, which layer is.  Each rank
gets the BLAS threads `singa-mpi train` would give it (OMP_NUM_THREADS & co.
when set, else the node's cores shared among its ranks); the header says how many.
"""
from __future__ import annotations

import argparse
import shutil
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from bench_scaling import NETS, scheme_name, trainer_on_world  # noqa: E402
from benchkit import blas_threads_as_train  # noqa: E402
from singa_mpi import profiling  # noqa: E402
from singa_mpi.cost.beside import Prediction, beside_lines  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--net", choices=list(NETS), default="mnist_mlp")
    parser.add_argument("--scheme", type=scheme_name, default="data",
                        help="a scheme of bench_scaling.py: data, feature, hybrid, auto, pipeline, auto-pipeline, "
                             "gpipe-M, 1f1b-M, zb-M, interleaved-M (+det, +detN: deterministic mode)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--beside", action="store_true",
                        help="the cost model's step per layer beside the measured one (times kernels once per machine)")
    args = parser.parse_args()

    world, folder, runtime, trainer = trainer_on_world(args.net, args.scheme, "profile")
    blas = world.gather_object(blas_threads_as_train(trainer.cfg, runtime.size))  # before the first step
    tracer, warmup = runtime.tracer, 3
    for step in range(warmup + args.steps):
        if step == warmup:
            tracer.reset()
        world.barrier()
        trainer.train_one_batch(step)
    part = profiling.worker_part(tracer, {})
    part["train"] = [row for row in part["train"] if row["name"] != "barrier"]  # this script's own
    parts = world.gather_object(part)
    prediction = runtime.predict_step() if args.beside else None  # collective; after the timed steps
    if world.rank == 0:
        print(f"{args.net} {args.scheme} on {world.size} rank(s); BLAS threads per rank: "
              f"{', '.join(str(n) for n in blas)}")
        profile = profiling.build(parts)
        print(profiling.format_table(profile))
        if isinstance(prediction, Prediction):
            print("\n".join(beside_lines(profile, prediction)))
        elif prediction is not None:
            print(prediction)
    runtime.close()
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
