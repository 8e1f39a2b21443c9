"""singa_mpi against PyTorch: the same nets, batches and update rule, serially and data-parallel.

    pip install -e '.[bench]'          (PyTorch; any build, only its CPU kernels are used)
    python scripts/bench_peer.py [--ranks 1 2 4] [--nets mnist_mlp cifar10_convnet] [--weak] [--json F]

For every net and rank count, two jobs run under the same `mpiexec -n N`, one BLAS/intra-op thread
per process, on synthetic data of the example's shape:
- singa_mpi: scripts/bench_scaling.py's worker with the best of --schemes (default: data) at N;
- PyTorch: the same layers and shapes (pooling windows as singa_mpi's: 32 -> 15 -> 7 -> 3; LRN across
  channels), the same
  initial-value ranges, the same SGD (learning rate, momentum, weight decay of the conf), serially at
  N = 1 and as DistributedDataParallel over gloo at N > 1 (the rendezvous address comes from MPI).
Strong scaling (default) splits the example's batch over the ranks; --weak gives every rank the whole
batch.  The table prints samples/s of both and the ratio singa_mpi / PyTorch (> 1: singa_mpi ahead).
Timing as in bench_scaling: warm-up steps, then the median step time of the slowest rank, each step
started at a barrier.

Each run prints a line as it ends, each repeat the table so far; Ctrl-C or SIGTERM (a time limit)
prints the table of the runs done.  A run that fails is said in one line and the others go on: its
side of the row reads n/a (null in --json, which lists the failures under "failed"), and the exit code
is 1.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_scaling import NETS, RunFailed, error_tail, launch as launch_singa  # noqa: E402 - scripts/ is on the path from here on
from benchkit import bench_env, blas_threads_as_train, mpiexec_command, positive_int, report_if_cut_short  # noqa: E402

# The update rule of each example conf (conf/mnist_mlp.conf, conf/cifar10_convnet.conf).
SGD = {"mnist_mlp": dict(lr=0.001, momentum=0.0, weight_decay=0.0),
       "cifar10_convnet": dict(lr=0.001, momentum=0.9, weight_decay=0.004)}
NO_TORCH = "bench_peer.py needs PyTorch: pip install -e '.[bench]' (or any torch wheel)"


def mlp(torch):
    """conf/mnist_mlp.conf: 784-2500-2000-1500-1000-500-10, scaled tanh (SINGA's kSTanh), U(-0.05, 0.05)."""
    nn = torch.nn

    class STanh(nn.Module):
        def forward(self, x):
            return 1.7159047 * torch.tanh(0.66666667 * x)

    widths = [784, 2500, 2000, 1500, 1000, 500, 10]
    layers = []
    for i, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
        linear = nn.Linear(fan_in, fan_out)
        nn.init.uniform_(linear.weight, -0.05, 0.05)
        nn.init.uniform_(linear.bias, -0.05, 0.05)
        layers += [linear] if i == len(widths) - 2 else [linear, STanh()]
    return nn.Sequential(*layers)


def convnet(torch):
    """conf/cifar10_convnet.conf: three 5x5 convolutions (32, 32, 64 filters), max/avg pooling 3/2 with
    singa_mpi's output sizes (floor: 32 -> 15 -> 7 -> 3), ReLU, LRN (3 channels), an inner product to 10."""
    nn = torch.nn
    lrn = dict(size=3, alpha=5e-5, beta=0.75, k=1.0)
    net = nn.Sequential(
        nn.Conv2d(3, 32, 5, padding=2), nn.MaxPool2d(3, 2), nn.ReLU(), nn.LocalResponseNorm(**lrn),
        nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(), nn.AvgPool2d(3, 2), nn.LocalResponseNorm(**lrn),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.AvgPool2d(3, 2),
        nn.Flatten(), nn.Linear(64 * 3 * 3, 10))
    for module, std in zip([m for m in net if isinstance(m, (nn.Conv2d, nn.Linear))], [1e-4, 0.01, 0.01, 0.01]):
        nn.init.normal_(module.weight, 0.0, std)
        nn.init.zeros_(module.bias)
    return net


def rendezvous(comm) -> None:
    """torch.distributed's TCP store on rank 0's host, at a port rank 0 found free, told to all by MPI."""
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            address = (socket.gethostbyname(socket.gethostname()), s.getsockname()[1])
    else:
        address = None
    host, port = comm.bcast(address, root=0)
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(port))


def torch_worker(args) -> int:
    """Runs under mpiexec: time PyTorch's training step (DDP over gloo at N > 1); JSON on rank 0."""
    try:
        import torch
    except ImportError:
        print(NO_TORCH, file=sys.stderr)
        return 3
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    torch.manual_seed(1)
    _, shape, batch = NETS[args.net]
    global_batch = batch * comm.size if args.weak else batch
    from singa_mpi.planner.chunk import chunk

    lo, hi = chunk(global_batch, comm.size, comm.rank)  # as singa_mpi splits it: 100 over 8 is 13 or 12 rows
    local = hi - lo
    model = mlp(torch) if args.net == "mnist_mlp" else convnet(torch)
    if comm.size > 1:
        import torch.distributed as dist
        rendezvous(comm)
        dist.init_process_group("gloo", rank=comm.rank, world_size=comm.size)
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), **SGD[args.net])
    loss_of = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(comm.rank)
    batches = [(torch.rand((local, *shape), generator=generator) * 2 - 1,
                torch.randint(0, 10, (local,), generator=generator)) for _ in range(4)]

    def step(i: int) -> None:
        x, y = batches[i % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        loss_of(model(x), y).backward()
        optimizer.step()

    for i in range(3):
        step(i)
    times = []
    for i in range(args.steps):
        comm.Barrier()
        start = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - start)
    slowest = max(comm.allgather(statistics.median(times)))
    if comm.rank == 0:
        print(json.dumps({"net": args.net, "impl": "pytorch", "ranks": comm.size, "batch": global_batch,
                          "weak": bool(args.weak), "step_ms": 1e3 * slowest,
                          "samples_per_s": global_batch / slowest, "torch": torch.__version__}))
    if comm.size > 1:
        torch.distributed.destroy_process_group()
    return 0


def launch_torch(net: str, ranks: int, steps: int, weak: bool) -> dict:
    cmd = mpiexec_command(ranks) + [sys.executable, __file__, "--worker", "--net", net, "--steps", str(steps)]
    try:
        out = subprocess.run(cmd + (["--weak"] if weak else []), env=bench_env(), capture_output=True, text=True,
                             timeout=1800)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"PyTorch {net} n={ranks} failed: no result within 1800 s") from None
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise RunFailed(f"PyTorch {net} n={ranks} failed (exit {out.returncode}): {error_tail(out.stderr or out.stdout)}")
    return json.loads(lines[-1])


def compare(runs: list[dict]) -> list[dict]:
    """One row per (net, ranks): the median samples/s of each side (singa_mpi: its best scheme); a side
    with no run (all failed) is None, and so is the ratio."""
    rows = []
    for net, ranks in sorted({(r["net"], r["ranks"]) for r in runs}):
        here = [r for r in runs if (r["net"], r["ranks"]) == (net, ranks)]
        peer = [r["samples_per_s"] for r in here if r.get("impl") == "pytorch"]
        by_scheme: dict[str, list[float]] = {}
        for r in here:
            if r.get("impl") != "pytorch":
                by_scheme.setdefault(r["scheme"], []).append(r["samples_per_s"])
        scheme, ours = max(((s, statistics.median(v)) for s, v in by_scheme.items()), key=lambda sv: sv[1],
                           default=(None, None))
        theirs = statistics.median(peer) if peer else None
        rows.append({"net": net, "ranks": ranks, "batch": here[0]["batch"], "scheme": scheme,
                     "singa_mpi": ours, "pytorch": theirs,
                     "ratio": ours / theirs if ours is not None and theirs is not None else None,
                     "oversubscribed": ranks > (os.cpu_count() or 1)})
    return rows


def shown(value: float | None, form: str) -> str:
    """A table cell: ``value`` in ``form``, or n/a where that side has no run."""
    return "n/a" if value is None else format(value, form)


def print_table(rows: list[dict], weak: bool) -> None:
    print(f"| net | ranks | batch{' (global)' if weak else ''} | singa_mpi samples/s (scheme) "
          "| PyTorch samples/s | singa_mpi / PyTorch |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        mark = "*" if r["oversubscribed"] else ""
        print(f"| {r['net']} | {r['ranks']}{mark} | {r['batch']} | {shown(r['singa_mpi'], ',.0f')} ({r['scheme'] or '-'}) "
              f"| {shown(r['pytorch'], ',.0f')} | {shown(r['ratio'], '.2f')} |", flush=True)
    if any(r["oversubscribed"] for r in rows):
        print("* oversubscribed: more ranks than cores; correctness only, not speed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--ranks", type=positive_int, nargs="+", default=[1, 2])
    parser.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    parser.add_argument("--schemes", nargs="+", default=["data"], choices=["data", "feature", "hybrid", "auto"],
                        help="singa_mpi's schemes to run; the table shows the fastest")
    parser.add_argument("--steps", type=positive_int, default=20, help="timed steps per run (the convnet: half)")
    parser.add_argument("--repeat", type=positive_int, default=2, help="runs per configuration (medians are reported)")
    parser.add_argument("--weak", action="store_true", help="every rank takes the example's whole batch")
    parser.add_argument("--json", help="write the runs and the table here")
    parser.add_argument("--worker", action="store_true", help="run PyTorch's side in this MPI world")
    parser.add_argument("--net", choices=list(NETS))
    args = parser.parse_args()
    blas_threads_as_train()  # as `singa-mpi train` chooses (benchkit); before any numpy work
    if args.worker:
        return torch_worker(args)
    try:
        import torch  # noqa: F401 - fail here, in one line, rather than in every launched rank
    except ImportError:
        print(NO_TORCH, file=sys.stderr)
        return 3
    runs: list[dict] = []
    failed: list[str] = []  # one line per run that ended without a result

    def report() -> None:
        rows = compare(runs)
        if rows:
            print_table(rows, args.weak)
        else:
            print("no run finished yet")
        if failed:
            print(f"{len(failed)} run(s) failed: " + "; ".join(failed), flush=True)
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps({"table": rows, "runs": runs, "failed": failed},
                                                          indent=1, allow_nan=False) + "\n")  # n/a is null

    with report_if_cut_short(report):
        for repeat in range(args.repeat):
            for net in args.nets:
                steps = args.steps if net == "mnist_mlp" else max(5, args.steps // 2)
                for ranks in args.ranks:
                    done = len(runs)
                    measure_both(net, ranks, steps, args, runs, failed)
                    mine = runs[done:]
                    print(f"  measured {net} n={ranks} ({repeat + 1}/{args.repeat}): " + (", ".join(
                        f"{r.get('scheme', r['impl'])} {r['samples_per_s']:,.0f}" for r in mine) or "nothing")
                        + " samples/s", flush=True)
            if repeat + 1 < args.repeat and runs:
                print(f"after {repeat + 1} of {args.repeat} repeats:")
                print_table(compare(runs), args.weak)
    report()
    return 1 if failed else 0


def measure_both(net: str, ranks: int, steps: int, args, runs: list[dict], failed: list[str]) -> None:
    """singa_mpi's runs (each of --schemes) and PyTorch's at ``ranks``, each added to ``runs`` as it ends;
    a run that fails is said in one line and added to ``failed``, and the others go on (n/a in its row)."""
    for scheme in args.schemes:
        try:
            runs.append(dict(launch_singa(net, scheme, ranks, steps, args.weak), impl="singa_mpi"))
        except RunFailed as err:
            failed.append(str(err))
            print(f"  {err}", flush=True)
    try:
        runs.append(launch_torch(net, ranks, steps, args.weak))
    except RunFailed as err:
        failed.append(str(err))
        print(f"  {err}", flush=True)

if __name__ == "__main__":
    sys.exit(main())
