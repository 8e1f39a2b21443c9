"""SINGA's RBM stack on MNIST (SINGA's examples/rbm/rbm1.conf ... rbm4.conf and tool/python's
mnist_rbm1.py ... mnist_rbm4.py), written with singa_mpi.api: four RBMs trained one after the other
with contrastive divergence (784-1000-500-250-30), each stage reading the ones before it, frozen, from
their checkpoints; examples/python/mnist_ae.py then unrolls them into an autoencoder.

    python examples/python/mnist_rbm.py                                # stages 1-4 on data/mnist/
    python examples/python/mnist_rbm.py --stage 2                      # one stage (stage 1's checkpoint at hand)
    python examples/python/mnist_rbm.py --synthetic 1000 --steps 50    # random arrays of MNIST's shapes
    mpiexec -n 2 python examples/python/mnist_rbm.py --synthetic 1000 --steps 50

Stage k writes workspace/rbm_mnist_k/ (stage k+1 reads it).  The jobs built are
conf/rbm_mnist_1.conf ... rbm_mnist_4.conf, field for field (tests/examples/test_python_examples.py).
"""
from __future__ import annotations

import argparse

import numpy as np

import singa_mpi.api as sm
from synthetic import synthetic_rows

SIZES = [784, 1000, 500, 250, 30]
STD = 255.0  # bytes 0..255 to 0..1


def data_layers(train: sm.Layer | None = None, test: sm.Layer | None = None) -> list[sm.Layer]:
    """The MNIST stores (or other input layers named ``data``)."""
    return [train or sm.RecordInput("data/mnist/train.h5", 100, 784, name="data", phase="train", std_value=STD,
                                    shuffle=True),
            test or sm.RecordInput("data/mnist/test.h5", 100, 784, name="data", phase="test", std_value=STD)]


def frozen_encoder(levels: int) -> list[sm.Layer]:
    """The first ``levels`` trained RBMs as inner products (weights and hidden biases from their
    checkpoints), each but a Gaussian top followed by a sigmoid."""
    layers: list[sm.Layer] = []
    for level in range(1, levels + 1):
        layers.append(sm.InnerProduct(SIZES[level], f"Inner{level}", w=sm.Param(f"w{level}"),
                                      b=sm.Param(f"b{level}2")))
        if level < 4:
            layers.append(sm.Sigmoid(f"Sigmoid{level}"))
    return layers


def build(stage: int, train: sm.Layer | None = None, test: sm.Layer | None = None) -> sm.Job:
    """The job of RBM ``stage`` (1-4)."""
    hidden = SIZES[stage]
    net = sm.Sequential(data_layers(train, test) + frozen_encoder(stage - 1))
    below = net.layers[-1].name
    net.add(sm.RBMVis(hidden, "RBMVis", srcs=[below, "RBMHid"], w=sm.Param(f"w{stage}", sm.Gaussian(mean=0, std=0.1)),
                      b=sm.Param(f"b{stage}1", sm.Constant(0), wd_scale=0)))
    net.add(sm.RBMHid(hidden, "RBMHid", srcs="RBMVis", gaussian=True if stage == 4 else None,
                      w=sm.Param(f"w{stage}_", share_from=f"w{stage}"),
                      b=sm.Param(f"b{stage}2", sm.Constant(0), wd_scale=0)))
    earlier = [f"workspace/rbm_mnist_{level}" for level in range(stage - 1, 0, -1)]
    return sm.Job(f"rbm_mnist_{stage}", net, algorithm="kCD", cd_k=1,
                  updater=sm.SGD(sm.LearningRate("kFixed", 0.001 if stage == 4 else 0.1), momentum=0.8,
                                 weight_decay=0.0002),  # the Gaussian top: a smaller rate (SINGA's rbm4.conf)
                  cluster=sm.Cluster(workspace=f"workspace/rbm_mnist_{stage}"), seed=1, train_steps=6000,
                  test_steps=100, test_freq=500, disp_freq=100, checkpoint_freq=6000,
                  checkpoint_path=earlier or None)


def synthetic_inputs(rows: int) -> tuple[sm.Layer, sm.Layer]:
    """Random bytes in MNIST's shape, the same on every rank (a fixed seed); no labels (CD needs none)."""
    x = np.random.default_rng(0).integers(0, 256, (rows + rows // 5, 784)).astype(np.float32)
    return (sm.RecordInput.from_arrays(x[:rows], None, 100, phase="train", std_value=STD, shuffle=True),
            sm.RecordInput.from_arrays(x[rows:], None, 100, phase="test", std_value=STD))


def main(argv: list[str] | None = None) -> list[sm.History]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--stage", type=int, choices=range(1, 5), help="train this stage only (default: 1 to 4)")
    parser.add_argument("--synthetic", type=synthetic_rows, metavar="ROWS", help="train on ROWS random rows, not data/mnist/")
    parser.add_argument("--steps", type=int, help="train this many steps per stage (default: the jobs' 6000)")
    args = parser.parse_args(argv)
    inputs = synthetic_inputs(args.synthetic) if args.synthetic else (None, None)
    stages = [args.stage] if args.stage else [1, 2, 3, 4]
    return [build(stage, *inputs).fit(steps=args.steps, overwrite=True) for stage in stages]


if __name__ == "__main__":
    main()
