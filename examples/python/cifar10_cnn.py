"""SINGA's CIFAR-10 convnet (three 5x5 convolutions with pooling and LRN, then one inner product:
SINGA's examples/cifar10/job.conf and tool/python/examples/cifar10_cnn.py), written with singa_mpi.api.

    python examples/python/cifar10_cnn.py                                 # CIFAR-10 stores in data/cifar10/
    python examples/python/cifar10_cnn.py --synthetic 1000 --steps 50     # random arrays of CIFAR-10's shapes
    mpiexec -n 2 python examples/python/cifar10_cnn.py --synthetic 1000    # the same job over 2 ranks

The stores: ``singa-mpi data cifar10 --out data/cifar10 ...`` (``singa-mpi data -h``).  The job
built is conf/cifar10_convnet.conf, field for field (tests/examples/test_python_examples.py).
"""
from __future__ import annotations

import argparse

import numpy as np

import singa_mpi.api as sm
from synthetic import synthetic_rows

MEAN = "data/cifar10/image_mean.bin"


def build(train: sm.Layer | None = None, test: sm.Layer | None = None) -> sm.Job:
    """The job; ``train`` and ``test``: other input layers (named ``data``) than the CIFAR-10 stores."""
    shape = [3, 32, 32]
    net = sm.Sequential()
    net.add(train or sm.RecordInput("data/cifar10/train.bin", 100, shape, name="data", phase="train",
                                    backend="kvfile", mean_file=MEAN, random_skip=5000))
    net.add(test or sm.RecordInput("data/cifar10/test.bin", 100, shape, name="data", phase="test", backend="kvfile",
                                   mean_file=MEAN))

    def bias(index: int, lr_scale: float | None = 2.0) -> sm.Param:
        return sm.Param(f"b{index}", sm.Constant(0), lr_scale=lr_scale, wd_scale=0 if lr_scale else None)

    def convolution(index: int, filters: int, std: float, **bias_settings) -> sm.Convolution:
        return sm.Convolution(filters, 5, f"conv{index}", stride=1, pad=2, kind="kCConvolution",
                              w=sm.Param(f"w{index}", sm.Gaussian(std=std)), b=bias(index, **bias_settings))

    def pooling(index: int, pool: str) -> sm.Pooling:
        return sm.Pooling(3, f"pool{index}", stride=2, pool=pool, kind="kCPooling")

    def lrn(index: int) -> sm.LRN:
        return sm.LRN(f"norm{index}", local_size=3, alpha=5e-05, beta=0.75)

    net.add(convolution(1, 32, 0.0001))
    net.add(pooling(1, "MAX"))
    net.add(sm.ReLU("relu1"))
    net.add(lrn(1))
    net.add(convolution(2, 32, 0.01))
    net.add(sm.ReLU("relu2"))
    net.add(pooling(2, "AVG"))
    net.add(lrn(2))
    net.add(convolution(3, 64, 0.01, lr_scale=None))
    net.add(sm.ReLU("relu3"))
    net.add(pooling(3, "AVG"))
    net.add(sm.InnerProduct(10, "ip1", w=sm.Param("w4", sm.Gaussian(std=0.01), wd_scale=250), b=bias(4)))
    net.add(sm.SoftmaxLoss("loss", srcs=["ip1", "data"], topk=1))
    rate = sm.LearningRate("kFixedStep", step=[0, 60000, 65000], step_lr=[0.001, 0.0001, 0.00001])
    return sm.Job("cifar10-convnet", net, updater=sm.SGD(rate, momentum=0.9, weight_decay=0.004),
                  cluster=sm.Cluster(workspace="workspace/cifar10_convnet"), seed=1, train_steps=1000,
                  test_steps=100, test_freq=200, disp_freq=50)


def synthetic_inputs(rows: int) -> tuple[sm.Layer, sm.Layer]:
    """Random pixels in CIFAR-10's shape and random labels, the same on every rank (a fixed seed);
    their mean is taken off as one value (the stores' image_mean.bin is a per-pixel file)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (rows + rows // 5, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, len(x))
    return (sm.RecordInput.from_arrays(x[:rows], y[:rows], 100, phase="train", mean_value=127.5),
            sm.RecordInput.from_arrays(x[rows:], y[rows:], 100, phase="test", mean_value=127.5))


def main(argv: list[str] | None = None) -> sm.History:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--synthetic", type=synthetic_rows, metavar="ROWS", help="train on ROWS random rows, not data/cifar10/")
    parser.add_argument("--steps", type=int, help="train this many steps (default: the job's 1000)")
    parser.add_argument("--workspace", help="where to write (default: the job's cluster.workspace)")
    args = parser.parse_args(argv)
    job = build(*synthetic_inputs(args.synthetic)) if args.synthetic else build()
    return job.fit(args.workspace, steps=args.steps, overwrite=True)


if __name__ == "__main__":
    main()
