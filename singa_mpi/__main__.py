"""``python -m singa_mpi ...`` and the ``singa-mpi`` command: see :mod:`singa_mpi.cli`."""
import sys

from singa_mpi.early_signals import catch_for_command


def run() -> int:
    catch_for_command(sys.argv[1:])  # before the heavy imports: a SIGTERM meanwhile must not be lost
    from singa_mpi.cli import main

    return main()


if __name__ == "__main__":
    sys.exit(run())
