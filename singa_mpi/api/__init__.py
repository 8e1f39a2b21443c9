"""The Python API: build a job from Python, as the ``.conf`` file that ``singa-mpi`` runs.

Every object is a view of one message of ``singa_mpi/proto/job.proto``, so a job built here and the
same job written as a file are one configuration: :meth:`Job.to_conf` writes the text, and
:meth:`Job.from_conf` reads any ``.conf`` file into these objects, field for field::

    import singa_mpi.api as sm

    net = sm.Sequential()
    net.add(sm.RecordInput("data/digits/train.h5", 64, 64, name="data", phase="train", std_value=16))
    net.add(sm.InnerProduct(256, "fc1", w=sm.Param("w1", sm.Uniform(-0.05, 0.05)), partition_dim=1))
    net.add(sm.ReLU("relu1"))
    net.add(sm.InnerProduct(10, "fc2"))
    net.add(sm.SoftmaxLoss("loss", srcs=["fc2", "data"]))
    job = sm.Job("digits", net, updater=sm.SGD(0.05, momentum=0.9), cluster=sm.Cluster(workers=2),
                 algorithm="kBP", train_steps=600, seed=1)
    job.check()               # what `singa-mpi check` checks: an ArgumentError naming layer and argument
    job.to_conf("digits.conf")

Arguments are the proto's fields by name, nested blocks as dicts; a bad one raises
:class:`ArgumentError` (a ``ValueError``) naming the layer and the argument.
"""
from singa_mpi.api.fields import ArgumentError
from singa_mpi.api.job import SGD, AdaGrad, Cluster, Job, LearningRate, Updater
from singa_mpi.api.layers import (LRN, Activation, CharRNN, Constant, Convolution, Dense, Dropout, EuclideanLoss,
                                  Gaussian, InnerProduct, Init, Layer, Param, Pooling, RBMHid, RBMVis, RecordInput,
                                  ReLU, Sigmoid, SoftmaxLoss, STanh, Uniform)
from singa_mpi.api.net import Net, Sequential
from singa_mpi.api.run import History, RunFailed, Stopped, evaluate, fit, params, predict

__all__ = ["ArgumentError", "Job", "Net", "Sequential", "Updater", "LearningRate", "SGD", "AdaGrad", "Cluster",
           "Layer", "Param", "Init", "Constant", "Uniform", "Gaussian", "InnerProduct", "Dense", "Convolution",
           "Pooling", "LRN", "Dropout", "ReLU", "STanh", "Sigmoid", "Activation", "SoftmaxLoss", "EuclideanLoss",
           "RecordInput", "CharRNN", "RBMVis", "RBMHid", "fit", "evaluate", "params", "predict", "History",
           "Stopped", "RunFailed"]
