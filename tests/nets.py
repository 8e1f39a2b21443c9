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


def make_data(path: str, count: int, shape: tuple[int, ...], classes: int, seed: int = 3,
              unit: bool = False) -> str:
    """A deterministic HDF5 store of ``count`` samples of ``shape`` with labels;
    ``unit``: values in [0, 1] (an RBM's visible units) instead of N(0, 1)."""
    rng = np.random.default_rng(seed)
    data = (rng.random((count, *shape)) if unit else rng.normal(0, 1, (count, *shape))).astype(np.float32)
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


# The updater matrix: adaptive rules whose state lives on node-shared chunks or on feature shards.
# delta inside the square root keeps a gradient that is float32 noise (a mathematical zero) from
# being normalised into a full-size step.
UPDATER_RULES = {
    "adam": "type: kAdam adam_conf { beta1: 0.9 beta2: 0.99 }",
    "adam-bias-corrected": "type: kAdam adam_conf { beta1: 0.9 beta2: 0.99 bias_correction: true }",
    "adagrad": "type: kAdaGrad clip_low: -0.5 clip_high: 0.5",  # clipped after the sum, as serially
    "rmsprop": "type: kRMSProp rmsprop_conf { rho: 0.9 }",
    "adadelta": "type: kAdaDelta adadelta_conf { rho: 0.9 }",
}


def updater(rule: str, lr: float = 0.01) -> str:
    """The job's train_one_batch and updater blocks for one of ``UPDATER_RULES`` (weight decay on)."""
    return (f"train_one_batch {{ alg: kBP }}\nupdater {{ {UPDATER_RULES[rule]} weight_decay: 0.001 delta: 1e-6 "
            f"learning_rate {{ type: kFixed base_lr: {lr} }} }}")


def job_text(layers: list[str], steps: int = 20, net_pdim: int = 0, name: str = "t", updater: str = UPDATER) -> str:
    return (f'name: "{name}" seed: 5 train_steps: {steps} disp_freq: 1\n{updater}\n'
            f'neuralnet {{ partition_dim: {net_pdim}\n' + "\n".join(layers) + "\n}\n")


def in_stages(layers: list[str], nranks: int, first: int = 0) -> list[str]:
    """``layers`` from ``first`` on placed whole (``partition_dim: -1``) in contiguous runs over the
    ``nranks`` workers (a pipeline's stages: layer i on worker i * nranks // count); the layers
    before ``first`` as they are."""
    count = len(layers) - first
    placed = []
    for i, layer in enumerate(layers):
        if i >= first:
            where = f" partition_dim: -1 location: {(i - first) * nranks // count}"
            name_end = layer.index('"', layer.index('name: "') + 7) + 1
            layer = layer[:name_end] + where + layer[name_end:]
        placed.append(layer)
    return placed


def split_at_cut(text: str, pdim: int) -> str:
    """``text`` (layers placed by :func:`in_stages`) with the first layer of worker 1's stage split
    over every worker on ``pdim`` (the batch or features): a layer shared by the stages at the cut."""
    whole = " partition_dim: -1 location: 1"
    assert whole in text
    return text.replace(whole, f" partition_dim: {pdim}", 1)


def pipelined(text: str, micro_batches: int, schedule: str = "1f1b") -> str:
    """``text`` (a job of :func:`job_text`) with its training step pipelined over ``micro_batches``."""
    head = "neuralnet { "
    assert head in text
    return text.replace(head, f'{head}pipeline {{ micro_batches: {micro_batches} schedule: "{schedule}" }}\n', 1)


def mlp(path: str, batch: int, scheme: str, nranks: int = 2, steps: int = 20, updater: str = UPDATER) -> str:
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
    elif scheme == "stages":  # a pipeline: contiguous runs of layers, one per worker
        layers = in_stages([_data_layer(path, batch, (12,)), _ip("fc1", "data", 16), _act("act1", "fc1", "kSTanh"),
                            _ip("fc2", "act1", 10), _act("act2", "fc2"), _ip("fc3", "act2", 5), _loss("fc3")],
                           nranks)
    elif scheme == "stages-hybrid":  # the first stage split on the batch over every worker, then stages
        layers = [_data_layer(path, batch, (12,)), _ip("fc1", "data", 16), _act("act1", "fc1", "kSTanh")]
        layers = in_stages(layers + [_ip("fc2", "act1", 10), _act("act2", "fc2"), _ip("fc3", "act2", 5),
                                     _loss("fc3")], nranks, first=3)
    elif scheme in ("stages-middle", "stages-middle-feature"):  # fc2 split over every worker between two stages
        whole, first, last = "partition_dim: -1", "location: 0", f"location: {nranks - 1}"
        split = "partition_dim: 1" if scheme.endswith("feature") else "partition_dim: 0"
        layers = [_data_layer(path, batch, (12,), f"{whole} {first}"), _ip("fc1", "data", 16, whole, loc=first),
                  _act("act1", "fc1", "kSTanh", whole, first), _ip("fc2", "act1", 10, split),
                  _act("act2", "fc2", pdim=split), _ip("fc3", "act2", 5, whole, loc=last), _loss("fc3", whole, last)]
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
    return job_text(layers, steps, updater=updater)


# layer types that cannot be split on features (their sub-layers would need every feature)
_WHOLE_FEATURES = ("kRecordInput", "kSoftmaxLoss", "kLRN")


def placed_anywhere(text: str, nranks: int, seed: int) -> str:
    """``text`` (a job of :func:`job_text` whose layers carry no placement) with each layer drawn (from
    ``seed``) whole on one worker, split on the batch, or (where it can be) split on features, until
    every worker holds a layer: layouts no hand-written test thought of (stages of one worker and of
    all of them, in any order)."""
    import random
    import re

    rng = random.Random(seed)
    lines = text.splitlines()
    layers = [(i, re.search(r'type: (\w+)', line).group(1)) for i, line in enumerate(lines) if line.startswith("layer {")]
    whole = [f"partition_dim: -1 location: {rank}" for rank in range(nranks)]
    while True:
        places = [rng.choice(whole + ["partition_dim: 0"] + ([] if kind in _WHOLE_FEATURES else ["partition_dim: 1"]))
                  for _, kind in layers]
        held = {int(place.rsplit(" ", 1)[1]) for place in places if "location" in place}
        if len(held) == nranks or any("location" not in place for place in places):
            break
    for (i, _), place in zip(layers, places):
        name_end = lines[i].index('"', lines[i].index('name: "') + 7) + 1
        lines[i] = f"{lines[i][:name_end]} {place}{lines[i][name_end:]}"
    return "\n".join(lines) + "\n"


def mlp_anywhere(path: str, batch: int, nranks: int, seed: int, steps: int = 20) -> str:
    """The 12-16-10-5 MLP with each layer placed at random (:func:`placed_anywhere`)."""
    return placed_anywhere(mlp(path, batch, "data", nranks, steps), nranks, seed)


def convnet_anywhere(path: str, batch: int, nranks: int, seed: int, steps: int = 20) -> str:
    """The smooth convnet with LRN (:func:`convnet`) with each layer placed at random (:func:`placed_anywhere`)."""
    return placed_anywhere(convnet(path, batch, "data", steps, lrn=True, pool="AVG", act="kSTanh"), nranks, seed)


def mlp_dropout(path: str, batch: int, scheme: str, ratio: float = 0.3, steps: int = 10, nranks: int = 2) -> str:
    """12-16-10-5 MLP with dropout after each hidden layer; scheme data, feature, hybrid (fc1 on the
    batch, fc2 and its dropout on features) or stages (contiguous runs of layers on the ``nranks``
    workers): the masks must drop the units the serial run drops."""
    first = "partition_dim: 1" if scheme == "feature" else ""
    second = "partition_dim: 1" if scheme in ("feature", "hybrid") else ""
    if scheme not in ("data", "feature", "hybrid", "stages"):
        raise ValueError(scheme)

    def drop(name: str, src: str, pdim: str) -> str:
        return (f'layer {{ name: "{name}" type: kDropout srclayers: "{src}" {pdim} '
                f'dropout_conf {{ dropout_ratio: {ratio} }} }}')

    layers = [_data_layer(path, batch, (12,)), _ip("fc1", "data", 16, first), _act("act1", "fc1", "kSTanh", first),
              drop("drop1", "act1", first), _ip("fc2", "drop1", 10, second), _act("act2", "fc2", "kSTanh", second),
              drop("drop2", "act2", second), _ip("fc3", "drop2", 5), _loss("fc3")]
    if scheme == "stages":
        layers = in_stages(layers, nranks)
    return job_text(layers, steps)


def convnet(path: str, batch: int, scheme: str = "hybrid", steps: int = 20, lrn: bool = False,
            pool: str = "MAX", act: str = "kReLU", updater: str = UPDATER, bn: bool = False, nranks: int = 2) -> str:
    """conv(6@3x3) - [bn] - relu - maxpool - [lrn] - conv(4@3x3) - avgpool - ip(5) - loss on (2, 8, 8) samples.

    hybrid: ip on features, the rest on the batch; data: all on the batch; filters: both convolutions,
    the activation and both poolings split on filters (channels), LRN (which cannot be) and ip on the
    batch; stages: contiguous runs of layers on the ``nranks`` workers (a pipeline).  ``pool: "AVG"`` and ``act: "kSTanh"`` make the net smooth (no decision near a tie).
    """
    if scheme not in ("hybrid", "data", "filters", "stages"):
        raise ValueError(scheme)
    ip_pdim = "partition_dim: 1" if scheme == "hybrid" else ""
    split = "partition_dim: 1" if scheme == "filters" else ""
    lrn_layer = ['layer { name: "norm1" type: kLRN srclayers: "pool1" '
                 'lrn_conf { local_size: 3 alpha: 0.1 beta: 0.75 knorm: 1 } }'] if lrn else []
    layers = [
        _data_layer(path, batch, (2, 8, 8)),
        # before batch norm a bias has nothing to learn (the normalisation removes it): none there
        f'layer {{ name: "conv1" type: kCConvolution srclayers: "data" {split} convolution_conf {{ num_filters: 6 '
        f'kernel: 3 pad: 1 {"bias_term: false" if bn else ""} }} {_param("w_conv1")} '
        f'{"" if bn else _param("b_conv1", "kConstant value: 0")} }}',
        *([f'layer {{ name: "bn1" type: kCudnnBM srclayers: "conv1" {split} {_param("bn_scale", "kGaussian mean: 1 std: 0.1")} '
           f'{_param("bn_bias", "kConstant value: 0.1")} {_param("bn_mean", "kConstant value: 0")} '
           f'{_param("bn_var", "kConstant value: 1")} }}'] if bn else []),
        _act("relu1", "bn1" if bn else "conv1", act, split),
        f'layer {{ name: "pool1" type: kCPooling srclayers: "relu1" {split} pooling_conf {{ pool: {pool} kernel: 2 '
        'stride: 2 } }',
        *lrn_layer,
        f'layer {{ name: "conv2" type: kCConvolution srclayers: "{"norm1" if lrn else "pool1"}" {split} '
        f'convolution_conf {{ num_filters: 4 kernel: 3 pad: 1 }} {_param("w_conv2")} '
        f'{_param("b_conv2", "kConstant value: 0")} }}',
        f'layer {{ name: "pool2" type: kCPooling srclayers: "conv2" {split} pooling_conf {{ pool: AVG kernel: 2 '
        'stride: 2 } }',
        _ip("ip1", "pool2", 5, ip_pdim),
        _loss("ip1"),
    ]
    if scheme == "stages":  # a pipeline over the workers (``nranks`` of them)
        layers = in_stages(layers, nranks)
    return job_text(layers, steps, updater=updater)


def cifar_convnet(path: str, batch: int, scheme: str = "hybrid", steps: int = 100) -> str:
    """conf/cifar10_hybrid.conf at a quarter of the width on (3, 16, 16) samples: conv - maxpool - relu -
    lrn - conv - relu - avgpool - lrn - conv - relu - avgpool - ip(10), momentum SGD at lr 0.001.
    hybrid: ip on features, the rest on the batch; data: all on the batch."""
    ip_pdim = "partition_dim: 1" if scheme == "hybrid" else ""

    def conv(name: str, src: str, filters: int, std: str) -> str:
        return (f'layer {{ name: "{name}" type: kCConvolution srclayers: "{src}" convolution_conf {{ '
                f'num_filters: {filters} kernel: 5 stride: 1 pad: 2 }} {_param("w_" + name, "kGaussian std: " + std)} '
                f'{_param("b_" + name, "kConstant value: 0", "lr_scale: 2.0 wd_scale: 0")} }}')

    def pool(name: str, src: str, kind: str) -> str:
        return (f'layer {{ name: "{name}" type: kCPooling srclayers: "{src}" '
                f'pooling_conf {{ pool: {kind} kernel: 3 stride: 2 }} }}')

    def lrn(name: str, src: str) -> str:
        return (f'layer {{ name: "{name}" type: kLRN srclayers: "{src}" '
                'lrn_conf { local_size: 3 alpha: 5e-05 beta: 0.75 } }')

    layers = [_data_layer(path, batch, (3, 16, 16)), conv("conv1", "data", 8, "0.0001"), pool("pool1", "conv1", "MAX"),
              _act("relu1", "pool1"), lrn("norm1", "relu1"), conv("conv2", "norm1", 8, "0.01"), _act("relu2", "conv2"),
              pool("pool2", "relu2", "AVG"), lrn("norm2", "pool2"), conv("conv3", "norm2", 16, "0.01"),
              _act("relu3", "conv3"), pool("pool3", "relu3", "AVG"), _ip("ip1", "pool3", 10, ip_pdim), _loss("ip1")]
    sgd = ("train_one_batch { alg: kBP }\nupdater { type: kSGD momentum: 0.9 weight_decay: 0.004 "
           "learning_rate { type: kFixed base_lr: 0.001 } }")
    return job_text(layers, steps, updater=sgd)


def job(text: str, path: str = "<test>"):
    return parse_job(text, path)


CD_UPDATER = """
train_one_batch {{ alg: kCD cd_conf {{ cd_k: {cd_k} }} }}
updater {{ type: kSGD momentum: 0.8 weight_decay: 0.0002
          learning_rate {{ type: kFixed base_lr: 0.1 }} }}
"""


def rbm(path: str, batch: int, scheme: str = "data", cd_k: int = 1, nranks: int = 2, steps: int = 20,
        hdim: int = 9, lower: bool = True, gaussian: bool = False, test: bool = False) -> str:
    """An RBM (SINGA's rbm2 shape, small): data -> [ip -> sigmoid, frozen under CD] -> vis <-> hid.

    scheme: "data" (every layer on the batch), "feature" (the RBM's hidden units split),
    "location" (layer i whole on worker i mod nranks)."""
    layers = [_data_layer(path, batch, (12,))]
    pdims = {"data": ("", ""), "feature": ("", "partition_dim: 1")}.get(scheme, ("", ""))
    names = ["data"]
    if lower:
        layers.append(_ip("ip", "data", 10, pdims[0]))
        layers.append(_act("sig", "ip", "kSigmoid", pdims[0]))
        names += ["ip", "sig"]
    below = names[-1]
    hid_conf = f"rbm_conf {{ hdim: {hdim} {'gaussian: true' if gaussian else ''} }}"
    layers.append(f'layer {{ name: "vis" type: kRBMVis srclayers: "{below}" srclayers: "hid" {pdims[1]} '
                  f'rbm_conf {{ hdim: {hdim} }} {_param("w_rbm", "kGaussian std: 0.1")} '
                  f'{_param("b_vis", "kConstant value: 0", "wd_scale: 0")} }}')
    layers.append(f'layer {{ name: "hid" type: kRBMHid srclayers: "vis" {pdims[1]} {hid_conf} '
                  f'param {{ name: "w_rbm_" share_from: "w_rbm" }} '
                  f'{_param("b_hid", "kConstant value: 0", "wd_scale: 0")} }}')
    names += ["vis", "hid"]
    if scheme == "location":
        layers = [layer.replace(" srclayers:", f" location: {i % nranks} srclayers:", 1) if i else
                  layer.replace("type: kRecordInput", "type: kRecordInput location: 0")
                  for i, layer in enumerate(layers)]
    text = job_text(layers, steps, net_pdim=-1 if scheme == "location" else 0, name="rbm",
                    updater=CD_UPDATER.format(cd_k=cd_k))
    if test:
        text = text.replace("disp_freq: 1", "disp_freq: 1 test_steps: 2 test_freq: 5")
    return text


def text_data(folder: str, size: int = 6000, seed: int = 3) -> tuple[str, str]:
    """A small text corpus (input.txt) and its vocabulary (vocab.txt): words of a few letters."""
    rng = np.random.default_rng(seed)
    words = ["def ", "return ", "self", ".x", " = ", "(a, b)", ":\n", "    ", "if ", "for ", "in ", "\n"]
    text = "".join(rng.choice(words, size // 3))[:size].encode()
    os.makedirs(folder, exist_ok=True)
    paths = os.path.join(folder, "input.txt"), os.path.join(folder, "vocab.txt")
    with open(paths[0], "wb") as f:
        f.write(text)
    with open(paths[1], "wb") as f:
        f.write(bytes(sorted(set(text))))
    return paths


def char_rnn(text: str, vocab: str, batch: int, scheme: str = "data", nranks: int = 2, steps: int = 20,
             unroll: int = 5, hidden: int = 8, test: bool = False) -> str:
    """SINGA's char-rnn (examples/char-rnn/job.conf), small: data -> onehot, label; gru1 -> ip1 -> loss.

    scheme: "data" (every layer on the batch), "location" (data and onehot on worker 0, the GRU on worker
    1 mod n, the label on worker 2 (or 0), ip1 and the loss on the last worker: a pipeline), "feature" (ip1
    split on its outputs,
    the rest on the batch; the GRU's units cannot be split while its state is carried)."""
    size = os.path.getsize(vocab) if os.path.exists(vocab) else 20  # a job whose files are missing still parses
    gru_params = " ".join(_param(f"{g}_{k}", "kUniform low: -0.3 high: 0.3")
                          for k in ("hx", "hh", "b") for g in ("z", "r", "c"))
    loc = {"input": "", "label": "", "gru": "", "out": ""}
    if scheme == "location":  # on 4 workers: data and onehot, gru1, label, ip1 and loss
        loc = {"input": "partition_dim: -1 location: 0", "gru": f"partition_dim: -1 location: {1 % nranks}",
               "label": f"partition_dim: -1 location: {2 % nranks if nranks > 2 else 0}",
               "out": f"partition_dim: -1 location: {nranks - 1}"}
    ip_pdim = "partition_dim: 1" if scheme == "feature" else loc["out"]
    layers = [
        f'layer {{ name: "data" type: kCharRNN unroll_len: 1 {loc["input"]} char_rnn_conf {{ path: "{text}" '
        f'vocab_path: "{vocab}" batchsize: {batch} unroll_len: {unroll} }} }}',
        f'layer {{ name: "onehot" type: kOneHot srclayers: "data" unroll_conn_type: kUnrollOneToAll {loc["input"]} '
        f'onehot_conf {{ vocab_size: {size} }} }}',
        f'layer {{ name: "label" type: kRNNLabel srclayers: "data" unroll_conn_type: kUnrollOneToAll {loc["label"]} }}',
        f'layer {{ name: "gru1" type: kGRU srclayers: "onehot" {loc["gru"]} gru_conf {{ dim_hidden: {hidden} }} '
        f'{gru_params} }}',
        _ip("ip1", "gru1", size, ip_pdim),
        f'layer {{ name: "loss" type: kSoftmaxLoss srclayers: "ip1" srclayers: "label" {loc["out"]} }}',
    ]
    updater = ("train_one_batch { alg: kBPTT }\nupdater { type: kRMSProp rmsprop_conf { rho: 0.95 } "
               "learning_rate { type: kFixed base_lr: 0.01 } clip_low: -5 clip_high: 5 }")
    text_job = job_text(layers, steps, net_pdim=0, name="charrnn", updater=updater)
    text_job = text_job.replace("neuralnet { partition_dim: 0", f"neuralnet {{ partition_dim: 0 unroll_len: {unroll}")
    if test:
        text_job = text_job.replace("disp_freq: 1", "disp_freq: 1 test_steps: 1 test_freq: 5")
    return text_job


def gru_on_records(path: str, batch: int, split_gru: bool = True, steps: int = 20, unroll: int = 3) -> str:
    """A GRU unrolled over ``unroll`` steps on (12,) records (every step reads the same record; no text
    streams, so no state is carried): the GRU split on its hidden units (``split_gru``), a loss per step."""
    gru_params = " ".join(_param(f"{g}_{k}", "kUniform low: -0.3 high: 0.3")
                          for k in ("hx", "hh", "b") for g in ("z", "r", "c"))
    pdim = "partition_dim: 1" if split_gru else ""
    layers = [
        _data_layer(path, batch, (12,)).replace('type: kRecordInput', 'type: kRecordInput unroll_len: 1'),
        f'layer {{ name: "gru1" type: kGRU srclayers: "data" {pdim} gru_conf {{ dim_hidden: 7 }} {gru_params} }}',
        _ip("ip1", "gru1", 5),
        'layer { name: "loss" type: kSoftmaxLoss srclayers: "ip1" srclayers: "data" }',
    ]
    updater = ("train_one_batch { alg: kBPTT }\nupdater { type: kSGD momentum: 0.9 "
               "learning_rate { type: kFixed base_lr: 0.05 } }")
    text = job_text(layers, steps, name="gru", updater=updater)
    return text.replace("neuralnet { partition_dim: 0", f"neuralnet {{ partition_dim: 0 unroll_len: {unroll}")


def v01_job(shard: str, fc1: str = "", label: str = "") -> str:
    """A small v0.1 net: 8x8 images, one hidden layer; ``fc1`` and ``label`` add placement fields."""
    def param(name: str) -> str:
        return f'param {{ name: "{name}" init {{ type: kUniform low: -0.3 high: 0.3 }} }}'

    return f"""name: "v01" seed: 3 train_steps: 5 disp_freq: 1
train_one_batch {{ alg: kBP }}
updater {{ type: kSGD momentum: 0.9 learning_rate {{ type: kFixed base_lr: 0.05 }} }}
neuralnet {{
  layer {{ name: "data" type: kShardData sharddata_conf {{ path: "{shard}" batchsize: 7 random_skip: 4 }} }}
  layer {{ name: "mnist" type: kMnist srclayers: "data" mnist_conf {{ norm_a: 255 norm_b: 0.5 }} }}
  layer {{ name: "label" type: kLabel srclayers: "data" {label} }}
  layer {{ name: "fc1" type: kInnerProduct srclayers: "mnist" {fc1} innerproduct_conf {{ num_output: 9 }}
          {param("w1")} {param("b1")} }}
  layer {{ name: "tanh" type: kSTanh srclayers: "fc1" }}
  layer {{ name: "fc2" type: kInnerProduct srclayers: "tanh" innerproduct_conf {{ num_output: 4 }}
          {param("w2")} {param("b2")} }}
  layer {{ name: "loss" type: kSoftmaxLoss srclayers: "fc2" srclayers: "label" }}
}}
"""
