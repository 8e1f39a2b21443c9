"""Where a training step's time goes, per rank: phases, layers, communication calls.

    mpiexec -n 2 python scripts/profile_step.py --net mnist_mlp --scheme feature [--steps 20] [--layers]

Runs the example net on synthetic data under the partitioning scheme of
``bench_scaling.py`` and prints, for every rank, the median milliseconds of the
step's phases: forward, backward (including the queued weight gradients and
the backward exchanges), gradient sums (node-shared memory or Allreduce),
update.  ``--layers`` adds rank 0's forward/backward time per (sub-)layer and
each rank's time inside communication calls per connection layer.  Compare
with ``-n 1`` to see which phase scales badly.  Set one BLAS thread per rank
(OMP_NUM_THREADS=1) as bench_scaling does.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from bench_scaling import NETS, trainer_on_world  # noqa: E402


def timed_layers(net, table: dict) -> None:
    """Wrap each layer's forward/backward to add its seconds to ``table[(direction, name)]``."""
    for layer in net.layers:
        for direction in ("forward", "backward"):
            method = getattr(layer, direction)

            def wrapper(*args, _method=method, _key=(direction, layer.name)):
                start = time.perf_counter()
                result = _method(*args)
                table.setdefault(_key, []).append(time.perf_counter() - start)
                return result

            setattr(layer, direction, wrapper)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--net", choices=list(NETS), default="mnist_mlp")
    parser.add_argument("--scheme", choices=["data", "feature", "hybrid"], default="data")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layers", action="store_true", help="per-layer and per-connection times too")
    args = parser.parse_args()

    world, folder, runtime, trainer = trainer_on_world(args.net, args.scheme, "profile")
    net, warmup = trainer.train_net, 3
    layer_times: dict = {}
    timed_layers(net, layer_times)
    phases: dict[str, list[float]] = {name: [] for name in ("forward", "backward", "sums", "update", "step")}
    for step in range(warmup + args.steps):
        if step == warmup:
            world.accounts.clear()
            layer_times.clear()
        world.barrier()
        marks = [time.perf_counter()]
        runtime.begin_step(step)
        for layer in net.layers:
            layer.ctx.step = step
        net.zero_grads()
        net.forward(train=True)
        marks.append(time.perf_counter())
        net.backward(runtime.gradient_hook(net))
        net.finish_grads()
        marks.append(time.perf_counter())
        runtime.reduce_gradients(net)
        marks.append(time.perf_counter())
        for param in runtime.owned_params(net):
            trainer.updater.update(step, param)
        runtime.finish_update()
        marks.append(time.perf_counter())
        if step >= warmup:
            for name, begin, end in zip(phases, marks, marks[1:]):
                phases[name].append(end - begin)
            phases["step"].append(marks[-1] - marks[0])
    mine = "  ".join(f"{name} {1e3 * statistics.median(values):6.2f}" for name, values in phases.items())
    inside = {label: 1e3 * a.seconds / args.steps for label, a in world.accounts.items() if label != "barrier"}
    rows = world.gather_object((mine, inside))
    if world.rank == 0:
        print(f"{args.net} {args.scheme} on {world.size} rank(s), median ms per step over {args.steps} steps:")
        for rank, (line, _) in enumerate(rows):
            print(f"  rank {rank}: {line}")
        if args.layers:
            print("rank 0, ms per step in each (sub-)layer:")
            for (direction, name), values in layer_times.items():
                print(f"  {direction:<8} {name:<36} {1e3 * sum(values) / args.steps:7.2f}")
            print("ms per step inside communication calls (waits included):")
            for rank, (_, calls) in enumerate(rows):
                for label, ms in sorted(calls.items(), key=lambda kv: -kv[1]):
                    if ms >= 0.01:
                        print(f"  rank {rank}  {label:<36} {ms:7.2f}")
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
