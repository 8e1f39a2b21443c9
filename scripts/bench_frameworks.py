"""SINGA's training frameworks compared: samples/s and time-to-accuracy of AllReduce, Sandblaster and
Downpour against a serial run, on the MNIST MLP and the CIFAR-10 convnet.

    python scripts/bench_frameworks.py [--nets mnist_mlp cifar10_convnet] [--frameworks serial allreduce ...]
        [--steps N] [--target ACC | NET=ACC ...] [--repeat 1] [--json out.json] [--plot out.png] [--keep DIR]

Frameworks (the rank counts follow from the cluster block, so there is no --ranks):
  serial       one process, no mpiexec: the baseline of the ratios
  allreduce    one worker group of 2 workers                       mpiexec -n 2
  sandblaster  one group of 2 workers + 1 separate server rank      mpiexec -n 3
  downpour     2 worker groups of 1 worker + 1 server rank          mpiexec -n 3

Data: no download.  scikit-learn's bundled digits (1,797 8x8 images, 10 classes) are upsampled to
the nets' input shapes: (784,) = 3x upsampled to 24x24, zero-padded to 28x28, flattened; (3, 32, 32)
= 4x upsampled, repeated over 3 channels; values 0..255.  80/20 train/test split, fixed seed.  The
jobs normalise as their confs do, with the train split's own statistics: the MLP subtracts the mean
and divides by the standard deviation (about zero-mean, unit-scale); the convnet only subtracts the
mean (its mean_file becomes mean_value), because its tiny initial weights (conv1: std 0.0001) expect
pixels on their raw scale, as in SINGA's CIFAR-10 job: divided by the standard deviation as well, it
stays at chance (loss 2.3026) for 400 steps.

Measures, per net and framework (medians over --repeat runs):
  samples/s      median of the progress lines' samples/s, leaving out the first (warm-up) and those
                 whose window held a test pass (that time is evaluation, not training).  Downpour's
                 lines are group 0's alone (only group 0 logs), so they are multiplied by the number
                 of groups: every group trains its own batches at about the same pace.
  x serial       samples/s over the serial run's, measured in the same invocation.
  time-to-acc    seconds from the start of training (metrics.jsonl's `elapsed`) to the first test
                 pass reaching the net's target accuracy; "not reached" otherwise.  (The last pass
                 follows the final checkpoint write, which the trainer always makes.)
  final acc      the test accuracy after the last step.
The test split (359 images) is evaluated whole, about every 20 steps' worth of samples.

--steps is per worker group: Downpour runs half as many steps in each of its 2 groups (and tests and
logs at half the step interval), so every framework trains on the same number of samples.

This machine has 2 cores: the 3-rank runs (sandblaster, downpour) oversubscribe them, so their
samples/s understate what the frameworks do with a core per rank; read those rows for accuracy and
for the cost of the extra rank, not for speed.

Each run prints a line as it ends, each repeat the table so far; Ctrl-C or SIGTERM (a time limit)
prints the table of the runs done.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchkit import blas_threads_as_train, report_if_cut_short, train_subprocess  # noqa: E402 - scripts/ on the path

TEST_FRACTION, SPLIT_SEED = 0.2, 0
DISPLAY_EVERY, TEST_EVERY = 10, 20  # steps of a single worker group; Downpour's groups divide them


@dataclasses.dataclass(frozen=True)
class NetSpec:
    conf: str
    shape: tuple[int, ...]
    steps: int  # default --steps
    target: float  # default test accuracy for time-to-accuracy


@dataclasses.dataclass(frozen=True)
class Framework:
    ranks: int
    groups: int  # worker groups: each trains its own batches, so steps are divided among them
    cluster: dict  # ClusterProto fields


NETS = {
    # serial runs tested: the MLP 0.91 at step 80, 0.96 at 200; the convnet 0.52 at step 60, 0.84 at 100
    "mnist_mlp": NetSpec("mnist_mlp.conf", (784,), 200, 0.90),
    "cifar10_convnet": NetSpec("cifar10_convnet.conf", (3, 32, 32), 120, 0.80),
}
FRAMEWORKS = {
    "serial": Framework(1, 1, {}),
    "allreduce": Framework(2, 1, {"nworkers_per_group": 2}),
    "sandblaster": Framework(3, 1, {"nworker_groups": 1, "nserver_groups": 1, "nworkers_per_group": 2,
                                    "nservers_per_group": 1, "server_worker_separate": True}),
    "downpour": Framework(3, 2, {"nworker_groups": 2, "nserver_groups": 1, "nworkers_per_group": 1,
                                 "nservers_per_group": 1, "server_worker_separate": True}),
}


# ------------------------------------------------------------------ data

def digits_as(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 digits upsampled to ``shape``, float32 0..255 (N, *shape), and int32 labels (N,)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images.astype(np.float32) * (255.0 / 16.0)  # (N, 8, 8), 0..16 -> 0..255
    if shape == (784,):
        big = np.kron(images, np.ones((1, 3, 3), np.float32))  # (N, 24, 24)
        data = np.pad(big, ((0, 0), (2, 2), (2, 2))).reshape(len(images), 784)  # MNIST's 28x28
    elif shape == (3, 32, 32):
        big = np.kron(images, np.ones((1, 4, 4), np.float32))  # (N, 32, 32)
        data = np.repeat(big[:, None], 3, axis=1)  # grey in all of CIFAR's three channels
    else:
        raise ValueError(f"input shape {shape}: expected (784,) or (3, 32, 32)")
    return data, digits.target.astype(np.int32)


def write_digit_stores(folder: pathlib.Path, net: str) -> dict:
    """train.h5 and test.h5 for ``net`` under ``folder``; their paths, the test split's size, and the
    train split's mean and standard deviation for the jobs' normalisation."""
    from singa_mpi.data.convert import write_store

    data, labels = digits_as(NETS[net].shape)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(data))
    n_test = int(round(TEST_FRACTION * len(data)))
    test, train = order[:n_test], order[n_test:]
    folder.mkdir(parents=True, exist_ok=True)
    return {"train": write_store(str(folder / "train.h5"), "hdf5", data[train], labels[train]),
            "test": write_store(str(folder / "test.h5"), "hdf5", data[test], labels[test]),
            "test_size": n_test, "mean": float(data[train].mean()), "std": float(data[train].std())}


# ------------------------------------------------------------------ jobs

def point_at_store(store_conf, path: str, stores: dict, batchsize: int | None = None) -> None:
    """An input layer's store_conf reads ``path`` (HDF5), normalised as the conf does, with the train
    split's scalars: the mean always subtracted, divided by the standard deviation only where the conf
    divides (the convnet's initial weights expect the raw pixel scale, as SINGA's CIFAR-10 job)."""
    store_conf.backend, store_conf.path = "hdf5", path
    store_conf.ClearField("mean_file")
    store_conf.mean_value = stores["mean"]
    if store_conf.HasField("std_value") or store_conf.std_file:
        store_conf.ClearField("std_file")
        store_conf.std_value = stores["std"]
    if batchsize is not None:
        del store_conf.batchsize[:]
        store_conf.batchsize.append(batchsize)


def set_schedule(job, steps: int, groups: int) -> None:
    """train_steps, progress lines and test passes per worker group: each of ``groups`` groups trains
    ``steps // groups`` batches, so all frameworks see the same samples between test passes."""
    job.train_steps = max(1, steps // groups)
    job.disp_freq = max(1, DISPLAY_EVERY // groups)
    job.test_freq = max(1, TEST_EVERY // groups)
    job.test_steps = 1  # one batch of the whole test split: each pass scores every test image once
    job.checkpoint_freq = 0
    for field in ("disp_after", "test_after", "checkpoint_after", "validate_freq", "validate_steps"):
        job.ClearField(field)


def write_job(folder: pathlib.Path, net: str, framework: str, stores: dict, steps: int) -> pathlib.Path:
    """The example conf on the digit stores under ``framework``'s cluster block, as a .conf file."""
    from google.protobuf import text_format

    from singa_mpi.config.load import load_job
    from singa_mpi.proto import job_pb2

    cfg = load_job(ROOT / "conf" / NETS[net].conf)
    job, fw = cfg.proto, FRAMEWORKS[framework]
    for layer in job.neuralnet.layer:
        if job_pb2.kTrain in layer.include:
            point_at_store(layer.store_conf, stores["train"], stores)
        elif job_pb2.kTest in layer.include:
            point_at_store(layer.store_conf, stores["test"], stores, batchsize=stores["test_size"])
    set_schedule(job, steps, fw.groups)
    job.cluster.Clear()
    for field, value in fw.cluster.items():
        setattr(job.cluster, field, value)
    path = folder / f"{net}_{framework}.conf"
    path.write_text(text_format.MessageToString(job))
    return path


# ------------------------------------------------------------------ measures

def tested_windows(train: list[dict], tests: list[dict]) -> set[int]:
    """Steps of the progress lines whose window (the steps since the previous line) held a test pass:
    a pass at step t runs just before step t is trained."""
    test_steps = [t["step"] for t in tests]
    held, previous = set(), -1
    for entry in train:
        if any(previous < t <= entry["step"] for t in test_steps):
            held.add(entry["step"])
        previous = entry["step"]
    return held


def training_rate(entries: list[dict], groups: int) -> float:
    """Samples/s of all groups: the median progress line after the first, test windows left out."""
    train = [e for e in entries if e["phase"] == "train" and "samples_per_s" in e]
    held = tested_windows(train, [e for e in entries if e["phase"] == "test"])
    clean = [e for e in train[1:] if e["step"] not in held]
    chosen = clean or train[1:] or train  # tiny runs: whatever there is
    return groups * statistics.median(e["samples_per_s"] for e in chosen) if chosen else float("nan")


def time_to_accuracy(tests: list[dict], target: float) -> float | None:
    """The first `elapsed` at which a test pass reached ``target``; None if none did."""
    return next((t["elapsed"] for t in tests if t["accuracy"] >= target), None)


def measure(entries: list[dict], groups: int, target: float) -> dict:
    tests = [e for e in entries if e["phase"] == "test"]
    return {"samples_per_s": training_rate(entries, groups), "time_to_accuracy": time_to_accuracy(tests, target),
            "final_accuracy": tests[-1]["accuracy"] if tests else float("nan"),
            "curve": [(t["elapsed"], t["accuracy"]) for t in tests]}


def run_once(work: pathlib.Path, net: str, framework: str, stores: dict, steps: int, target: float,
             repeat: int) -> dict:
    conf = write_job(work, net, framework, stores, steps)
    workspace = work / f"ws_{net}_{framework}_{repeat}"
    shutil.rmtree(workspace, ignore_errors=True)
    fw = FRAMEWORKS[framework]
    entries = train_subprocess(conf, workspace, fw.ranks)
    return {"net": net, "framework": framework, "ranks": fw.ranks, **measure(entries, fw.groups, target)}


# ------------------------------------------------------------------ summary

def median_time(times: list[float | None]) -> float | None:
    """Median over repeats, a run that never reached the target counting as infinitely slow."""
    middle = statistics.median(float("inf") if t is None else t for t in times)
    return None if middle == float("inf") else middle


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (net, framework) in run order: medians, and the speed-up over that net's serial row."""
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault((run["net"], run["framework"]), []).append(run)
    rows = []
    for (net, framework), group in groups.items():
        rows.append({"net": net, "framework": framework, "ranks": group[0]["ranks"],
                     "samples_per_s": statistics.median(r["samples_per_s"] for r in group),
                     "time_to_accuracy": median_time([r["time_to_accuracy"] for r in group]),
                     "final_accuracy": statistics.median(r["final_accuracy"] for r in group),
                     "curve": group[0]["curve"]})
    for row in rows:
        serial = [r["samples_per_s"] for r in rows if r["net"] == row["net"] and r["framework"] == "serial"]
        row["speedup"] = row["samples_per_s"] / serial[0] if serial else None
    return rows


def print_table(rows: list[dict], targets: dict[str, float]) -> None:
    print(f"{'net':<16} {'framework':<12} {'ranks':>6} {'samples/s':>10} {'x serial':>9} {'time-to-acc':>12} "
          f"{'final acc':>10}")
    for r in rows:
        speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}"
        reached = "not reached" if r["time_to_accuracy"] is None else f"{r['time_to_accuracy']:.1f}s"
        print(f"{r['net']:<16} {r['framework']:<12} {r['ranks']:>6} {r['samples_per_s']:>10,.0f} {speedup:>9} "
              f"{reached:>12} {r['final_accuracy']:>10.4f}")
    print("targets: " + ", ".join(f"{net} {acc:.2f}" for net, acc in targets.items()) +
          "; 3-rank rows oversubscribe a 2-core machine; downpour's samples/s = group 0's x 2 groups")


def write_json(path: str, rows: list[dict]) -> None:
    keys = ("net", "framework", "ranks", "samples_per_s", "speedup", "time_to_accuracy", "final_accuracy")
    pathlib.Path(path).write_text(json.dumps([{k: r[k] for k in keys} for r in rows], indent=1) + "\n")


def plot(path: str, rows: list[dict], targets: dict[str, float]) -> None:
    """Test accuracy against elapsed seconds: one subplot per net, one line per framework."""
    try:
        import matplotlib
    except ImportError:
        print("no plot: matplotlib is not installed (pip install matplotlib)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nets = list(dict.fromkeys(r["net"] for r in rows))
    fig, axes = plt.subplots(1, len(nets), figsize=(6 * len(nets), 4), squeeze=False)
    for ax, net in zip(axes[0], nets):
        for r in (r for r in rows if r["net"] == net):
            ax.plot([t for t, _ in r["curve"]], [a for _, a in r["curve"]], marker=".", label=r["framework"])
        ax.axhline(targets[net], color="grey", linestyle=":", linewidth=1)
        ax.set(title=net, xlabel="elapsed (s)", ylabel="test accuracy", ylim=(0, 1))
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot: {path}")


# ------------------------------------------------------------------ command line

def parse_targets(values: list[str] | None, nets: list[str]) -> dict[str, float]:
    """``--target 0.5`` (every net) or ``--target mnist_mlp=0.9 ...``; the rest keep their defaults."""
    targets = {net: NETS[net].target for net in nets}
    for value in values or []:
        net, _, acc = value.rpartition("=")
        for name in ([net] if net else nets):
            if name not in NETS:
                raise SystemExit(f"--target {value}: unknown net {name!r}; expected one of {', '.join(NETS)}")
            targets[name] = float(acc)
    return {net: targets[net] for net in nets}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=list(FRAMEWORKS))
    parser.add_argument("--steps", type=int, help="training steps of one worker group (Downpour: halved); "
                        "default " + ", ".join(f"{n} {s.steps}" for n, s in NETS.items()))
    parser.add_argument("--target", nargs="+", help="test accuracy for time-to-accuracy: ACC for every net, or "
                        "NET=ACC; default " + ", ".join(f"{n} {s.target}" for n, s in NETS.items()))
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration (medians are reported)")
    parser.add_argument("--json", help="write the table's rows here")
    parser.add_argument("--plot", help="PNG of test accuracy against elapsed seconds (needs matplotlib)")
    parser.add_argument("--keep", help="work folder to keep (stores, jobs, workspaces); default: a temporary one")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    blas_threads_as_train()  # as `singa-mpi train` chooses (benchkit); before any numpy work
    targets = parse_targets(args.target, args.nets)
    work = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="bench_frameworks_")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    began, runs = time.perf_counter(), []

    def report() -> None:
        if not runs:
            print("no run finished yet")
            return
        rows = summarize(runs)
        print_table(rows, targets)
        print(f"total time {time.perf_counter() - began:.0f}s")
        if args.json:
            write_json(args.json, rows)
        if args.plot:
            plot(args.plot, rows, targets)

    try:
        with report_if_cut_short(report):
            for net in args.nets:
                stores = write_digit_stores(work / "data" / net, net)
                steps = args.steps or NETS[net].steps
                for repeat in range(args.repeat):
                    for framework in args.frameworks:
                        runs.append(run_once(work, net, framework, stores, steps, targets[net], repeat))
                        reached = runs[-1]["time_to_accuracy"]
                        print(f"  ran {net} {framework} ({repeat + 1}/{args.repeat}): "
                              f"{runs[-1]['samples_per_s']:,.0f} samples/s, time to {targets[net]:.2f}: "
                              f"{'not reached' if reached is None else f'{reached:.1f}s'}, "
                              f"final accuracy {runs[-1]['final_accuracy']:.4f}", flush=True)
                    if (net, repeat + 1) != (args.nets[-1], args.repeat):
                        print("the table so far:")
                        print_table(summarize(runs), targets)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
