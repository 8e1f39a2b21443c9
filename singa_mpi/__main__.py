"""``python -m singa_mpi ...`` and the ``singa-mpi`` command: see :mod:`singa_mpi.cli`."""
import os
import sys

from singa_mpi.early_signals import catch_for_command


def run() -> int:
    from singa_mpi.communication import keeper

    if keeper.wanted():  # a rank of a supervised MPICH run: keep it as a child (see the keeper)
        return keeper.keep(sys.argv[1:])
    catch_for_command(sys.argv[1:])  # before the heavy imports: a SIGTERM meanwhile must not be lost
    from singa_mpi.communication.liveness import start_early

    start_early(sys.argv[1:])  # nor a rank killed meanwhile: its guardian names it
    from singa_mpi.cli import main

    try:
        return main()
    except BrokenPipeError:  # `singa-mpi plan JOB | head`: the reader left; nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit must not fail again
        return 0


if __name__ == "__main__":
    sys.exit(run())
