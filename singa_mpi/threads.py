"""How many BLAS threads a rank uses: chosen from its cores and the ranks beside it, set with threadpoolctl.

Rules, measured on a 2-core VM with ``scripts/bench_threads.py`` (it prints the table):

* The user's ``OMP_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS`` / ``MKL_NUM_THREADS`` win: nothing is
  changed when one of them is set (their count is the BLAS's own variable's, else OMP_NUM_THREADS's).
* Otherwise numpy's BLAS (the GEMMs) gets ``cores // ranks`` threads, where ``cores`` is the CPU set
  this process may run on (``os.sched_getaffinity``) and ``ranks`` the ranks that share it: those the
  launcher started on this node, unless it bound each rank to cores of its own (Open MPI's default
  ``--bind-to core`` for 2 ranks, ``--bind-to socket`` beyond; :func:`sharing_ranks`).  Serially that is
  a thread per core.
* Deterministic mode: one thread (:func:`work_per_step`), whatever the cores.
* Except for small nets: below ``SMALL_WORK`` multiply-adds per forward pass and worker (the default
  job: 3.2 million; mnist_mlp 770 million, the CIFAR-10 convnet 1.1 billion) a step spends little in
  BLAS, so a second thread gains little (0.42 vs 0.45 ms a step, the fastest of 5 runs) and costs
  much when other processes share the cores (0.75 vs 0.47 ms, the median): one thread.
* A BLAS that scipy bundles besides numpy's (pip wheels: ``scipy.libs/libscipy_openblas``; the updaters
  call its ``saxpy``) gets one thread.  Two OpenBLAS thread pools that take turns keep each other's
  spinning threads off the cores: with both at two threads the default job ran 15-20x slower.

The limits are set with threadpoolctl once the libraries are loaded (an environment variable set after
``import numpy`` changes nothing): by the launcher around a `train` or `test` run, once it knows the job,
and by the CLI around `data`; they are undone when the run returns.
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
import os
from typing import Callable, Iterator, Mapping

# the BLAS's own variable first: OpenBLAS (numpy's wheels) and MKL read theirs before OMP_NUM_THREADS
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
LOCAL_RANK_COUNTS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
SMALL_WORK = 1e8  # multiply-adds per forward pass and worker below which one BLAS thread is used


def _count(value: str | None) -> int | None:
    """The leading positive integer of ``"4"``, ``"4,2"`` (OpenMP's nested form) or ``"2(x3)"`` (Slurm)."""
    digits = ""
    for char in (value or "").strip():
        if not char.isdigit():
            break
        digits += char
    return int(digits) if digits and int(digits) > 0 else None


def user_threads(env: Mapping[str, str]) -> int | None:
    """The thread count the user set in the environment, as the BLAS reads it (OPENBLAS_NUM_THREADS=2
    with OMP_NUM_THREADS=1: two threads), or None."""
    for name in THREAD_VARIABLES:
        count = _count(env.get(name))
        if count is not None:
            return count
    return None


def _set_above(env: Mapping[str, str], share: int) -> list[str]:
    """The thread variables the user set above ``share`` (OMP_NUM_THREADS when none: the usual one)."""
    return [name for name in THREAD_VARIABLES if (_count(env.get(name)) or 0) > share] or ["OMP_NUM_THREADS"]


def local_ranks(env: Mapping[str, str]) -> int:
    """How many ranks the MPI launcher (MPICH/Intel MPI hydra, Open MPI, Slurm) started on this node."""
    for name in LOCAL_RANK_COUNTS:
        count = _count(env.get(name))
        if count is not None:
            return count
    return 1


def world_rank(env: Mapping[str, str]) -> int:
    """This process's rank as the launcher numbered it (0 when not launched by one)."""
    for name in RANK_VARIABLES:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def cores_available() -> int:
    """The CPUs this process may run on (its affinity mask: taskset, cgroups, the launcher's binding)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def launcher_cores(mine: int) -> int:
    """The CPUs of the process that started this one (the launcher, unbound: what the node gives the
    job) when the launcher bound this process to fewer, else ``mine`` (not bound, or not readable)."""
    try:
        own, launchers = os.sched_getaffinity(0), os.sched_getaffinity(os.getppid())
    except (AttributeError, OSError):  # macOS, Windows; a parent gone or not ours to read
        return mine
    return len(launchers) if os.getppid() > 1 and own != launchers else mine


def sharing_ranks(ranks: int, mine: int, launchers: int) -> int:
    """How many of the node's ``ranks`` run on this rank's ``mine`` cores, when the launcher's own CPU set
    has ``launchers``: all of them when the ranks are not bound (their set is the launcher's), else as
    many as fit the node's cores in sets of this size (bound to a core each: 1; 8 ranks bound to a socket
    of 8 of 16 cores: 4)."""
    if mine >= launchers:
        return max(1, ranks)
    return max(1, min(ranks, math.ceil(ranks * mine / launchers)))


def choose_threads(cores: int, ranks: int, env: Mapping[str, str], work: float | None = None) -> int:
    """BLAS threads per rank: the user's setting, else one for a small job (``work`` multiply-adds per
    forward pass and worker below ``SMALL_WORK``), else an equal share of the cores (at least one)."""
    if user_threads(env) is not None:
        return user_threads(env)
    if work is not None and work < SMALL_WORK:
        return 1
    return max(1, cores // max(1, ranks))


def work_per_step(cfg, summary, nworkers: int = 1) -> float | None:
    """Multiply-adds of the train net's forward pass per worker: each weight's size times the output
    positions it is applied at (1 for an inner product, height x width for a convolution), times the
    batch, over ``nworkers`` (data or feature partitioning splits the work either way).  None when
    the job has no train net.

    ``summary``: what checking the job found (:class:`singa_mpi.checks.job.Summary`): each phase's
    layers with their output shapes and batch, and the params' logical shapes.

    Deterministic mode: 0 (one thread).  OpenBLAS splits a product between its threads in a way that
    changes its bits (measured: a 16x784 by 784x2500 sgemm differs between 1 and 2 threads), so every
    rank of every run to be compared computes with one."""
    if cfg.proto.HasField("deterministic"):
        return 0.0
    train = next((phase for phase in summary.phases if phase.phase == "train"), None)
    if train is None:
        return None
    outputs = {name: shape for name, _, shape in train.layers}
    weights = {name: shape for name, shape in summary.params if len(shape) >= 2}
    total = 0
    for layer in cfg.proto.neuralnet.layer:
        if layer.name in outputs:
            for param in layer.param:
                shape = weights.get(param.name) or weights.get(param.share_from)
                total += math.prod(shape) * math.prod(outputs[layer.name][1:]) if shape else 0
    return total * train.batch / max(1, nworkers)


def oversubscription(cores: int, ranks: int, threads: int, env: Mapping[str, str] | None = None) -> str | None:
    """The one-line warning when ``ranks * threads`` exceeds the cores, else None; its advice names the
    variables of ``env`` (the user's) that set too many threads, each to change."""
    if ranks * threads <= cores:
        return None
    share = max(1, cores // ranks)
    fix = " and ".join(f"{name}={share}" for name in _set_above(env or {}, share))
    advice = ([f"set {fix}"] if threads > share else []) + \
             ([f"launch at most {cores} rank(s) on this node"] if ranks > cores else [])
    return (f"{ranks} rank(s) x {threads} BLAS thread(s) on {cores} core(s) oversubscribe this node "
            f"and slow every step: {' or '.join(advice)}")


def _scipy_only_blas(controller) -> list[str]:
    """File paths of BLAS libraries that scipy bundles apart from numpy's."""
    spec = importlib.util.find_spec("scipy")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = os.path.realpath(list(spec.submodule_search_locations)[0])
    prefixes = (folder + os.sep, folder + ".libs" + os.sep)
    return [lib.filepath for lib in controller.lib_controllers
            if lib.user_api == "blas" and os.path.realpath(lib.filepath).startswith(prefixes)]


@contextlib.contextmanager
def limit_blas(threads: int) -> Iterator[dict[str, int]]:
    """Inside: numpy's BLAS and OpenMP use ``threads`` threads, a BLAS only scipy loads uses one.

    Yields {library file: threads}; the previous limits come back on exit.
    """
    import numpy  # noqa: F401  (load the libraries before limiting them)
    from threadpoolctl import ThreadpoolController

    with contextlib.suppress(ImportError):
        import scipy.linalg.blas  # noqa: F401  (the updaters' axpy)
    controller = ThreadpoolController()
    scipy_only = _scipy_only_blas(controller)
    with contextlib.ExitStack() as stack:
        others = [lib.filepath for lib in controller.lib_controllers if lib.filepath not in scipy_only]
        if others:
            stack.enter_context(controller.select(filepath=others).limit(limits=threads))
        if scipy_only:
            stack.enter_context(controller.select(filepath=scipy_only).limit(limits=1))
        yield {lib.filepath: lib.num_threads for lib in controller.lib_controllers}  # read live


@contextlib.contextmanager
def blas_threads(env: Mapping[str, str] | None = None, cores: int | None = None,
                 warn: Callable[[str], None] | None = None, work: float | None = None,
                 launcher: int | None = None) -> Iterator[int]:
    """Run the body with the chosen BLAS threads per rank (``work``: see ``choose_threads``); yields the count.

    ``cores``: this rank's CPUs (default: its affinity); ``launcher``: the launcher's (default: its
    parent's affinity when ``cores`` is not given, else ``cores``).  The node's ranks share this rank's
    cores unless the launcher bound them apart (:func:`sharing_ranks`).  With the user's OMP_NUM_THREADS
    etc. set nothing is limited.  ``warn`` (rank 0 only) gets the oversubscription line.
    """
    env = os.environ if env is None else env
    if cores is None:
        cores = cores_available()
        launcher = launcher or launcher_cores(cores)
    ranks = sharing_ranks(local_ranks(env), cores, launcher or cores)  # the ranks on these cores
    threads = choose_threads(cores, ranks, env, work)
    message = oversubscription(cores, ranks, threads, env)
    if message and warn is not None and world_rank(env) == 0:
        warn(message)
    if user_threads(env) is not None:
        yield threads
        return
    with limit_blas(threads):
        yield threads


def shared_by_threads(ranks: int) -> contextlib.AbstractContextManager:
    """``ranks`` ranks run as threads of this process, each calling numpy's BLAS (in-process runs:
    tests, ``singa_mpi.testing.check_equivalence``): an equal share of the cores per rank, as `singa-mpi
    train` gives the ranks of a node.  Left at numpy's default, a thread per core for every rank, a
    784-1500-1000-10 MLP's equivalence check on 2 and 4 workers took 2-2.5x as long on 2 cores.  The
    user's OMP_NUM_THREADS etc. win: nothing is limited."""
    if user_threads(os.environ) is not None or ranks <= 1:  # one rank shares nothing
        return contextlib.nullcontext()
    return limit_blas(choose_threads(cores_available(), ranks, os.environ))
