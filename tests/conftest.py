import pathlib
import sys

# tests/gradcheck.py and friends are imported as plain modules.
sys.path.insert(0, str(pathlib.Path(__file__).parent))

# tests/mpi only make sense under mpiexec (tests/test_mpi_suites.py launches them)
collect_ignore = [] if "SINGA_MPI_TEST_TMP" in __import__("os").environ else ["mpi"]
