"""A net of layer instances for one process: build, allocate params, run forward/backward.

The serial net is built from the job for one phase.  The MPI runtime builds the
same :class:`Net` from a rank's part of a partition plan (sub-layers plus
connection layers), so forward/backward below is the one execution engine.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterable

import numpy as np

from singa_mpi.config.load import JobConfig, deterministic_block_rows, layers_for_phase
from singa_mpi.errors import ConfigError, LayerFailure, SingaError
from singa_mpi.graph import Node, is_back_edge, topological_order
from singa_mpi.layers.base import LAYERS, Layer, LayerConfigError, LayerContext, check_shape, layer_class_of
from singa_mpi.params import Param, make_param
from singa_mpi.tracing import NullTracer, Tracer


@dataclasses.dataclass
class Wire:
    """A layer with its sources, as the net runs it."""

    layer: Layer
    srcs: list[Layer]
    kinds: list[str]  # per source: "data" or "aux"
    node: Node | None = None
    needs_grad: bool | None = None  # some parameter at or below this layer; None = derive here


class Net:
    """Layers in execution order, wired to their sources.  An algorithm
    (:mod:`singa_mpi.algorithms`) decides the passes over them."""

    def __init__(self, wires: list[Wire], tracer: Tracer | None = None, names: list[str] | None = None):
        self.wires = wires
        self.tracer = tracer if tracer is not None else NullTracer()
        self.layers = [w.layer for w in wires]
        # the names the step program calls the layers by (a rank's sub-layers: "fc1@0")
        self.names = list(names) if names is not None else [w.layer.name for w in wires]
        self.by_name = dict(zip(self.names, wires))
        self.queue = None  # weight gradients to compute while an exchange travels (set by the runtime)
        self.units = None  # this net's units as its programs see them (set by the runtime; else derived)
        self.program = None  # this net's step program (set by the runtime; else the algorithm's passes)
        self._open: dict[int, object] = {}  # connection layers' backward exchanges in flight: their spans
        self.sending: list[Layer] = []  # connection layers whose sends are under way (the executor's)
        self._wire_by_layer = {id(w.layer): w for w in wires}
        self._mark_needs_grad()
        # which inputs of each wire need a gradient: fixed once the graph is built
        self._need = {id(w.layer): [k == "data" and self.wire_of(s).needs_grad
                                    for s, k in zip(w.srcs, w.kinds)] for w in wires}
        for wire in wires:  # a layer may lay out its forward for what backward will be asked
            wire.layer.input_grads = list(self._need[id(wire.layer)])
        # plugins' layers (selected by user_type) have what they return checked against the layer
        # contract, so that a wrong shape is named at the layer that made it, not at a later one
        self._plugins = {id(w.layer) for w in wires if w.layer.conf.user_type}

    def _mark_needs_grad(self) -> None:
        """Derive needs_grad where the builder did not fix it (the planner fixes it globally)."""
        for wire in self.wires:
            if wire.needs_grad is not None:
                continue
            wire.needs_grad = bool(wire.layer.params) or any(
                self.wire_of(s).needs_grad for s, k in zip(wire.srcs, wire.kinds) if k == "data"
            )

    def wire_of(self, layer: Layer) -> Wire:
        return self._wire_by_layer[id(layer)]

    @property
    def params(self) -> list[Param]:
        """Unique params in first-use order (shared params appear once)."""
        seen: dict[int, Param] = {}
        for layer in self.layers:
            for p in layer.params:
                seen.setdefault(id(p), p)
        return list(seen.values())

    # ---------------------------------------------------------------- one layer at a time
    # Algorithms drive the traversal (which layers, in which order, in which pass);
    # the net runs one layer's pass: gathers its inputs, traces it, names it on failure.
    def run_pass(self, wire: Wire, phase: str, train: bool) -> None:
        """Compute ``wire``'s output for the algorithm's pass ``phase`` ("forward" for BP)."""
        layer = wire.layer
        inputs = self._inputs_of(wire)
        try:
            with self._traced(layer, phase, self.tracer.begin(layer.name, phase)):
                # a pass may read what came down to the layer (an RBM's top-down message); the
                # gradient of the next backward pass starts afresh after it
                layer.data = layer.compute(phase, inputs, train)
                if id(layer) in self._plugins:
                    _check_output(layer, inputs, layer.data)
        finally:
            layer.grad = None

    @contextlib.contextmanager
    def _traced(self, layer: Layer, pass_: str, span):
        """End ``span`` however ``layer``'s ``pass_`` ends; a failure names the layer and the pass in the
        one-line report (the cause stays chained)."""
        try:
            yield
        except LayerFailure:
            raise
        except Exception as err:
            raise LayerFailure(layer.name, pass_, err) from err
        finally:
            self.tracer.end(span)

    def run_backward(self, wire: Wire) -> None:
        """Back-propagate through ``wire``: its input gradients are added to its sources' ``grad``."""
        layer = wire.layer
        with self._traced(layer, "backward", self.tracer.begin(layer.name, "backward")):
            grads = layer.backward(layer.grad, self._need[id(layer)])
            if id(layer) in self._plugins:
                _check_input_grads(layer, self._inputs_of(wire), grads)
        self._add_grads(wire, grads)

    @staticmethod
    def _inputs_of(wire: Wire) -> list:
        return [s.aux if k == "aux" else s.data for s, k in zip(wire.srcs, wire.kinds)]

    def _add_grads(self, wire: Wire, grads) -> None:
        for src, g in zip(wire.srcs, grads):
            if g is None:
                continue
            # the first gradient is taken as is; later ones make a new sum so
            # that no layer's cached array is modified behind its back
            src.grad = g if src.grad is None else src.grad + g

    def start_exchange(self, wire: Wire) -> None:
        """Start a connection layer's backward exchange (non-blocking); :meth:`finish_exchange` ends it."""
        layer = wire.layer
        span = self.tracer.begin(layer.name, "backward")
        try:
            layer.start_backward(layer.grad, self._need[id(layer)])
        except LayerFailure:
            self.tracer.end(span)
            raise
        except Exception as err:
            self.tracer.end(span)
            raise LayerFailure(layer.name, "backward", err) from err
        self._open[id(layer)] = span

    def finish_exchange(self, wire: Wire) -> None:
        """Wait for the exchange :meth:`start_exchange` began; its gradients go to the sources."""
        layer = wire.layer
        with self._traced(layer, "backward", self._open.pop(id(layer))):
            grads = layer.finish_backward()
        self._add_grads(wire, grads)

    def run_queued(self) -> None:
        """The queued weight-gradient products (while an exchange is in flight)."""
        if self.queue is not None:
            self.queue.run(self.poll_sends)

    def poll_sends(self) -> None:
        """Move the sends under way on (between layers and GEMMs): a large message leaves only while
        its sender calls the MPI library, and its receiver, the next stage, waits for it."""
        if self.sending:
            self.sending = [layer for layer in self.sending if not layer.poll()]

    def step_units(self):
        """This net's units for its programs (the runtime's, or derived from the layers)."""
        if self.units is None:
            from singa_mpi.program.units import units_of_net

            self.units = units_of_net(self)
        return self.units

    def run_param_gradients(self, wire: Wire) -> None:
        """Let ``wire``'s layer add its param gradients from what its passes kept (CD)."""
        layer = wire.layer
        with self._traced(layer, "gradients", self.tracer.begin(layer.name, "gradients")):
            layer.param_gradients()

    def set_step(self, step: int) -> None:
        """Tell every layer the training step (random masks and readers key on it)."""
        for layer in self.layers:
            layer.ctx.step = step

    def zero_grads(self) -> None:
        for p in self.params:
            p.zero_grad()

    def finish_grads(self) -> None:
        """After backward: the queued weight gradients (moving the last sends on between them), and
        params that got no gradient this step hold an explicit zero."""
        self.run_queued()
        for p in self.params:
            p.finish_grad()

    def close_files(self) -> None:
        """Close the files layers write (output layers).  Local, no communication:
        safe on any exit path, an error on one rank included."""
        for layer in self.layers:
            close = getattr(layer, "close_files", None)
            if close is not None:
                close()

    def collect_metrics(self) -> dict[str, float]:
        """Per-key sums of all loss/output layers' metrics since the last call.

        Each metric ``k`` comes with its row count ``k/count``; see ``trainer.summarize``."""
        total: dict[str, float] = {}
        for layer in self.layers:
            for key, value in layer.metrics().items():
                total[key] = total.get(key, 0.0) + float(value)
        return total


# ------------------------------------------------------------------ building

def _check_output(layer: Layer, inputs: list, out) -> None:
    """A plugin layer's output: a float32 array with its first input's rows (an input layer: its
    own), then the shape its setup returned (this worker's features of it): ValueError if not."""
    per_row = tuple(layer.local_out_shape())
    if not isinstance(out, np.ndarray) or out.ndim == 0:
        raise ValueError(f"returned {type(out).__name__}: expected a numpy array of rows of {per_row}")
    first = inputs[0] if inputs else None
    rows = first.shape[0] if isinstance(first, np.ndarray) and first.ndim else out.shape[0]
    if out.shape != (rows, *per_row):
        split = ", this worker's features of it" if layer.ctx.feature_slice else ""
        raise ValueError(f"returned an array of shape {out.shape}: expected {(rows, *per_row)} (its input's rows, "
                         f"then the shape its setup returned{split})")
    if out.dtype != np.float32:
        raise ValueError(f"returned {out.dtype} values: expected float32 (the layer contract)")


def _check_input_grads(layer: Layer, inputs: list, grads) -> None:
    """A plugin layer's backward: one gradient (or None) per source, each of its input's shape."""
    if not isinstance(grads, (list, tuple)) or len(grads) != len(inputs):
        raise ValueError(f"backward returned {type(grads).__name__}"
                         f"{f' of {len(grads)}' if isinstance(grads, (list, tuple)) else ''}: expected a list of "
                         f"{len(inputs)} input gradient(s), None where `need` is False")
    for k, (grad, x) in enumerate(zip(grads, inputs)):
        if grad is not None and (not isinstance(grad, np.ndarray) or grad.shape != np.shape(x)):
            got = f"shape {grad.shape}" if isinstance(grad, np.ndarray) else type(grad).__name__
            raise ValueError(f"backward returned a gradient of {got} for input {k}: expected shape {np.shape(x)}")


def supported_layer_types() -> list[str]:
    """Every implemented layer type name, sorted (for messages that list the valid ones)."""
    return LAYERS.names()


def describe(cfg: JobConfig, node: Node) -> str:
    return f"layer '{node.name}' (#{node.index}, {node.type_name})"


def layer_error(cfg: JobConfig, node: Node, field: str, value, expected: str) -> ConfigError:
    """One-line ConfigError: FILE:LINE:COL: layer 'x' (#i, kType): field = value: expected ..."""
    where = cfg.layer_where(node.index, *field.split(".")) if field else cfg.layer_where(node.index)
    return ConfigError(f"{where}: {describe(cfg, node)}: {field} = {value}: expected {expected}")


def phase_nodes(cfg: JobConfig, phase: str) -> list[Node]:
    return [Node(i, conf) for i, conf in layers_for_phase(cfg.proto, phase)]


def instantiate(cfg: JobConfig, nodes: list[Node], make_ctx: Callable[[Node], LayerContext]
                ) -> list[tuple[Node, Layer, list[str]]]:
    """Create and set up the layers of ``nodes`` in topological order.

    Returns (node, layer, source kinds).  Every problem is a one-line ConfigError.
    """
    done: dict[str, Layer] = {}
    built = []
    for node in topological_order(nodes):
        cls = layer_class_of(node.conf)
        layer = cls(node.conf, make_ctx(node))
        srcs = [done[s] for s in node.conf.srclayers if s in done]
        kinds = list(cls.input_kinds) or ["data"] * len(srcs)
        shapes = [s.out_shape if k == "data" else () for s, k in zip(srcs, kinds)]
        set_up(cfg, node, layer, shapes)
        done[node.name] = layer
        built.append((node, layer, kinds))
    return built


def set_up(cfg: JobConfig, node: Node, layer: Layer, src_shapes: list) -> None:
    """``layer.setup(src_shapes)`` into ``layer.out_shape``, checked: a config error is one line at
    the layer's field; a plugin's bug (an exception, a shape that is no shape) one line at its place
    in the job."""
    try:
        shape = layer.setup(src_shapes)
        if shape is None or len(shape):  # () for a layer with no output of its own (a loss)
            check_shape("setup returned", shape)
        layer.out_shape = tuple(shape)
    except LayerConfigError as err:
        raise layer_error(cfg, node, err.field, err.value, err.expected) from None
    except SingaError:
        raise
    except Exception as err:  # a plugin's own bug, say: named with the layer's place in the job
        raise LayerFailure(node.name, "setup", err, where=cfg.layer_where(node.index)) from err


def global_batch_size(cfg: JobConfig, nodes: Iterable[Node]) -> int:
    """The batch size of the phase's input layers (the validator checks they agree)."""
    for node in nodes:
        store = node.conf.store_conf
        if node.conf.HasField("store_conf") and store.batchsize:
            return int(sum(store.batchsize)) if len(store.batchsize) > 1 else int(store.batchsize[0])
        if node.conf.HasField("sharddata_conf") and node.conf.sharddata_conf.batchsize > 0:  # SINGA 0.1
            return int(node.conf.sharddata_conf.batchsize)
        if node.type_name == "kCharRNN":  # char-rnn's reader (kCharRNNOutput's char_rnn_conf has no batch)
            return int(node.conf.char_rnn_conf.batchsize)
        # a plugin's input layer (an unknown type is the validator's to report, with its line)
        declared = layer_class_of(node.conf).batch_field(node.conf) if node.type_name in LAYERS else None
        if declared is not None:
            return int(declared[1])
    return 1


def allocate_params(layers: list[Layer], seed: int, shared: dict[str, Param]) -> None:
    """Create each layer's params from its specs; ``share_from`` and other phases reuse ``shared``.

    Owners are created first so that a param may share from one declared later in the file.
    """
    specs = [(layer, spec) for layer in layers for spec in layer.param_specs]
    for layer, spec in specs:
        if not spec.conf.share_from and spec.conf.name not in shared:
            shared[spec.conf.name] = make_param(spec.conf, spec.logical_shape, spec.shard, seed)
    for layer in layers:
        layer.params = []
        for spec in layer.param_specs:
            name = spec.conf.share_from or spec.conf.name
            layer.params.append(shared[name])


def build_serial_net(cfg: JobConfig, phase: str, seed: int, workspace: str,
                     shared: dict[str, Param], tracer: Tracer | None = None) -> Net:
    """The whole net of ``phase`` in one process (no partitioning)."""
    nodes = phase_nodes(cfg, phase)
    batch = global_batch_size(cfg, nodes)
    block_rows = deterministic_block_rows(cfg.proto, batch)  # the blocks a plan of any rank count cuts

    def make_ctx(node: Node) -> LayerContext:
        return LayerContext(global_batch=batch, seed=seed, workspace=workspace, phase=phase, block_rows=block_rows)

    built = instantiate(cfg, nodes, make_ctx)
    by_name = {node.name: layer for node, layer, _ in built}
    allocate_params([layer for _, layer, _ in built], seed, shared)
    nodes_by_name = {node.name: node for node, _, _ in built}
    # a declared back edge (an RBM's hidden -> visible) is no input: the algorithm carries it
    wires = [Wire(layer, [by_name[s] for s in node.conf.srclayers if not is_back_edge(nodes_by_name[s], node)],
                  kinds, node)
             for node, layer, kinds in built]
    return Net(wires, tracer)

