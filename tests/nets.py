"""Small job configurations and synthetic data shared by planner, runtime and MPI tests."""
from __future__ import annotations

import os

import h5py
import numpy as np

from singa_mpi.config.load import parse_job

UPDATER = """
train_one_batch { alg: kBP }
updater { type: kSGD momentum: 0.9 weight_decay: 0.001
          learning_rate { type: kFixed base_lr: 0.05 } }
"""


def make_data(path: str, count: int, shape: tuple[int, ...], classes: int, seed: int = 3) -> str:
    """A deterministic HDF5 store of ``count`` samples of ``shape`` with labels."""
    rng = np.random.default_rng(seed)
    data = rng.normal(0, 1, (count, *shape)).astype(np.float32)
    labels = rng.integers(0, classes, count).astype(np.int32)
    tmp = f"{path}.tmp{os.getpid()}"
    with h5py.File(tmp, "w") as f:
        f.create_dataset("data", data=data)
        f.create_dataset("label", data=labels)
    os.replace(tmp, path)
    return path


def _param(name: str, init: str = "kGaussian std: 0.3", extra: str = "") -> str:
    return f'param {{ name: "{name}" {extra} init {{ type: {init} }} }}'


def _data_layer(path: str, batch: int, shape: tuple[int, ...], pdim: str = "") -> str:
    shape_text = " ".join(f"shape: {s}" for s in shape)
    return (f'layer {{ name: "data" type: kRecordInput {pdim} store_conf {{ backend: "hdf5" path: "{path}" '
            f'batchsize: {batch} {shape_text} shuffle: true }} }}')


def _ip(name: str, src: str, out: int, pdim: str = "", w: str | None = None, share: str | None = None,
        loc: str = "", transpose: bool = False) -> str:
    wparam = (f'param {{ name: "{w or "w_" + name}" share_from: "{share}" }}' if share
              else _param(w or f"w_{name}"))
    conf = f"num_output: {out}" + (" transpose: true" if transpose else "")
    return (f'layer {{ name: "{name}" type: kInnerProduct srclayers: "{src}" {pdim} {loc} '
            f'innerproduct_conf {{ {conf} }} {wparam} {_param("b_" + name, "kConstant value: 0.01")} }}')


def _act(name: str, src: str, kind: str = "kReLU", pdim: str = "", loc: str = "") -> str:
    return f'layer {{ name: "{name}" type: {kind} srclayers: "{src}" {pdim} {loc} }}'


def _loss(src: str, pdim: str = "", loc: str = "") -> str:
    return f'layer {{ name: "loss" type: kSoftmaxLoss srclayers: "{src}" srclayers: "data" {pdim} {loc} }}'


def job_text(layers: list[str], steps: int = 20, net_pdim: int = 0, name: str = "t") -> str:
    return (f'name: "{name}" seed: 5 train_steps: {steps} disp_freq: 1\n{UPDATER}\n'
            f'neuralnet {{ partition_dim: {net_pdim}\n' + "\n".join(layers) + "\n}\n")


def mlp(path: str, batch: int, scheme: str, nranks: int = 2) -> str:
    """A 12-16-10-5 MLP under one of the partitioning schemes of the equivalence matrix."""
    if scheme == "data":
        layers = [_data_layer(path, batch, (12,)), _ip("fc1", "data", 16), _act("act1", "fc1", "kSTanh"),
                  _ip("fc2", "act1", 10), _act("act2", "fc2"), _ip("fc3", "act2", 5), _loss("fc3")]
    elif scheme == "feature":
        one = "partition_dim: 1"
        layers = [_data_layer(path, batch, (12,)), _ip("fc1", "data", 16, one), _act("act1", "fc1", "kSTanh", one),
                  _ip("fc2", "act1", 10, one), _act("act2", "fc2", pdim=one), _ip("fc3", "act2", 5, one),
                  _loss("fc3")]
    elif scheme == "pipeline":
        none = "partition_dim: -1"

        def loc(i: int) -> str:
            return f"location: {i % nranks}"

        layers = [_data_layer(path, batch, (12,), f"{none} {loc(0)}"), _ip("fc1", "data", 16, none, loc=loc(0)),
                  _act("act1", "fc1", "kSTanh", none, loc(1)), _ip("fc2", "act1", 10, none, loc=loc(1)),
                  _act("act2", "fc2", pdim=none, loc=loc(2)), _ip("fc3", "act2", 5, none, loc=loc(3)),
                  _loss("fc3", none, loc(3))]
    elif scheme == "hybrid":  # the first layer on the batch, the rest on features
        one = "partition_dim: 1"
        layers = [_data_layer(path, batch, (12,)), _ip("fc1", "data", 16), _act("act1", "fc1", "kSTanh"),
                  _ip("fc2", "act1", 10, one), _act("act2", "fc2", pdim=one), _ip("fc3", "act2", 5, one),
                  _loss("fc3")]
    elif scheme == "shared":
        layers = [_data_layer(path, batch, (12,)), _ip("fc1", "data", 12), _act("act1", "fc1", "kSTanh"),
                  _ip("fc2", "act1", 12, w="w_fc2", share="w_fc1"), _act("act2", "fc2"), _ip("fc3", "act2", 5),
                  _loss("fc3")]
    elif scheme == "transposed":  # weights stored (in, out): on the batch, on features, on the batch
        one = "partition_dim: 1"
        layers = [_data_layer(path, batch, (12,)), _ip("fc1", "data", 16, transpose=True),
                  _act("act1", "fc1", "kSTanh"), _ip("fc2", "act1", 10, one, transpose=True),
                  _act("act2", "fc2", pdim=one), _ip("fc3", "act2", 5, transpose=True), _loss("fc3")]
    else:
        raise ValueError(scheme)
    return job_text(layers)


def convnet(path: str, batch: int, scheme: str = "hybrid") -> str:
    """conv(6@3x3) - relu - maxpool - conv(4@3x3) - avgpool - ip(5) - loss; hybrid: ip on features."""
    ip_pdim = "partition_dim: 1" if scheme == "hybrid" else ""
    layers = [
        _data_layer(path, batch, (2, 8, 8)),
        'layer { name: "conv1" type: kCConvolution srclayers: "data" convolution_conf { num_filters: 6 kernel: 3 '
        f'pad: 1 }} {_param("w_conv1")} {_param("b_conv1", "kConstant value: 0")} }}',
        _act("relu1", "conv1"),
        'layer { name: "pool1" type: kCPooling srclayers: "relu1" pooling_conf { pool: MAX kernel: 2 stride: 2 } }',
        'layer { name: "conv2" type: kCConvolution srclayers: "pool1" convolution_conf { num_filters: 4 kernel: 3 '
        f'pad: 1 }} {_param("w_conv2")} {_param("b_conv2", "kConstant value: 0")} }}',
        'layer { name: "pool2" type: kCPooling srclayers: "conv2" pooling_conf { pool: AVG kernel: 2 stride: 2 } }',
        _ip("ip1", "pool2", 5, ip_pdim),
        _loss("ip1"),
    ]
    return job_text(layers)


def job(text: str, path: str = "<test>"):
    return parse_job(text, path)
