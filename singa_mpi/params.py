"""Parameters: their values, gradients, init methods and sharding.

A :class:`Param` holds this sub-layer's shard of a logical parameter.  Values
are initialised from the *logical* (unsharded) array, drawn from a random
stream keyed by (seed, param name), and then sliced, so every partitioning of
a job starts from exactly the numbers the serial run starts from.
"""
from __future__ import annotations

import zlib
from typing import Callable

import numpy as np

from singa_mpi.proto import job_pb2
from singa_mpi.registry import Registry, selected_name

Shape = tuple[int, ...]


def keyed_rng(seed: int, name: str, *key: int) -> np.random.Generator:
    """A random stream determined by (seed, name, *key) alone: no rank, no call order."""
    return np.random.default_rng([seed & 0xFFFFFFFFFFFF, zlib.crc32(name.encode()), *key])


class Param:
    """One parameter shard.

    name:          the param's name (unique in the job).
    logical_shape: the unpartitioned shape.
    shard:         ((lo, hi), ...) per axis: which part of the logical array this is.
    data, grad:    float32 arrays of the shard's shape; ``grad`` accumulates.  Products ``a @ b``
                   added by several users (the copies of an unrolled layer, tied weights) wait
                   until ``grad`` is read and are then summed as one GEMM over all of them
                   ([a1 a2 ...] @ [b1; b2; ...]): one large product instead of many small ones.
    factors:       None, or where a runtime collects this shard's gradient as factors
                   (``record(a, b)`` for grad = a @ b, ``clear()`` for a zero gradient)
                   instead of computing it here; ``grad`` is then None (see
                   :mod:`singa_mpi.sync.shared_memory`).
    queue:         None, or a :class:`GradientQueue` that holds this param's products
                   ``a @ b`` until a runtime has communication to hide them behind.
    row_terms:     deterministic mode: the step's per-row terms ``(left, right)`` (``add_rows``),
                   formed into ``grad`` by :func:`form_rows` when it is read;
                   a sync strategy first puts every worker's rows in (the whole batch's).
    rows_gathered: a sync strategy gathers this param's rows from every worker (deterministic mode):
                   ``finish_grad`` leaves them for it.
    """

    def __init__(self, conf: job_pb2.ParamProto, logical_shape: Shape, shard: tuple[tuple[int, int], ...]):
        self.conf = conf
        self.name = conf.name
        self.logical_shape = tuple(logical_shape)
        self.shard = tuple(shard)
        shape = tuple(hi - lo for lo, hi in self.shard)
        self.data = np.zeros(shape, np.float32)
        self._grad = np.zeros(shape, np.float32)
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []  # products a @ b not yet in grad
        self.lr_scale = conf.lr_scale
        self.wd_scale = conf.wd_scale
        self.fresh = False  # True after zero_grad: the next contribution overwrites instead of adding
        self.factors = None
        self.queue: GradientQueue | None = None
        self.row_terms: list[tuple[np.ndarray, np.ndarray | None]] = []
        self.rows_gathered = False
        self.from_checkpoint = False  # no init: its values must come from checkpoint_path

    def region(self) -> tuple:
        """Where this array sits in the logical param: ("nd", shard) (checkpoints)."""
        return ("nd", self.shard)

    def shard_index(self) -> tuple[slice, ...]:
        return tuple(slice(lo, hi) for lo, hi in self.shard)

    @property
    def grad(self) -> np.ndarray | None:
        if self.pending:
            self._flush()
        if self.row_terms:
            self._form_rows()
        return self._grad

    @grad.setter
    def grad(self, value: np.ndarray | None) -> None:
        self.pending = []
        self._grad = value

    def add_rows(self, left: np.ndarray, right: np.ndarray | None = None) -> None:
        """Deterministic mode: grad += leftᵀ·right over the rows (an inner product's weight), or the
        column sums of ``left``, each row as many numbers as the gradient (a bias; a convolution's
        per-block gradients, one row per block).  Kept as the rows themselves until the gradient is read, so
        that a sync strategy can put the whole batch's rows in first: the gradient is then one fixed
        computation over the batch, whichever worker computed which rows."""
        self.row_terms.append((left, right))

    def _form_rows(self) -> None:
        terms, self.row_terms = self.row_terms, []
        if self.fresh:
            form_terms(terms, self._grad)
            self.fresh = False
            return
        term = np.empty_like(self._grad)
        for left, right in terms:
            form_rows(left, right, term)
            self._grad += term

    def _flush(self) -> None:
        """The pending products as one GEMM (a single one as it is: the result is then bitwise what
        adding it at once gives)."""
        items, self.pending = self.pending, []
        if len(items) == 1:
            self.accumulate(*items[0])
            return
        a = np.concatenate([a for a, _ in items], axis=1)  # (rows of grad, sum of the inner dims)
        b = np.concatenate([b for _, b in items], axis=0)
        self.accumulate(a, b)

    def zero_grad(self) -> None:
        """Start a new gradient.  Lazy: the first ``add_grad`` writes instead of adding,
        which saves a pass over memory and a temporary per parameter each step."""
        self.pending = []
        self.row_terms = []
        self.fresh = True

    def add_grad(self, a: np.ndarray, b: np.ndarray | None = None) -> None:
        """grad += a (or a @ b, computed straight into grad when it is the first contribution)."""
        if self.factors is not None:
            if not self.fresh or b is None:
                raise RuntimeError(f"param {self.name!r} collects its gradient as factors: expected one "
                                   f"add_grad(a, b) per step, got {'a second one' if not self.fresh else 'a dense one'}")
            self.factors.record(a, b)
            self.fresh = False
        elif b is not None and self.queue is not None:
            self.queue.push(self, a, b)
        elif b is not None:
            self.pending.append((a, b))  # a, b: the layer's arrays, untouched until the next step
        else:
            self.accumulate(a)

    def accumulate(self, a: np.ndarray, b: np.ndarray | None = None) -> None:
        """grad += a (or a @ b) now (after the pending products)."""
        if self.pending:
            self._flush()
        if self.fresh:
            if b is None:
                np.copyto(self._grad, a)
            else:
                np.matmul(a, b, out=self._grad)
            self.fresh = False
        elif b is None:
            self._grad += a
        else:
            gemm_add(a, b, self._grad)

    def grad_for_scatter(self) -> np.ndarray:
        """The gradient array for in-place scatter-adds (zeroed first if nothing was added yet)."""
        self.finish_grad()
        return self.grad

    def finish_grad(self) -> None:
        """Complete this step's gradient: queued products computed, and a gradient
        that received no contribution an explicit zero."""
        if self.queue is not None:
            self.queue.run()
        if self.pending:
            self._flush()
        if self.rows_gathered:
            return  # the sync strategy forms it from every worker's rows
        if self.row_terms:
            self._form_rows()
        if self.fresh:
            if self.factors is not None:
                self.factors.clear()
            else:
                self.grad.fill(0.0)
            self.fresh = False

    def __repr__(self) -> str:
        return f"Param({self.name!r}, shape={self.data.shape}, logical={self.logical_shape})"


GRADIENT_TILE_ROWS = 128  # rows of a gradient formed by one GEMM in deterministic mode (see gradient_tiles)


def gradient_tiles(shape: Shape, paired: bool = True) -> list[tuple[int, int]]:
    """Deterministic mode's canonical tiles of a gradient formed from per-row terms: row ranges of
    ``GRADIENT_TILE_ROWS`` of a 2-D gradient formed as leftᵀ·right (``paired``), fixed by the shape
    alone; the whole gradient for column sums (a bias, a convolution's per-block terms).  A GEMM of
    one tile's shape gives the same bits wherever it runs, so workers can each form some tiles and
    exchange them; a run on one worker forms the same tiles (a GEMM over a subset of rows is not bitwise
    those rows of the whole product, so the tiles are the computation everywhere)."""
    if not paired or len(shape) != 2:
        return [(0, shape[0] if shape else 1)]
    return [(lo, min(lo + GRADIENT_TILE_ROWS, shape[0])) for lo in range(0, shape[0], GRADIENT_TILE_ROWS)]


def form_rows(left: np.ndarray, right: np.ndarray | None, out: np.ndarray,
              tiles: list[tuple[int, int]] | None = None) -> None:
    """out = leftᵀ·right (rows × any, rows × any), or the column sums of ``left`` without ``right``:
    deterministic mode's one computation of a gradient from its per-row terms, tile by tile
    (:func:`gradient_tiles`; ``tiles``: only those, the rest of ``out`` untouched).  The operands are
    made C-contiguous first (left transposed), so that each BLAS call (its shapes, strides and
    transposition flags) is the same whether the rows are a worker's own or gathered from every
    worker: the same call on the same numbers gives the same bits (``tests/layers/test_deterministic.py``
    checks that the BLAS in use does)."""
    if right is None:  # rows as wide as ``out`` has entries (a bias, or a convolution's per-block terms)
        np.add.reduce(np.ascontiguousarray(left), axis=0, out=out.reshape(-1))
        return
    left_t, right = np.ascontiguousarray(left.T), np.ascontiguousarray(right)
    for lo, hi in gradient_tiles(out.shape) if tiles is None else tiles:
        np.matmul(left_t[lo:hi], right, out=out[lo:hi])


def form_terms(terms: list[tuple[np.ndarray, np.ndarray | None]], out: np.ndarray,
               tiles: list[tuple[int, int]] | None = None) -> None:
    """out = the gradient of every set of terms (an unrolled layer's uses), formed one set after the
    other and added in that order; ``tiles`` as for :func:`form_rows`."""
    form_rows(*terms[0], out, tiles)
    if len(terms) > 1:
        term = np.empty_like(out)
        for left, right in terms[1:]:
            form_rows(left, right, term, tiles)
            for lo, hi in [(0, out.shape[0])] if right is None or tiles is None else tiles:
                out[lo:hi] += term[lo:hi]


def gemm_add(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out += a @ b in one pass over ``out`` (BLAS ?gemm with beta 1): numpy's ``out += a @ b`` writes the
    product to a temporary and adds it, two more passes over a gradient of tens of MB (a pipeline's
    micro-batches add their weight gradients so).  numpy's way where BLAS cannot take the arrays."""
    gemm = _gemm_for(out.dtype) if out.flags.c_contiguous and a.dtype == b.dtype == out.dtype else None
    if gemm is None:
        out += a @ b
        return
    # out (m, n) in C order is out.T (n, m) in Fortran order: out.T += b.T @ a.T
    x, trans_x = _fortran(b.T)
    y, trans_y = _fortran(a.T)
    gemm(1.0, x, y, beta=1.0, c=out.T, trans_a=trans_x, trans_b=trans_y, overwrite_c=1)


def _fortran(x: np.ndarray) -> tuple[np.ndarray, int]:
    """(array, trans): ``array`` in Fortran order, ``op(array)`` equal to ``x``."""
    if x.flags.f_contiguous:
        return x, 0
    if x.flags.c_contiguous:
        return x.T, 1
    return np.asfortranarray(x), 0


_GEMM: dict = {}


def _gemm_for(dtype: np.dtype):
    if not _GEMM:
        from scipy.linalg.blas import dgemm, sgemm

        _GEMM.update({np.dtype(np.float32): sgemm, np.dtype(np.float64): dgemm})
    return _GEMM.get(np.dtype(dtype))


class GradientQueue:
    """Weight-gradient products ``a @ b`` waiting to be computed.

    During backward, a layer's ``add_grad(a, b)`` on a param with a queue only
    records the product; the runtime computes the queued products while one of
    its non-blocking exchanges is in flight (and ``Param.finish_grad`` computes
    whatever is left), so that time another rank would have spent waiting for
    this one, or this one for the data, goes into GEMMs.  ``a`` and ``b`` are the
    layer's cached arrays, untouched until the next step's forward and backward.
    """

    def __init__(self) -> None:
        self.items: list[tuple[Param, np.ndarray, np.ndarray]] = []

    def push(self, param: Param, a: np.ndarray, b: np.ndarray) -> None:
        self.items.append((param, a, b))

    def run(self, between: Callable[[], None] | None = None) -> None:
        """Every queued product, those of one param as one GEMM over all their rows
        ([a1 a2 ...] @ [b1; b2; ...]: a pipeline's micro-batches add their weight gradients at the
        whole batch's GEMM speed; a single product as it is); ``between``: called before each GEMM."""
        items, self.items = self.items, []
        by_param: dict[int, list[tuple[Param, np.ndarray, np.ndarray]]] = {}
        for item in items:
            by_param.setdefault(id(item[0]), []).append(item)
        for queued in by_param.values():
            if between is not None:
                between()
            param = queued[0][0]
            if len(queued) == 1:
                param.accumulate(queued[0][1], queued[0][2])
            else:
                param.accumulate(np.concatenate([a for _, a, _ in queued], axis=1),
                                 np.concatenate([b for _, _, b in queued], axis=0))


# ---------------------------------------------------------------- init methods

InitFn = Callable[[job_pb2.ParamGenProto, Shape, np.random.Generator], np.ndarray]
INITS: Registry[InitFn] = Registry("init method", "init.type")


def _scaled(gen: job_pb2.ParamGenProto, values: np.ndarray) -> np.ndarray:
    # SINGA multiplies random values by `value` only when it is not the default 1.
    return values * gen.value if gen.value != 1 else values


def _fan_in(shape: Shape) -> int:
    # SINGA: fan_in = shape[1] for 2-D params; a vector's fan_in is its length.
    return shape[1] if len(shape) > 1 else shape[0]


@INITS.register("kConstant")
def _constant(gen, shape, rng):
    return np.full(shape, gen.value, np.float64)


@INITS.register("kGaussian")
def _gaussian(gen, shape, rng):
    return _scaled(gen, rng.normal(gen.mean, gen.std, shape))


@INITS.register("kUniform")
def _uniform(gen, shape, rng):
    return _scaled(gen, rng.uniform(gen.low, gen.high, shape))


@INITS.register("kGaussianSqrtFanIn")
def _gaussian_sqrt_fan_in(gen, shape, rng):
    return _scaled(gen, rng.normal(gen.mean, gen.std, shape)) / np.sqrt(_fan_in(shape))


@INITS.register("kUniformSqrtFanIn")
def _uniform_sqrt_fan_in(gen, shape, rng):
    return _scaled(gen, rng.uniform(gen.low, gen.high, shape)) / np.sqrt(_fan_in(shape) / 3.0)


@INITS.register("kUniformSqrtFanInOut")
def _uniform_sqrt_fan_in_out(gen, shape, rng):
    fan_out = shape[0]
    return _scaled(gen, rng.uniform(gen.low, gen.high, shape)) / np.sqrt(_fan_in(shape) + fan_out)


_GAUSSIAN = ("kGaussian", "kGaussianSqrtFanIn")
_UNIFORM = ("kUniform", "kUniformSqrtFanIn", "kUniformSqrtFanInOut")


def init_value_problem(gen: job_pb2.ParamGenProto) -> tuple[str, str] | None:
    """(field, what was expected) when a built-in init method's numbers cannot draw (a negative
    standard deviation, low above high); None when they can.  A plugin's methods check their own."""
    if gen.HasField("user_type"):
        return None
    name = selected_name(gen)
    if name in _GAUSSIAN and gen.std < 0:
        return "std", "a standard deviation >= 0"
    if name in _UNIFORM and gen.low > gen.high:
        return "low", f"low <= high (high is {gen.high:g})"
    return None


def init_method_name(conf: job_pb2.ParamProto) -> str:
    return selected_name(conf.init)


def init_method(conf: job_pb2.ParamProto) -> InitFn:
    """The init method ``conf.init`` selects; ConfigError (``init.type`` / ``init.user_type = ...``) otherwise."""
    return INITS.select(conf.init, where="init.")


def logical_init(conf: job_pb2.ParamProto, shape: Shape, seed: int) -> np.ndarray:
    """The whole (unsharded) initial value of a param, as float32; ConfigError for an unknown init method."""
    init = init_method(conf)
    rng = keyed_rng(seed, conf.name)
    return np.asarray(init(conf.init, tuple(shape), rng), np.float32)


def make_param(conf: job_pb2.ParamProto, logical_shape: Shape, shard, seed: int) -> Param:
    """Allocate a shard and fill it with its part of the logical initial value.

    A param without ``init`` (SINGA: values only from ``checkpoint_path``, as in a stacked
    RBM's lower layers) starts at zero and is marked ``from_checkpoint``: loading the job's
    checkpoints must fill it."""
    param = Param(conf, logical_shape, shard)
    if conf.HasField("init"):
        param.data[...] = logical_init(conf, logical_shape, seed)[param.shard_index()]
    else:
        param.from_checkpoint = True
    return param
