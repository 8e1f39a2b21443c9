"""Serial speed: ms per training step of the example nets, and the framework's overhead.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python scripts/bench_serial.py [--steps 30] [--json out.json]

For conf/mnist_mlp.conf (batch 64) and conf/cifar10_convnet.conf (batch 100) on synthetic data
of the right shape, it times singa_mpi's training step (forward, backward, SGD update) and, in
the same run, a hand-written numpy forward/backward/SGD of the same MLP.  The ratio
singa_mpi / numpy is the framework's overhead (target <= 1.15).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import sys
import tempfile
import time

import h5py
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from singa_mpi.config.load import parse_job  # noqa: E402
from singa_mpi.runtimes.serial import SerialRuntime  # noqa: E402
from singa_mpi.trainer import Trainer  # noqa: E402
from benchkit import positive_int  # noqa: E402 - scripts/ is on the path: this script's folder


def synthetic_store(folder: str, name: str, shape: tuple[int, ...], count: int, classes: int = 10) -> str:
    rng = np.random.default_rng(0)
    path = os.path.join(folder, f"{name}.h5")
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=rng.uniform(0, 255, (count, *shape)).astype(np.float32))
        f.create_dataset("label", data=rng.integers(0, classes, count).astype(np.int32))
    return path


def job_on_synthetic_data(conf: str, folder: str, shape: tuple[int, ...], count: int):
    """The example job with its stores replaced by synthetic HDF5 files (no mean file)."""
    text = (ROOT / "conf" / conf).read_text()
    store = synthetic_store(folder, pathlib.Path(conf).stem, shape, count)
    text = re.sub(r'backend: "\w+"', 'backend: "hdf5"', text)
    text = re.sub(r'path: "[^"]*"', f'path: "{store}"', text)
    text = re.sub(r'mean_file: "[^"]*"', "", text)
    text = re.sub(r"random_skip: \d+", "", text)
    cfg = parse_job(text, conf)
    cfg.proto.test_steps = 0
    return cfg


def time_steps(step, steps: int, warmup: int = 3) -> list[float]:
    for i in range(warmup):
        step(i)
    times = []
    for i in range(steps):
        start = time.perf_counter()
        step(warmup + i)
        times.append(time.perf_counter() - start)
    return times


def bench_singa(cfg, steps: int) -> float:
    with tempfile.TemporaryDirectory(prefix="bench_ws_") as workspace:  # removed also when a step fails
        runtime = SerialRuntime(cfg, 1, workspace)
        try:
            trainer = Trainer(cfg, workspace, runtime, log=lambda line: None)
            return statistics.median(time_steps(trainer.train_one_batch, steps))
        finally:
            runtime.close()


class NumpyMLP:
    """The mnist_mlp net written directly in numpy: (out, in) weights, STanh, softmax loss, SGD."""

    def __init__(self, sizes: list[int], batch: int, lr: float = 0.001):
        rng = np.random.default_rng(0)
        self.w = [rng.uniform(-0.05, 0.05, (o, i)).astype(np.float32) for i, o in zip(sizes, sizes[1:])]
        self.b = [rng.uniform(-0.05, 0.05, o).astype(np.float32) for o in sizes[1:]]
        self.x = rng.uniform(-1, 1, (batch, sizes[0])).astype(np.float32)
        self.y = rng.integers(0, sizes[-1], batch)
        self.lr = np.float32(lr)

    def step(self, _: int) -> None:
        acts, pre = [self.x], []
        for k, (w, b) in enumerate(zip(self.w, self.b)):
            z = acts[-1] @ w.T + b
            pre.append(z)
            acts.append(z if k == len(self.w) - 1 else np.float32(1.7159047) * np.tanh(np.float32(0.66666667) * z))
        logits = acts[-1]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        g = p
        g[np.arange(len(self.y)), self.y] -= 1
        g /= len(self.y)
        for k in reversed(range(len(self.w))):
            if k < len(self.w) - 1:
                t = np.tanh(np.float32(0.66666667) * pre[k])
                g = g * (np.float32(1.7159047 * 0.66666667) * (1 - t * t))
            dw = g.T @ acts[k]
            db = g.sum(axis=0)
            if k > 0:
                g = g @ self.w[k]
            self.w[k] -= self.lr * dw
            self.b[k] -= self.lr * db


def measure(folder: str, steps: int) -> dict:
    """Both nets on synthetic data written into ``folder``: their ms per step (the MLP's also in numpy)."""
    results = {}

    mlp_cfg = job_on_synthetic_data("mnist_mlp.conf", folder, (784,), 2048)
    singa_mlp = bench_singa(mlp_cfg, steps)
    numpy_mlp = statistics.median(time_steps(NumpyMLP([784, 2500, 2000, 1500, 1000, 500, 10], 64).step, steps))
    results["mnist_mlp"] = {"batch": 64, "singa_ms": 1e3 * singa_mlp, "numpy_ms": 1e3 * numpy_mlp,
                            "ratio": singa_mlp / numpy_mlp}

    conv_cfg = job_on_synthetic_data("cifar10_convnet.conf", folder, (3, 32, 32), 1000)
    singa_conv = bench_singa(conv_cfg, max(5, steps // 3))
    results["cifar10_convnet"] = {"batch": 100, "singa_ms": 1e3 * singa_conv}
    return results


def print_results(results: dict, steps: int) -> None:
    threads = os.environ.get("OPENBLAS_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "default"))
    print(f"serial step times (median of {steps}; BLAS threads: {threads})")
    print(f"{'net':<18}{'batch':>6}{'singa_mpi ms':>14}{'numpy ms':>10}{'ratio':>8}")
    for name, r in results.items():
        numpy_ms = f"{r['numpy_ms']:.1f}" if "numpy_ms" in r else "-"
        ratio = f"{r['ratio']:.3f}" if "ratio" in r else "-"
        print(f"{name:<18}{r['batch']:>6}{r['singa_ms']:>14.1f}{numpy_ms:>10}{ratio:>8}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--steps", type=positive_int, default=30)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_data_") as folder:  # ~18 MB of synthetic data
        results = measure(folder, args.steps)
    print_results(results, args.steps)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
