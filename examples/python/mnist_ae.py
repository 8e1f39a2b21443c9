"""SINGA's MNIST autoencoder (SINGA's examples/rbm/autoencoder.conf and tool/python's mnist_ae.py),
written with singa_mpi.api: the four RBMs of examples/python/mnist_rbm.py unrolled into a 784-1000-500-
250-30-250-500-1000-784 net (the decoder's weights are the encoder's, transposed), fine-tuned with BP
and AdaGrad on the squared reconstruction error.

    python examples/python/mnist_rbm.py && python examples/python/mnist_ae.py     # on data/mnist/
    python examples/python/mnist_ae.py --synthetic 1000 --steps 50                # after mnist_rbm.py --synthetic

It reads the RBMs' checkpoints from workspace/rbm_mnist_1 ... 4 and writes
workspace/rbm_mnist_autoencoder/.  The job built is conf/rbm_mnist_autoencoder.conf, field for field
(tests/examples/test_python_examples.py).
"""
from __future__ import annotations

import argparse

import singa_mpi.api as sm
from mnist_rbm import SIZES, data_layers, frozen_encoder, synthetic_inputs
from synthetic import synthetic_rows


def build(train: sm.Layer | None = None, test: sm.Layer | None = None) -> sm.Job:
    net = sm.Sequential(data_layers(train, test) + frozen_encoder(4))
    for step, level in enumerate(range(4, 0, -1), start=5):  # the decoder: Inner5 (from w4) ... Inner8 (from w1)
        net.add(sm.InnerProduct(SIZES[level - 1], f"Inner{step}", transpose=True,
                                w=sm.Param(f"w{step}", share_from=f"w{level}"), b=sm.Param(f"b{level}1")))
        net.add(sm.Sigmoid(f"Sigmoid{step}"))
    net.add(sm.EuclideanLoss("loss", srcs=["Sigmoid8", "data"]))
    return sm.Job("rbm_mnist_autoencoder", net, updater=sm.AdaGrad(sm.LearningRate("kFixed", 0.01)),
                  cluster=sm.Cluster(workspace="workspace/rbm_mnist_autoencoder"), seed=1, train_steps=12200,
                  test_steps=100, test_freq=500, disp_freq=100, checkpoint_freq=12200,
                  checkpoint_path=[f"workspace/rbm_mnist_{level}" for level in (4, 3, 2, 1)])


def main(argv: list[str] | None = None) -> sm.History:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--synthetic", type=synthetic_rows, metavar="ROWS", help="train on ROWS random rows, not data/mnist/")
    parser.add_argument("--steps", type=int, help="train this many steps (default: the job's 12200)")
    args = parser.parse_args(argv)
    job = build(*synthetic_inputs(args.synthetic)) if args.synthetic else build()
    return job.fit(steps=args.steps, overwrite=True)


if __name__ == "__main__":
    main()
