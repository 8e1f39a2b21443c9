"""SINGA's MNIST MLP (784-2500-2000-1500-1000-500-10, scaled tanh, SGD with a staircase learning rate:
SINGA's examples/mnist/job.conf and tool/python/examples/mnist_mlp.py), written with singa_mpi.api.

    python examples/python/mnist_mlp.py                                  # MNIST stores in data/mnist/
    python examples/python/mnist_mlp.py --synthetic 2000 --steps 100     # random arrays of MNIST's shapes
    mpiexec -n 2 python examples/python/mnist_mlp.py --synthetic 2000     # the same job over 2 ranks

The stores: ``singa-mpi data mnist --images train-images-idx3-ubyte.gz --labels
train-labels-idx1-ubyte.gz --out data/mnist/train.h5`` (and t10k- for test.h5).  The job built is
conf/mnist_mlp.conf, field for field (tests/examples/test_python_examples.py).
"""
from __future__ import annotations

import argparse

import numpy as np

import singa_mpi.api as sm
from synthetic import synthetic_rows

MEAN = STD = 127.5  # bytes 0..255 to -1..1


def build(train: sm.Layer | None = None, test: sm.Layer | None = None) -> sm.Job:
    """The job; ``train`` and ``test``: other input layers (named ``data``) than the MNIST stores."""
    net = sm.Sequential()
    net.add(train or sm.RecordInput("data/mnist/train.h5", 64, 784, name="data", phase="train", mean_value=MEAN,
                                    std_value=STD, random_skip=5000))
    net.add(test or sm.RecordInput("data/mnist/test.h5", 100, 784, name="data", phase="test", mean_value=MEAN,
                                   std_value=STD))
    uniform = sm.Uniform(-0.05, 0.05)
    for index, units in enumerate([2500, 2000, 1500, 1000, 500, 10], start=1):
        net.add(sm.InnerProduct(units, f"fc{index}", w=sm.Param(f"w{index}", uniform),
                                b=sm.Param(f"b{index}", uniform)))
        if units != 10:
            net.add(sm.STanh(f"tanh{index}"))
    net.add(sm.SoftmaxLoss("loss", srcs=["fc6", "data"], topk=1))
    rate = sm.LearningRate("kStep", 0.001, change_freq=60, gamma=0.997)
    return sm.Job("mnist-mlp", net, updater=sm.SGD(rate), cluster=sm.Cluster(workspace="workspace/mnist_mlp"),
                  seed=1, train_steps=1000, test_steps=10, test_freq=60, disp_freq=10)


def synthetic_inputs(rows: int) -> tuple[sm.Layer, sm.Layer]:
    """Random bytes in MNIST's shape and random labels, the same on every rank (a fixed seed)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (rows + rows // 5, 784)).astype(np.float32)
    y = rng.integers(0, 10, len(x))
    return (sm.RecordInput.from_arrays(x[:rows], y[:rows], 64, phase="train", mean_value=MEAN, std_value=STD),
            sm.RecordInput.from_arrays(x[rows:], y[rows:], 100, phase="test", mean_value=MEAN, std_value=STD))


def main(argv: list[str] | None = None) -> sm.History:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--synthetic", type=synthetic_rows, metavar="ROWS", help="train on ROWS random rows, not data/mnist/")
    parser.add_argument("--steps", type=int, help="train this many steps (default: the job's 1000)")
    parser.add_argument("--workspace", help="where to write (default: the job's cluster.workspace)")
    args = parser.parse_args(argv)
    job = build(*synthetic_inputs(args.synthetic)) if args.synthetic else build()
    return job.fit(args.workspace, steps=args.steps, overwrite=True)


if __name__ == "__main__":
    main()
