"""Every registered layer type keeps float32 float32: its output, its input gradients, its param
gradients (and the products and per-row terms they wait in), and the arrays it keeps for backward.

A silent promotion to float64 (a Python or NumPy float64 scalar, a float64 constant, a reduction
without ``dtype``) doubles the memory traffic of the step and halves the speed of its GEMMs; an
in-place add into a float32 gradient hides it.  The cases walk the layer registry: a new built-in
type fails ``test_every_built_in_layer_type_has_a_case`` until it has one here.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import pytest
from google.protobuf import text_format

from singa_mpi.data import convert, memory
from singa_mpi.layers.base import LAYERS, ONE_TO_ONE, Layer, LayerContext
from singa_mpi.params import Param, logical_init
from singa_mpi.proto import job_pb2

F32, C64 = np.dtype(np.float32), np.dtype(np.complex64)
ROWS = 5  # odd: deterministic mode's blocks of 2 rows leave a short last block
WB = 'param { name: "w" init { type: kGaussian std: 0.3 } } param { name: "b" init { type: kGaussian std: 0.1 } }'
BN = ('param { name: "s" init { type: kGaussian mean: 1 std: 0.2 } } param { name: "b" init { type: kGaussian std: 0.2 } } '
      'param { name: "m" init { type: kConstant value: 0 } } param { name: "v" init { type: kConstant value: 1 } }')
GRU_PARAMS = " ".join(f'param {{ name: "{n}" init {{ type: kGaussian std: 0.3 }} }}'
                      for n in ("zx", "rx", "cx", "zh", "rh", "ch", "zb", "rb", "cb"))
TEXT = b"the quick brown fox jumps over the lazy dog, again and again and again. "


def floats(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def ids(high, *shape, seed=0):
    return np.random.default_rng(seed).integers(0, high, shape).astype(np.float32)


def labels(high, seed=0):
    return np.random.default_rng(seed).integers(0, high, ROWS).astype(np.int32)


@dataclasses.dataclass
class Case:
    """A layer's config text (after its type), its sources' per-sample shapes and its inputs."""

    text: str
    shapes: tuple = ()
    inputs: Callable[[], list] = list
    gradient: bool = True  # backward is given an output gradient (False: input, output, loss layers)


def _memory_store(shape) -> str:
    data = floats(40, *shape, seed=9)
    return memory.register("float32-test", data, np.arange(40, dtype=np.int32) % 3)


def _text() -> tuple[str, str]:
    return (memory.register_bytes("float32-text", TEXT),
            memory.register_bytes("float32-vocab", bytes(sorted(set(TEXT)))))


CASES: dict[str, Callable[[str], Case]] = {  # type name -> (tmp folder) -> case
    "kRecordInput": lambda tmp: Case(f'store_conf {{ backend: "memory" path: "{_memory_store((4,))}" batchsize: {ROWS + 3} '
                                     f'shape: 4 mean_value: 0.5 std_value: 2 }}', gradient=False),
    "kCSVInput": lambda tmp: Case(f'store_conf {{ backend: "memory" path: "{_memory_store((4,))}" batchsize: {ROWS + 3} '
                                  f'shape: 4 }}', gradient=False),
    "kImagePreprocess": lambda tmp: Case("rgbimage_conf { cropsize: 3 mirror: true scale: 0.5 }", ((2, 5, 5),),
                                         lambda: [floats(ROWS, 2, 5, 5)], gradient=False),
    "kShardData": lambda tmp: Case(f'sharddata_conf {{ path: "{_shard(tmp)}" batchsize: {ROWS + 3} }}', gradient=False),
    "kMnist": lambda tmp: Case("mnist_conf { norm_a: 255 norm_b: 0.5 }", ((3, 3),),
                               lambda: [ids(256, ROWS, 3, 3)], gradient=False),
    "kRGBImage": lambda tmp: Case("rgbimage_conf { cropsize: 3 mirror: true scale: 0.5 }", ((2, 5, 5),),
                                  lambda: [ids(256, ROWS, 2, 5, 5)], gradient=False),
    "kLabel": lambda tmp: Case("", ((),), lambda: [labels(3)], gradient=False),
    "kInnerProduct": lambda tmp: Case(f"innerproduct_conf {{ num_output: 3 }} {WB}", ((2, 3),),
                                      lambda: [floats(ROWS, 2, 3)]),
    "kReLU": lambda tmp: Case("relu_conf { negative_slope: 0.1 }", ((4,),), lambda: [floats(ROWS, 4)]),
    "kSigmoid": lambda tmp: Case("", ((4,),), lambda: [floats(ROWS, 4)]),
    "kSTanh": lambda tmp: Case("", ((4,),), lambda: [floats(ROWS, 4)]),
    "kActivation": lambda tmp: Case("activation_conf { type: TANH }", ((4,),), lambda: [floats(ROWS, 4)]),
    "kCudnnActivation": lambda tmp: Case("activation_conf { type: STANH }", ((4,),), lambda: [floats(ROWS, 4)]),
    "kDropout": lambda tmp: Case("dropout_conf { dropout_ratio: 0.3 }", ((4,),), lambda: [floats(ROWS, 4)]),
    "kSoftmax": lambda tmp: Case("softmax_conf { num_softmax_per_instance: 2 }", ((6,),), lambda: [floats(ROWS, 6)]),
    "kCudnnSoftmax": lambda tmp: Case("", ((6,),), lambda: [floats(ROWS, 6)]),
    "kEmbedding": lambda tmp: Case('embedding_conf { vocab_size: 7 feature_dim: 3 } '
                                   'param { name: "t" init { type: kGaussian } }', ((),), lambda: [ids(7, ROWS)]),
    "kOneHot": lambda tmp: Case("onehot_conf { vocab_size: 7 }", ((),), lambda: [ids(7, ROWS)]),
    "kConvolution": lambda tmp: Case(f"convolution_conf {{ num_filters: 3 kernel: 3 pad: 1 stride: 2 }} {WB}",
                                     ((2, 6, 6),), lambda: [floats(ROWS, 2, 6, 6)]),
    "kCConvolution": lambda tmp: Case(f"convolution_conf {{ num_filters: 3 kernel: 3 }} {WB}",
                                      ((2, 6, 6),), lambda: [floats(ROWS, 2, 6, 6)]),
    "kCudnnConv": lambda tmp: Case(f"convolution_conf {{ num_filters: 3 kernel: 2 bias_term: false }} {WB}",
                                   ((2, 5, 5),), lambda: [floats(ROWS, 2, 5, 5)]),
    "kPooling": lambda tmp: Case("pooling_conf { pool: MAX kernel: 3 stride: 2 pad: 1 }", ((2, 6, 6),),
                                 lambda: [floats(ROWS, 2, 6, 6)]),
    "kCPooling": lambda tmp: Case("pooling_conf { pool: AVG kernel: 2 stride: 2 }", ((2, 6, 6),),
                                  lambda: [floats(ROWS, 2, 6, 6)]),
    "kCudnnPool": lambda tmp: Case("pooling_conf { pool: AVG kernel: 3 stride: 1 pad: 1 }", ((2, 5, 5),),
                                   lambda: [floats(ROWS, 2, 5, 5)]),
    "kLRN": lambda tmp: Case("lrn_conf { local_size: 3 alpha: 0.1 beta: 0.75 }", ((4, 3, 3),),
                             lambda: [floats(ROWS, 4, 3, 3)]),
    "kCudnnLRN": lambda tmp: Case("lrn_conf { local_size: 5 alpha: 0.01 beta: 0.75 knorm: 2 }", ((6, 2, 2),),
                                  lambda: [floats(ROWS, 6, 2, 2)]),
    "kSoftmaxLoss": lambda tmp: Case("softmaxloss_conf { scale: 0.5 topk: 2 }", ((4,), ()),
                                     lambda: [floats(ROWS, 4), labels(4)], gradient=False),
    "kCudnnSoftmaxLoss": lambda tmp: Case("", ((4,), ()), lambda: [floats(ROWS, 4), labels(4)], gradient=False),
    "kEuclideanLoss": lambda tmp: Case("", ((4,), (4,)), lambda: [floats(ROWS, 4), floats(ROWS, 4, seed=1)],
                                       gradient=False),
    "kAccuracy": lambda tmp: Case("", ((4,), ()), lambda: [floats(ROWS, 4), labels(4)], gradient=False),
    "kArgSort": lambda tmp: Case("argsort_conf { topk: 2 }", ((4,),), lambda: [floats(ROWS, 4)], gradient=False),
    "kCSVOutput": lambda tmp: Case(f'store_conf {{ path: "{tmp / "out.csv"}" }}', ((3,),),
                                   lambda: [floats(ROWS, 3)], gradient=False),
    "kRecordOutput": lambda tmp: Case(f'store_conf {{ path: "{tmp / "out.bin"}" }}', ((3,),),
                                      lambda: [floats(ROWS, 3)], gradient=False),
    "kGRU": lambda tmp: Case(f"gru_conf {{ dim_hidden: 3 }} {GRU_PARAMS}", ((4,), (3,)),
                             lambda: [floats(ROWS, 4), floats(ROWS, 3, seed=1)]),
    "kBM": lambda tmp: Case(f"bm_conf {{ running_factor: 0.5 }} {BN}", ((3, 2, 2),), lambda: [floats(ROWS, 3, 2, 2)]),
    "kCudnnBM": lambda tmp: Case(BN, ((3,),), lambda: [floats(ROWS, 3)]),
    "kCharRNN": lambda tmp: Case('char_rnn_conf {{ path: "{}" vocab_path: "{}" unroll_len: 3 batchsize: {} }}'
                                 .format(*_text(), ROWS + 3), gradient=False),
    "kRNNLabel": lambda tmp: Case("unroll_index: 1", ((4,),), lambda: [ids(9, ROWS, 4)], gradient=False),
    "kCharRNNOutput": lambda tmp: Case(f'char_rnn_conf {{ vocab_path: "{_text()[1]}" path: "{tmp / "out.txt"}" }}',
                                       ((2,),), lambda: [ids(9, ROWS, 2)], gradient=False),
    "kRNNDummy": lambda tmp: Case("rnn_dummy_conf { shape: 2 low: 0 high: 9 integer: true }", gradient=False),
}
# per-channel vectors a layer keeps in float64 on purpose (batch norm's statistics: its docstring)
FLOAT64_KEPT = {"kBM": {"inv_std"}, "kCudnnBM": {"inv_std"}}
PAIRS = ("kRBMVis", "kRBMHid")
WHOLE_BATCH = ("kCSVOutput", "kRecordOutput", "kCharRNNOutput")  # writers of whole batches: never split  # an RBM is two layers, driven by contrastive divergence's passes: its own test


def _shard(tmp) -> str:
    path = str(tmp / "shard")
    convert.write_store(path, "shard", ids(256, 40, 2, 3).astype(np.uint8), np.arange(40) % 3)
    return path


def build(type_name: str, text: str, shapes, ctx: LayerContext) -> Layer:
    conf = text_format.Parse(f'name: "l" type: {type_name} {text}', job_pb2.LayerProto())
    layer = LAYERS.select(conf)(conf, ctx)
    layer.out_shape = tuple(layer.setup([tuple(s) for s in shapes]))
    for spec in layer.param_specs:  # as the framework allocates them: float32
        param = Param(spec.conf, spec.logical_shape, spec.shard)
        param.data[...] = logical_init(spec.conf, spec.logical_shape, 7)[param.shard_index()]
        param.zero_grad()
        layer.params.append(param)
    return layer


def float_arrays(value, where: str) -> list[tuple[str, np.ndarray]]:
    """(name, array) of every floating (or complex) array in ``value`` (arrays, tuples, lists of them)."""
    if isinstance(value, np.ndarray):
        return [(where, value)] if value.dtype.kind in "fc" else []
    if isinstance(value, (tuple, list)):
        return [item for i, v in enumerate(value) for item in float_arrays(v, f"{where}[{i}]")]
    if isinstance(value, dict):  # scratch arrays by name
        return [item for k, v in value.items() for item in float_arrays(v, f"{where}[{k!r}]")]
    return []


def not_float32(named: list[tuple[str, np.ndarray]]) -> list[str]:
    """Each array of ``named`` that is not float32 (complex64 for a spectrum), as "name: dtype"."""
    return [f"{name}: {array.dtype}" for name, array in named if array.dtype not in (F32, C64)]


def kept(layer: Layer, allowed=frozenset()) -> list[tuple[str, np.ndarray]]:
    """The arrays a layer keeps between its passes (its attributes but ``allowed``, and those of the
    helper objects it holds: a Fourier convolution, an activation's implementation), and its params'
    waiting products."""
    found = [item for name, value in vars(layer).items() if name not in ("params", "param_specs", *allowed)
             for item in float_arrays(value, name)]
    for name in ("fourier", "impl", "scratch"):
        helper = getattr(layer, name, None)
        if helper is not None:  # the Fourier route keeps its exact DFT matrices (complex128) to cast once per dtype
            found += [item for key, value in vars(helper).items()
                      if key not in ("params", "param_specs", "_tap_matrices")
                      for item in float_arrays(value, f"{name}.{key}")]
    for param in layer.params:
        found += float_arrays([list(p) for p in param.pending], f"{param.name}.pending")
        found += float_arrays([list(p) for p in param.row_terms], f"{param.name}.row_terms")
    return found


# where a sub-layer sits: the whole batch, rows 2..6 of a batch of 8, units 1..3 of every row
PLACES = {"whole": {}, "rows": {"global_batch": ROWS + 3, "batch_slice": (2, 2 + ROWS)},
          "features": {"feature_slice": (1, 3)}}


def run_case(type_name: str, case: Case, block_rows: int | None, train: bool = True, place: str = "whole") -> list[str]:
    """Forward and backward of one float32 batch; every floating array that is not float32, named."""
    ctx = LayerContext(**{"global_batch": ROWS, "seed": 3, "step": 2, "block_rows": block_rows, **PLACES[place]})
    ctx.allreduce = lambda sums: sums.copy()  # the other rows' workers add nothing
    layer = build(type_name, case.text, case.shapes, ctx)
    inputs = case.inputs()
    if place == "features" and layer.connection == ONE_TO_ONE:  # its source's units lo..hi
        inputs = [x[:, slice(*ctx.feature_slice)] for x in inputs]
    y = layer.forward(inputs, train)
    found = [("output", y)] + float_arrays(layer.aux, "aux")
    if train:
        grad = floats(*y.shape, seed=5) if case.gradient else None
        need = [np.asarray(x).dtype.kind == "f" for x in inputs]
        found += float_arrays(layer.backward(grad, need), "backward")
        found += kept(layer, FLOAT64_KEPT.get(type_name, ()))  # before the gradients are formed: their products
        for param in layer.params:
            param.finish_grad()
            found += [(f"{param.name}.data", param.data), (f"{param.name}.grad", param.grad)]
    return not_float32(found + kept(layer, FLOAT64_KEPT.get(type_name, ())))


def layer_class(type_name: str):
    return LAYERS.select(text_format.Parse(f'name: "l" type: {type_name}', job_pb2.LayerProto()))


def test_every_built_in_layer_type_has_a_case():
    assert set(LAYERS.builtin_names()) - set(PAIRS) - set(CASES) == set(), "add a case for each new layer type"


def applicable(type_name: str, block_rows: int | None, place: str) -> bool:
    """Whether a run can put the layer there: deterministic mode covers only some layers, only some
    layers' features are split, and some layers always run on the whole batch."""
    cls = layer_class(type_name)
    return ((block_rows is None or cls.deterministic) and (place != "features" or cls.feature_partitionable)
            and (place != "rows" or type_name not in WHOLE_BATCH))


PLACED_CASES = [pytest.param(type_name, block_rows, place, id=f"{type_name}-{mode}-{place}")
                for type_name in sorted(CASES) for block_rows, mode in ((None, "default"), (2, "deterministic"))
                for place in sorted(PLACES) if applicable(type_name, block_rows, place)]


@pytest.mark.parametrize("type_name, block_rows, place", PLACED_CASES)
def test_a_float32_batch_stays_float32(type_name, block_rows, place, tmp_path):
    assert run_case(type_name, CASES[type_name](tmp_path), block_rows, place=place) == []


@pytest.mark.parametrize("type_name", sorted(CASES))
def test_a_float32_batch_stays_float32_at_test_time(type_name, tmp_path):
    assert run_case(type_name, CASES[type_name](tmp_path), None, train=False) == []


@pytest.mark.parametrize("block_rows", [None, 2], ids=["default", "deterministic"])
@pytest.mark.parametrize("gaussian", [False, True])
def test_an_rbm_stays_float32_through_contrastive_divergence(gaussian, block_rows):
    ctx = LayerContext(global_batch=ROWS, seed=3, step=2, block_rows=block_rows)
    vis = build("kRBMVis", 'srclayers: "d" srclayers: "hid" rbm_conf { hdim: 3 } '
                'param { name: "w" init { type: kGaussian std: 0.5 } } param { name: "bv" init { type: kGaussian } }',
                [(4,)], ctx)
    hid = build("kRBMHid", f'srclayers: "vis" rbm_conf {{ hdim: 3 gaussian: {str(gaussian).lower()} }} '
                'param { name: "w_" init { type: kConstant } } param { name: "bh" init { type: kGaussian } }',
                [(4,)], ctx)
    hid.params[0] = vis.params[0]  # shared, as share_from makes it
    found = []
    v = vis.compute("positive", [ids(2, ROWS, 4)], True)
    found += [("positive v", v), ("positive h", hid.compute("positive", [v], True))]
    for _ in range(2):  # two Gibbs rounds
        vis.grad = hid.backward(None, [True])[0]
        found += [("message", vis.grad)]
        v = vis.compute("negative", [], True)
        found += [("negative v", v), ("negative h", hid.compute("negative", [v], True))]
    for layer in (vis, hid):
        layer.param_gradients()
        found += kept(layer)
    for param in (*vis.params, hid.params[1]):
        param.finish_grad()
        found += [(f"{param.name}.grad", param.grad)]
    assert not_float32(found) == []


@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("block_rows", [None, 2], ids=["default", "deterministic"])
@pytest.mark.parametrize("type_name", ["kConvolution", "kCConvolution", "kCudnnConv"])
def test_the_fourier_convolution_stays_float32(type_name, block_rows, place, tmp_path, monkeypatch):
    monkeypatch.setattr("singa_mpi.layers.fft_conv.cheaper", lambda *args, **kwargs: True)  # the cost model's choice
    assert run_case(type_name, CASES[type_name](tmp_path), block_rows, place=place) == []
