"""Which MPI launcher starts singa_mpi's ranks on this machine, with what flags and environment.

Two MPIs are first-class: MPICH (the ``mpich`` wheel beside this Python, or a system MPICH) and Open
MPI (e.g. Debian's ``openmpi-bin``).  mpi4py's wheel carries an extension for each ABI and picks one
by the library it finds; a launcher of one MPI with mpi4py on the other gives N serial jobs, so the
launcher and the library must be chosen together.  :func:`find_launcher` does that, for the tests,
the benchmark scripts and anyone scripting runs::

    launcher = find_launcher()                  # SINGA_MPI_FLAVOR=openmpi|mpich, else MPICH if present
    subprocess.run(launcher.command(4) + [sys.executable, "-m", "singa_mpi", "train", ...],
                   env=launcher.environ())

For Open MPI it points mpi4py at that Open MPI's ``libmpi`` (``MPI4PY_LIBMPI``, ``MPI4PY_MPIABI``:
mpi4py's documented switches) and adds ``--oversubscribe`` (a box with fewer cores than ranks) and,
as root, ``--allow-run-as-root``.  ``SINGA_MPI_LAUNCHER_OPTIONS`` adds options of your own (how the
launcher reaches other hosts, for example); ``command(N, hosts)`` starts the ranks on those hosts
(:mod:`singa_mpi.communication.hosts`).  No mpi4py import here: this runs before any MPI is loaded.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import shlex
import shutil
import subprocess
import sys

from singa_mpi.communication.hosts import Host, host_option
from singa_mpi.communication.keeper import KEEPER_VARIABLE

FLAVORS = ("mpich", "openmpi")
FLAVOR_VARIABLE = "SINGA_MPI_FLAVOR"
# more options for the launcher, before -n (how ranks reach other hosts: MPICH's -launcher/-iface, -genv ...)
OPTIONS_VARIABLE = "SINGA_MPI_LAUNCHER_OPTIONS"
CMA_VARIABLE = "MPIR_CVAR_CH4_CMA_ENABLE"  # MPICH's single-copy transfers between ranks of a node
# Open MPI's odls_base_sigkill_timeout is left at its default (1 s): mpirun 4.1 waits it out twice
# after any rank exits non-zero (an error line, an abort, a stop's exit 75), even when every rank has
# already ended (4.1.4: a failed run ends 1 s after its ranks at 1 s, 9 s at 5, 19 s at 10).  Its other
# use, the ranks' time to checkpoint on a SIGTERM to mpirun, is not the helper's: its stop signal is
# SIGUSR1, passed on at once; slurm/train.sbatch sets 10 s for scancel.


class LauncherNotFound(RuntimeError):
    """The MPI asked for has no launcher here; the message says what to install."""


@dataclasses.dataclass(frozen=True)
class Launcher:
    flavor: str  # "mpich" or "openmpi"
    executable: str
    options: tuple[str, ...] = ()
    variables: tuple[tuple[str, str], ...] = ()  # what mpi4py needs to load this MPI's library
    # what to send the launcher so that every rank checkpoints and exits 75: hydra forwards SIGTERM;
    # Open MPI's mpirun passes SIGUSR1 on at once, but a SIGTERM only after odls_base_sigkill_timeout
    # seconds, with SIGKILL as long after it, and then exits 1 whatever the ranks did
    stop_signal: str = "SIGTERM"

    def command(self, nranks: int, hosts: list[Host] | None = None) -> list[str]:
        """``[launcher, options..., -n, N]``: append the program and its arguments.  ``hosts``: start
        the ranks there (default: wherever the launcher would, e.g. the Slurm allocation)."""
        where = host_option(self.flavor, hosts) if hosts else []
        extra = shlex.split(os.environ.get(OPTIONS_VARIABLE, ""))
        return [self.executable, *self.options, *extra, *where, "-n", str(nranks)]

    def survivors_kept(self) -> tuple[list[str], dict[str, str]] | None:
        """Launcher options and rank environment that keep the other ranks running when one dies, so
        they can save an emergency checkpoint: MPICH's ``-disable-auto-cleanup`` with a keeper per rank
        (:mod:`singa_mpi.communication.keeper`: hydra still ends everything when a rank dies by a
        signal), and no single-copy CMA between ranks of a node unless set: a survivor whose copy from a
        dead peer's memory fails (process_vm_readv) aborts inside MPICH, taking the others with it.  That
        costs the messages' path on one node (the MNIST MLP summed over messages: about 14% at 2 ranks);
        the node-shared default sends no large messages.  None for Open MPI 4.1: its
        ``--enable-recovery`` keeps survivors, but then MPI_Abort no longer ends the job (a rank's error
        would leave the others waiting forever)."""
        if self.flavor == "mpich":
            variables = {KEEPER_VARIABLE: "1"}
            if CMA_VARIABLE not in os.environ:
                variables[CMA_VARIABLE] = "0"
            return ["-disable-auto-cleanup"], variables
        return None

    def environ(self, base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
        """``base`` (default: this process's environment) with this MPI's variables and ``extra``.
        UCX (the MPICH wheel's transport) is kept to shared memory on one machine unless set:
        its address exchange fails intermittently on hosts with odd interfaces (pmodels/mpich#7417)."""
        env = dict(os.environ if base is None else base, **dict(self.variables), **extra)
        env.setdefault("UCX_TLS", "self,sm")
        return env


def find_launcher(flavor: str | None = None) -> Launcher:
    """The launcher of ``flavor`` (default: ``$SINGA_MPI_FLAVOR``, else MPICH when it is there, else
    Open MPI); LauncherNotFound saying what to install otherwise."""
    flavor = flavor or os.environ.get(FLAVOR_VARIABLE) or ""
    if flavor and flavor not in FLAVORS:
        raise LauncherNotFound(f"{FLAVOR_VARIABLE}={flavor}: expected one of {', '.join(FLAVORS)}")
    if flavor in ("", "mpich"):
        found = _mpich()
        if found is not None or flavor == "mpich":
            return found or _missing("mpich")
    return _open_mpi() or _missing("openmpi")


def _search_path() -> str:
    return os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


def _version(executable: str) -> str:
    try:
        done = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def _mpich() -> Launcher | None:
    """MPICH's hydra ``mpiexec``, the wheel's beside this Python first."""
    executable = shutil.which("mpiexec", path=_search_path())
    if executable is None or not any(word in _version(executable) for word in ("HYDRA", "MPICH")):
        return None
    return Launcher("mpich", executable)


def _open_mpi() -> Launcher | None:
    """Open MPI's ``mpirun`` (Debian names it mpirun.openmpi too) and its libmpi for mpi4py."""
    for name in ("mpirun.openmpi", "mpirun", "mpiexec"):
        executable = shutil.which(name, path=_search_path() + os.pathsep + "/usr/bin")
        if executable is None or not any(word in _version(executable) for word in ("Open MPI", "OpenRTE")):
            continue
        # --bind-to none: ranks share the node as under MPICH, so BLAS threads are chosen per node;
        # --quiet: no banner after the one error line when the ranks exit with an error code
        options = ["--oversubscribe", "--bind-to", "none", "--quiet"]
        if os.geteuid() == 0:
            options.append("--allow-run-as-root")
        variables = [("MPI4PY_MPIABI", "openmpi")]
        library = _open_mpi_library(executable)
        if library:
            variables.append(("MPI4PY_LIBMPI", library))
        return Launcher("openmpi", executable, tuple(options), tuple(variables), stop_signal="SIGUSR1")
    return None


def _open_mpi_library(executable: str) -> str:
    """The libmpi.so of the Open MPI that ``executable`` belongs to (ompi_info beside it says where)."""
    info = os.path.join(os.path.dirname(os.path.realpath(executable)), "ompi_info")
    if not os.path.exists(info):
        info = shutil.which("ompi_info") or ""
    try:
        out = subprocess.run([info, "--parsable", "--path", "libdir"], capture_output=True, text=True,
                             timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    for line in out.splitlines():
        if line.startswith("path:libdir:"):
            libdir = line.split(":", 2)[2]
            # libmpi.so comes with the -dev package; Debian keeps the runtime's libmpi.so.40 two folders up
            for pattern in ("libmpi.so", "libmpi.so.[0-9]*", os.path.join("..", "..", "libmpi.so.[0-9]*")):
                found = sorted(glob.glob(os.path.join(libdir, pattern)), key=len)
                if found:
                    return os.path.realpath(found[0])
    return ""


def _missing(flavor: str) -> Launcher:
    how = {"mpich": "pip install mpich (or a system MPICH with its mpiexec on PATH)",
           "openmpi": "a system Open MPI (Debian: apt-get install openmpi-bin) with its mpirun on PATH"}
    raise LauncherNotFound(f"no {flavor} launcher found: install {how[flavor]}")
