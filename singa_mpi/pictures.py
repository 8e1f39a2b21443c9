"""``singa-mpi draw``: what an RBM or an autoencoder learned, from a checkpoint, into PNG.

    singa-mpi draw filters workspace/rbm1/checkpoint/step600.h5 --param w1
    singa-mpi draw reconstructions conf/digits_rbm1.conf workspace/rbm1/checkpoint/step600.h5 -n 10

Filters: one tile per hidden unit, a row of W (hdim, vdim) or of an inner-product weight (a column
with ``transpose: true``), each on its own min/max.  Reconstructions: N inputs of one batch over
the mean-field σ(h⁺·W + b_v), h⁺ = act(v·Wᵀ + b_h), of an RBM (no sampling), or over the prediction
an autoencoder's kEuclideanLoss compares with them.  matplotlib is imported only when drawing.
"""
from __future__ import annotations

import math
import os
from typing import Callable

import numpy as np

from singa_mpi.algorithms.base import forward_pass
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.checks.job import validate
from singa_mpi.config.load import PHASES, JobConfig, layers_for_phase, load_job, parse_job
from singa_mpi.errors import ConfigError, DataError, MissingDependency
from singa_mpi.launcher.checks import check_inputs
from singa_mpi.layers.base import layer_class_of, layer_type_name
from singa_mpi.net import build_serial_net
from singa_mpi.plot import INSTALL, save_figure
from singa_mpi.proto import job_pb2

DPI = 80
TILE = 1.0  # inches per tile (its width; the height follows the tile's aspect)
TITLE = 0.5  # inches above the tiles for the title
MIN_WIDTH = 3.0  # inches: room for the title however few tiles there are


def figure_class():
    """matplotlib's Figure (no pyplot, no display needed), or a one-line error saying how to get it."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingDependency("draw", "matplotlib", f"{INSTALL} (or pip install matplotlib)") from None
    return Figure


def _logistic(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1)  # no overflow warning for large |x|


def rbm_reconstruct(v: np.ndarray, w: np.ndarray, b_vis: np.ndarray | None = None,
                    b_hid: np.ndarray | None = None, gaussian: bool = False) -> np.ndarray:
    """Mean-field reconstruction σ(h⁺·W + b_v), h⁺ = act(v·Wᵀ + b_h): v (rows, vdim), W (hdim, vdim)."""
    v, w = np.asarray(v, np.float64), np.asarray(w, np.float64)
    pre = v @ w.T + (0.0 if b_hid is None else b_hid)
    hidden = pre if gaussian else _logistic(pre)
    return _logistic(hidden @ w + (0.0 if b_vis is None else b_vis))


def normalise(tile: np.ndarray) -> np.ndarray:
    """``tile`` scaled to [0, 1] by its own min/max (a constant tile is mid-grey)."""
    low, high = float(tile.min()), float(tile.max())
    return np.full(tile.shape, 0.5) if high == low else (tile - low) / (high - low)


def tile_shape(size: int, shape: str | None) -> tuple[int, int]:
    """(height, width) of an image of ``size`` values: ``--shape HxW``, else the square side."""
    if shape:
        try:
            height, width = (int(part) for part in shape.lower().split("x"))
        except ValueError:
            raise ConfigError(f"--shape {shape}: expected HxW, e.g. 28x28") from None
        if height * width != size:
            raise ConfigError(f"--shape {shape}: {height * width} pixels: expected {size} (one per value)")
        return height, width
    side = math.isqrt(size)
    if side * side != size:
        raise ConfigError(f"{size} values per image is no square: expected --shape HxW with H·W = {size}")
    return side, side


def choose_param(ckpt: checkpoint.Checkpoint, name: str | None) -> str:
    """``name`` if the checkpoint has it as a 2-D array, else (no name) its first 2-D param."""
    weights = [key for key, value in ckpt.params.items() if value.ndim == 2]
    if name in weights or (name is None and weights):
        return name or weights[0]
    if name is None:
        raise DataError(f"{ckpt.path}: no 2-D parameter: expected an RBM's or inner-product layer's weight")
    found = "is not there" if name not in ckpt.params else f"has shape {ckpt.params[name].shape}"
    raise DataError(f"{ckpt.path}: parameter {name!r} {found}: expected a 2-D weight, one of "
                    f"{', '.join(weights) or '(none here)'}")


def is_transposed(ckpt: checkpoint.Checkpoint, name: str) -> bool:
    """Whether the job that wrote ``ckpt`` stores ``name`` as (in_dim, num_output) (``transpose: true``)."""
    # a file converted from SINGA 0.x has no job_config: no layers, so SINGA's (out, in) layout
    for layer in parse_job(ckpt.job_config, ckpt.path).proto.neuralnet.layer:
        if layer.type == job_pb2.kInnerProduct and any(p.name == name for p in layer.param):
            return layer.innerproduct_conf.transpose
    return False


def filters_figure(weight: np.ndarray, title: str, shape: str | None, limit: int):
    """Tiles of the first ``limit`` rows of ``weight`` (units, vdim), as close to square a grid as fits."""
    units = weight[:limit]
    height, width = tile_shape(weight.shape[1], shape)
    cols = math.ceil(math.sqrt(len(units)))
    rows = math.ceil(len(units) / cols)
    cells = [[normalise(units[r * cols + c].reshape(height, width)) if r * cols + c < len(units) else None
              for c in range(cols)] for r in range(rows)]
    return grid_figure(cells, f"{title}: {len(units)} of {len(weight)} filters, {height}x{width}")


def draw_filters(path: str, output: str | None = None, param: str | None = None, shape: str | None = None,
                 limit: int = 100, log: Callable[[str], None] = print) -> str:
    """The filters of ``param`` (default: the first 2-D one) of the checkpoint at ``path`` into ``output``."""
    figure_class()  # the install hint before anything is read
    ckpt = read_checkpoint(path)
    name = choose_param(ckpt, param)
    if param is None:
        log(f"drawing {name} {ckpt.params[name].shape}, the checkpoint's first 2-D parameter (--param picks another)")
    weight = ckpt.params[name].T if is_transposed(ckpt, name) else ckpt.params[name]
    output = output or os.path.join(os.path.dirname(path), f"{_stem(path)}_{name}_filters.png")
    figure = filters_figure(weight, f"{name} {ckpt.params[name].shape}", shape, limit)
    return save_figure(figure, output, "the picture")


def load_net(cfg: JobConfig, ckpt: checkpoint.Checkpoint, workspace: str, phase: str):
    """The job's serial net for ``phase`` with the checkpoint's params; digits prepared as training does."""
    check_inputs(cfg, workspace, [phase], log=print)
    net = build_serial_net(cfg, phase, cfg.proto.seed, workspace, shared={})
    for p in net.params:
        value = ckpt.params.get(p.name)
        if value is None or value.shape != p.logical_shape:
            found = "is not there" if value is None else f"has shape {value.shape}"
            raise DataError(f"{ckpt.path}: parameter {p.name!r} {found}: expected shape {p.logical_shape} "
                            f"for the net of {cfg.path}")
        p.data[...] = value
    return net


def job_kind(cfg: JobConfig, phase: str) -> str:
    """"rbm" (a layer with energy_role visible) or "autoencoder" (kBP with a kEuclideanLoss layer)."""
    from singa_mpi.checks.phase import check_phase

    reading = [name for name in PHASES if any(layer_class_of(layer).is_input
                                                      for _, layer in layers_for_phase(cfg.proto, name))]
    if phase not in reading:  # else check_phase would blame the first layer whose input is left out
        raise ConfigError(f"--phase {phase}: {cfg.path} reads no data in its {phase} phase (no input layer is "
                          f"kept for it): expected a phase it reads data in: {', '.join(reading) or 'none'}")
    check_phase(cfg, phase, {}, [])  # (validate checks the phases the job runs: test needs no test_steps here)
    layers = [layer for _, layer in layers_for_phase(cfg.proto, phase)]
    types = [layer_type_name(layer) for layer in layers]
    if any(layer_class_of(layer).energy_role == "visible" for layer in layers):
        return "rbm"
    if "kEuclideanLoss" in types and cfg.proto.train_one_batch.alg == job_pb2.kBP:
        return "autoencoder"
    raise ConfigError(f"{cfg.path}: {phase} phase: neither an RBM (kRBMVis/kRBMHid, alg: kCD) nor an autoencoder "
                      f"(alg: kBP with a kEuclideanLoss layer): expected one of those to draw reconstructions")


def reconstructions(cfg: JobConfig, ckpt: checkpoint.Checkpoint, workspace: str, phase: str = "test",
                    n: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, reconstructions), each (min(n, batch), dim) float64, from one batch of ``phase``."""
    kind = job_kind(cfg, phase)
    net = load_net(cfg, ckpt, workspace, phase)
    try:
        forward_pass(net, "positive" if kind == "rbm" else "forward", train=False)
        if kind == "autoencoder":  # the loss's srclayers: [prediction, data]
            wire = next(w for w in net.wires if w.layer.conf.type == job_pb2.kEuclideanLoss)
            prediction, data = (np.asarray(s.data, np.float64).reshape(len(s.data), -1)[:n] for s in wire.srcs)
            return data, prediction
        # the net's first RBM (SINGA's jobs train one pair each); its input v, not the layer's samples
        wire = next(w for w in net.wires if w.layer.energy_role == "visible")
        vis = wire.layer
        hid = next(layer for layer in net.layers if layer.name == vis.conf.srclayers[1])
        v = np.asarray(wire.srcs[0].data, np.float64).reshape(len(wire.srcs[0].data), -1)[:n]
        return v, rbm_reconstruct(v, vis.params[0].data, vis.params[1].data if vis.bias else None,
                                  hid.params[1].data if hid.bias else None, hid.gaussian)
    finally:
        net.close_files()


def reconstructions_figure(inputs: np.ndarray, outputs: np.ndarray, title: str, shape: str | None):
    """Inputs on the top row, reconstructions below; each pair on one scale, so they compare."""
    height, width = tile_shape(inputs.shape[1], shape)
    pairs = [normalise(np.stack([a, b])) for a, b in zip(inputs, outputs)]
    cells = [[pair[row].reshape(height, width) for pair in pairs] for row in (0, 1)]
    return grid_figure(cells, f"{title}: inputs (top), reconstructions (bottom)")


def draw_reconstructions(job: str, path: str, workspace_of: Callable[[JobConfig], str], output: str | None = None,
                         n: int = 10, phase: str = "test", shape: str | None = None) -> str:
    """``n`` inputs of the job's ``phase`` data over their reconstructions by the checkpoint at ``path``."""
    figure_class()
    cfg = load_job(job)
    validate(cfg)
    job_kind(cfg, phase)  # before reading data or the checkpoint
    ckpt = read_checkpoint(path)
    inputs, outputs = reconstructions(cfg, ckpt, workspace_of(cfg), phase, n)
    if len(inputs) < n:
        print(f"note: -n {n}: the {phase} batch holds {len(inputs)} rows: drawing {len(inputs)}")
    output = output or os.path.join(os.path.dirname(path), f"{_stem(path)}_reconstructions.png")
    figure = reconstructions_figure(inputs, outputs, f"{cfg.proto.name or _stem(job)} step {ckpt.step}", shape)
    return save_figure(figure, output, "the picture")


def grid_figure(cells: list[list[np.ndarray | None]], title: str):
    """Greyscale images in [0, 1] on a grid without axes (None: an empty cell), titled.
    Size: TILE inches per column, the tiles' aspect per row, TITLE inches on top, at DPI."""
    figure = figure_class()
    rows, cols = len(cells), len(cells[0])
    height, width = next(c for row in cells for c in row if c is not None).shape
    tiles = rows * TILE * height / width
    fig = figure(figsize=(max(cols * TILE, MIN_WIDTH), tiles + TITLE), dpi=DPI)
    axes = fig.subplots(rows, cols, squeeze=False, gridspec_kw={
        "left": 0.01, "right": 0.99, "bottom": 0.01, "top": tiles / (tiles + TITLE), "wspace": 0.08, "hspace": 0.08})
    for row, axes_row in zip(cells, axes):
        for image, ax in zip(row, axes_row):
            ax.set_axis_off()
            if image is not None:
                ax.imshow(image, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    fig.suptitle(title, fontsize="medium")
    return fig


def read_checkpoint(path: str) -> checkpoint.Checkpoint:
    checkpoint.refuse_irregular(path)
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file: expected a checkpoint such as WORKSPACE/checkpoint/step<N>.h5")
    return checkpoint.read(path)


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]
