"""``python -m singa_mpi ...``: see :mod:`singa_mpi.cli`."""
import sys

from singa_mpi.cli import main

sys.exit(main())
