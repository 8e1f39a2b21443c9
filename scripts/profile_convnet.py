"""Per-layer forward and backward ms of conf/cifar10_convnet.conf's serial training step, beside PyTorch's.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python scripts/profile_convnet.py [--steps 20] [--batch 100]
    PYTHONPATH=/path/to/torch OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python scripts/profile_convnet.py

singa_mpi: the trainer's serial step on synthetic data (bench_serial.py's job), each layer's pass
read from the tracer, median over the timed steps.  PyTorch (when importable): bench_peer.py's
twin of the conf, one intra-op thread, each module run on its own (its input detached, so that
its backward is timed alone), median over the same number of steps; "update" is the SGD step.
Both nets have the same shapes (pooling 32-15-7-3).  ``--batch 13`` profiles what one of 8 data-parallel
ranks runs at the conf's batch of 100 (strong scaling leaves each rank a small batch, where fixed
per-step costs weigh).  A second table sets each convolution against the
machine's GEMM rate: its direct-convolution FLOPs per step over its measured time, beside sgemm's rate
at the layer's own im2col GEMM shape.
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_serial import job_on_synthetic_data  # noqa: E402 - scripts/ is on the path from here on
from singa_mpi import profiling  # noqa: E402
from singa_mpi.runtimes.serial import SerialRuntime  # noqa: E402
from singa_mpi.trainer import Trainer  # noqa: E402

# bench_peer.convnet()'s modules in order, by the conf's layer names
TORCH_NAMES = ["conv1", "pool1", "relu1", "norm1", "conv2", "relu2", "pool2", "norm2",
               "conv3", "relu3", "pool3", "flatten", "ip1"]


def median_rows(samples: list[dict[tuple[str, str], float]]) -> dict[tuple[str, str], float]:
    keys = {key for sample in samples for key in sample}
    return {key: statistics.median(sample.get(key, 0.0) for sample in samples) for key in keys}


def convnet_job(folder: str, count: int, batch: int | None):
    """The convnet on synthetic data, at ``batch`` (None: the conf's) samples per step."""
    cfg = job_on_synthetic_data("cifar10_convnet.conf", folder, (3, 32, 32), count)
    if batch is not None:
        for layer in cfg.proto.neuralnet.layer:
            if layer.HasField("store_conf"):
                del layer.store_conf.batchsize[:]
                layer.store_conf.batchsize.append(batch)
    return cfg


def profile_singa(steps: int, batch: int | None = None, warmup: int = 3) -> dict[tuple[str, str], float]:
    """{(pass, layer or step phase): median seconds per step}."""
    folder = tempfile.mkdtemp(prefix="profile_convnet_")
    try:
        cfg = convnet_job(folder, 1000, batch)
        runtime = SerialRuntime(cfg, 1, folder)
        trainer = Trainer(cfg, folder, runtime, log=lambda line: None)
        tracer = runtime.tracer
        for step in range(warmup):
            trainer.train_one_batch(step)
        samples = []
        for step in range(steps):
            before = tracer.snapshot()
            trainer.train_one_batch(warmup + step)
            diff = profiling.subtract(tracer.snapshot(), before)
            samples.append({key: total.seconds for key, total in diff.items()})
        return median_rows(samples)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def profile_torch(steps: int, batch: int = 100, warmup: int = 3) -> dict[tuple[str, str], float] | None:
    try:
        import torch
    except ImportError:
        return None
    from bench_peer import SGD, convnet

    torch.set_num_threads(1)
    torch.manual_seed(1)
    model = convnet(torch)
    optimizer = torch.optim.SGD(model.parameters(), **SGD["cifar10_convnet"])
    loss_of = torch.nn.CrossEntropyLoss()
    x = torch.rand((batch, 3, 32, 32)) * 2 - 1
    y = torch.randint(0, 10, (batch,))
    clock = time.perf_counter

    def step() -> dict[tuple[str, str], float]:
        times = {}
        optimizer.zero_grad(set_to_none=True)
        began = clock()
        inputs, outputs, h = [], [], x
        for name, module in zip(TORCH_NAMES, model):
            h = h.detach().requires_grad_(name != "conv1")
            inputs.append(h)
            start = clock()
            out = module(h)
            times[("forward", name)] = clock() - start
            outputs.append(out)
            h = out
        logits = h.detach().requires_grad_()
        start = clock()
        loss = loss_of(logits, y)
        times[("forward", "loss")] = clock() - start
        start = clock()
        loss.backward()
        times[("backward", "loss")] = clock() - start
        grad = logits.grad
        for name, inp, out in reversed(list(zip(TORCH_NAMES, inputs, outputs))):
            start = clock()
            out.backward(grad)
            times[("backward", name)] = clock() - start
            grad = inp.grad
        times[("step", "train_one_batch")] = clock() - began
        start = clock()
        optimizer.step()
        times[("step", "update")] = clock() - start
        return times

    for _ in range(warmup):
        step()
    return median_rows([step() for _ in range(steps)])


def print_table(singa: dict, peer: dict | None) -> None:
    names = [name for (cat, name) in singa if cat == "forward"]
    names = sorted(set(names), key=lambda n: (["data"] + TORCH_NAMES + ["loss"]).index(n)
                   if n in ["data"] + TORCH_NAMES + ["loss"] else 99)
    if peer is not None:
        names += [n for n in TORCH_NAMES if n not in names and ("forward", n) in peer]
    head = f"{'layer':<10}{'fwd ms':>9}{'bwd ms':>9}{'total':>9}"
    if peer is not None:
        head += f"{'torch fwd':>11}{'torch bwd':>11}{'torch tot':>11}{'ratio':>8}"
    print(head)
    sums = [0.0] * 6

    def cell(table, cat, name):
        return 1e3 * table[(cat, name)] if table is not None and (cat, name) in table else None

    for name in names:
        f, b = cell(singa, "forward", name), cell(singa, "backward", name)
        line = f"{name:<10}" + "".join(f"{v:>9.2f}" if v is not None else f"{'-':>9}"
                                       for v in (f, b, (f or 0) + (b or 0)))
        sums[0] += f or 0
        sums[1] += b or 0
        if peer is not None:
            tf, tb = cell(peer, "forward", name), cell(peer, "backward", name)
            total = (tf or 0) + (tb or 0)
            line += "".join(f"{v:>11.2f}" if v is not None else f"{'-':>11}" for v in (tf, tb, total))
            line += f"{((f or 0) + (b or 0)) / total:>8.2f}" if total else f"{'-':>8}"
            sums[3] += tf or 0
            sums[4] += tb or 0
        print(line)
    line = f"{'sum':<10}{sums[0]:>9.2f}{sums[1]:>9.2f}{sums[0] + sums[1]:>9.2f}"
    if peer is not None:
        line += f"{sums[3]:>11.2f}{sums[4]:>11.2f}{sums[3] + sums[4]:>11.2f}"
    print(line)
    for phase in ("train_one_batch", "sync", "update"):
        ours = cell(singa, "step", phase)
        theirs = cell(peer, "step", phase)
        text = f"  {phase}: singa_mpi {ours:.2f} ms" if ours is not None else f"  {phase}: singa_mpi -"
        if peer is not None:
            text += f", PyTorch {theirs:.2f} ms" if theirs is not None else ", PyTorch -"
        print(text)


def gemm_lines(singa: dict, batch: int | None = None) -> list[str]:
    """Each convolution against the machine's GEMM rate: its direct-convolution FLOPs (forward, weight
    gradient and, where wanted, input gradient) over its measured time, beside sgemm's rate at the
    layer's own im2col GEMM in a cache-sized chunk (what the im2col route runs at)."""
    import numpy as np

    from singa_mpi.layers import conv
    from singa_mpi.planner import plan

    folder = tempfile.mkdtemp(prefix="profile_convnet_")
    try:
        cfg = convnet_job(folder, 16, batch)
        the_plan = plan(cfg, 1)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    by_name = {sub.name: sub for sub in the_plan.sublayers}
    lines = ["", "convolutions against sgemm (one thread): direct-convolution GFLOP per step / measured time",
             f"{'layer':<10}{'GFLOP':>8}{'ms':>9}{'GFLOP/s':>10}{'sgemm GFLOP/s':>15}"]
    rng = np.random.default_rng(0)
    for sub in the_plan.sublayers:
        node = the_plan.origins[sub.origin]
        if not node.conf.HasField("convolution_conf"):
            continue
        (channels, _, _), (filters, ho, wo) = sub.src_shapes[0], sub.out_shape[1:]
        k = node.conf.convolution_conf.kernel
        wanted = by_name[sub.srcs[0]].needs_grad
        flops = 2 * the_plan.batch * filters * ho * wo * channels * k * k * (3 if wanted else 2)
        ms = 1e3 * (singa.get(("forward", sub.origin), 0.0) + singa.get(("backward", sub.origin), 0.0))
        depth = channels * k * k
        n = conv._chunk_samples(depth, ho * wo, 4, the_plan.batch)
        a = rng.standard_normal((filters, depth)).astype(np.float32)
        b = rng.standard_normal((depth, n * ho * wo)).astype(np.float32)
        runs = []
        for _ in range(20):
            start = time.perf_counter()
            np.matmul(a, b)
            runs.append(time.perf_counter() - start)
        rate = 2 * filters * depth * n * ho * wo / min(runs)
        lines.append(f"{sub.origin:<10}{flops / 1e9:>8.2f}{ms:>9.2f}{flops / ms / 1e6:>10.1f}{rate / 1e9:>15.1f}")
    lines.append("(above sgemm's rate: the Fourier route does less arithmetic than the direct convolution)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=100, help="samples per step (the conf's: 100)")
    args = parser.parse_args()
    singa = profile_singa(args.steps, args.batch)
    peer = profile_torch(args.steps, args.batch)
    print(f"cifar10_convnet serial step at batch {args.batch}, median of {args.steps} steps, ms"
          + ("" if peer is not None else " (PyTorch not importable: singa_mpi alone)"))
    print_table(singa, peer)
    print("\n".join(gemm_lines(singa, args.batch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
