"""A kernel as data, and copies of it that run beside it while it is timed (see :mod:`.kernels`).

A :class:`KernelSpec` is what it takes to build one sub-layer on random inputs of its local shapes:
its layer conf, context, source shapes and params.  It pickles, so that a co-runner can build the
same kernel.  Co-runners are fresh Python processes (``python -m singa_mpi.cost.corunners``), started
once per :class:`CoRunners` and fed specs over a pipe.  They are new programs, not forks: a process
that has initialised MPI (a launched job choosing ``partition_dim: auto``) may start them, where
forking it is not safe.  They run with the launcher's variables removed, so that nothing in them
takes itself for an MPI rank, and with the parent's BLAS threads.  They load the plugins the parent
loaded (:func:`singa_mpi.plugins.portable_specs`, given as arguments): a plugin's layer builds there too.

The protocol, one co-runner per pipe pair: the parent sends ``("run", spec)``; the child builds the
kernel, answers ``R`` and runs forward and backward over and over until the next message, ``("stop",)``,
which it answers with ``D``.  ``("exit",)`` or the end of its input ends it (so a co-runner never
outlives its parent).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import weakref

import numpy as np

from singa_mpi import plugins
from singa_mpi.errors import SingaError, one_line
from singa_mpi.layers.base import LayerContext, layer_class_of
from singa_mpi.params import make_param
from singa_mpi.proto import job_pb2

# Variables by which MPI launchers tell a process it is a rank: a co-runner must not inherit them
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCAL", "I_MPI_", "MPICH_", "UCX_", "PRTE_")
READY, DONE = b"R", b"D"
ANSWER_SECONDS = 120  # a co-runner that neither builds its kernel nor stops in this time has failed


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """Protos travel serialised (the generated classes' module is not importable by its own name)."""

    conf_bytes: bytes  # the LayerProto
    context: dict  # LayerContext's fields but the workspace
    src_shapes: tuple
    owner_bytes: dict  # name -> the ParamProto that owns it, for each param the layer declares or shares
    inputs: tuple  # ("data" | "aux", shape) per source
    need: tuple  # whether each input's gradient is wanted (as Net decides)
    train: bool
    trains: bool  # whether backward runs (train phase and a sub-layer that needs gradients)
    name: str = ""  # the sub-layer's, for messages


class Kernel:
    """One sub-layer built from its spec, on fixed random inputs it accepts (``Layer.example_input``; a
    loss's labels 0): ``forward``, ``backward``, ``step``."""

    def __init__(self, spec: KernelSpec, workspace: str):
        self.spec = spec
        conf = job_pb2.LayerProto.FromString(spec.conf_bytes)
        layer = layer_class_of(conf)(conf, LayerContext(workspace=workspace, **spec.context))
        layer.out_shape = tuple(layer.setup(list(spec.src_shapes)))
        owners = {name: job_pb2.ParamProto.FromString(data) for name, data in spec.owner_bytes.items()}
        layer.params = [make_param(owners[param.conf.share_from or param.conf.name], param.logical_shape,
                                   param.shard, 1) for param in layer.param_specs]
        layer.input_grads = list(spec.need)
        rng = np.random.default_rng(0)
        self.inputs = [np.zeros(shape[:1], np.int32) if kind == "aux"  # labels: one per row
                       else layer.example_input(index, shape, rng) for index, (kind, shape) in enumerate(spec.inputs)]
        self.layer = layer
        out = self.forward()
        self.grad = None if out is None or out.dtype.kind != "f" else np.ones_like(out)
        if spec.trains:
            self.backward()

    def forward(self) -> np.ndarray:
        return self.layer.compute("forward", self.inputs, self.spec.train)

    def backward(self) -> None:  # with the weight-gradient products a runtime may defer (Param.pending)
        self.input_gradients()
        self.weight_products()

    def input_gradients(self) -> None:
        """The backward up to its weight-gradient products, which wait in the params (Param.pending)."""
        for param in self.layer.params:
            param.zero_grad()
        self.layer.backward(self.grad, list(self.spec.need))

    def weight_products(self) -> None:
        """The weight-gradient products :meth:`input_gradients` left waiting."""
        for param in self.layer.params:
            param.finish_grad()

    def step(self) -> None:
        self.forward()
        if self.spec.trains:
            self.backward()


class CoRunnerError(SingaError):
    pass


class CoRunners:
    """``copies`` co-runner processes, started on first use; :meth:`alongside` runs a spec in all of them."""

    def __init__(self, copies: int, blas_threads: int = 1):
        self.copies, self.blas_threads = copies, blas_threads
        self.processes: list[subprocess.Popen] = []

    def _start(self) -> None:
        env = corunner_environment(os.environ, self.blas_threads)
        command = [sys.executable, "-m", "singa_mpi.cost.corunners", *plugins.portable_specs()]
        self.processes = [subprocess.Popen(command, env=env,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                          for _ in range(self.copies)]
        weakref.finalize(self, _release, list(self.processes))  # dropped without close(): they end too

    @contextlib.contextmanager
    def alongside(self, spec: KernelSpec):
        """The block runs while every co-runner runs ``spec``'s kernel."""
        if self.copies <= 0:
            yield
            return
        if not self.processes:
            self._start()
        for process in self.processes:
            _send(process.stdin.fileno(), ("run", spec))
        self._answers(READY, f"building {spec.name}")
        try:
            yield
        except BaseException:
            # Interrupted (Ctrl-C, or SIGTERM, which `timeout` sends to the co-runners too) or failed:
            # the co-runners' answers no longer matter, and waiting for them would replace this
            # exception with a CoRunnerError (a benchmark cut short then lost the table it reports).
            self.kill()
            raise
        for process in self.processes:
            _send(process.stdin.fileno(), ("stop",))
        self._answers(DONE, f"stopping {spec.name}")

    def _answers(self, expected: bytes, doing: str) -> None:
        for process in self.processes:
            ready, _, _ = select.select([process.stdout], [], [], ANSWER_SECONDS)
            answer = os.read(process.stdout.fileno(), 1) if ready else b""
            if answer != expected:
                self.close()
                raise CoRunnerError(f"a kernel co-runner failed while {doing} "
                                    f"({'no answer' if not ready else 'it exited'}; its error, if any, is above)")

    def kill(self) -> None:
        """End the co-runners now, whatever they are running (the next :meth:`alongside` starts new ones)."""
        for process in self.processes:
            with contextlib.suppress(OSError):
                process.kill()
            process.wait()
            with contextlib.suppress(OSError):
                process.stdin.close()
                process.stdout.close()
        self.processes = []

    def close(self) -> None:
        for process in self.processes:
            with contextlib.suppress(OSError):  # it may have exited already
                _send(process.stdin.fileno(), ("exit",))
            with contextlib.suppress(OSError):
                process.stdin.close()
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            process.stdout.close()
        self.processes = []


def _release(processes: list[subprocess.Popen]) -> None:
    """Close the co-runners' input: each exits at the end of it."""
    for process in processes:
        with contextlib.suppress(OSError, ValueError):
            process.stdin.close()


def corunner_environment(environ, blas_threads: int) -> dict[str, str]:
    """The parent's environment without the launcher's variables, with its BLAS threads."""
    env = {name: value for name, value in environ.items() if not name.startswith(LAUNCHER_PREFIXES)}
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(blas_threads)
    return env


def _send(fd: int, message) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    os.write(fd, struct.pack("<Q", len(payload)) + payload)


def _receive(fd: int):
    """The next message, or None at the end of the input."""
    head = _read_exactly(fd, 8)
    if head is None:
        return None
    payload = _read_exactly(fd, struct.unpack("<Q", head)[0])
    return None if payload is None else pickle.loads(payload)


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _waiting(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def main(plugin_specs: list[str]) -> int:
    """A co-runner: load the parent's plugins, then build each kernel it is sent and run it until told
    to stop."""
    try:
        plugins.load_entry_points()
        for spec in plugin_specs:
            plugins.load(spec, "--plugin")
    except SingaError as err:  # the parent then says which kernel it could not build
        print(f"singa-mpi: kernel co-runner: {one_line(str(err))}", file=sys.stderr, flush=True)
        return err.exit_code
    inbox, outbox = sys.stdin.fileno(), sys.stdout.fileno()
    with tempfile.TemporaryDirectory(prefix="singa_mpi_corunner_") as workspace:
        while True:
            message = _receive(inbox)
            if message is None or message[0] != "run":
                return 0
            kernel = Kernel(message[1], workspace)
            os.write(outbox, READY)
            while not _waiting(inbox):
                kernel.step()
            message = _receive(inbox)
            os.write(outbox, DONE)
            if message is None or message[0] != "stop":
                return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
