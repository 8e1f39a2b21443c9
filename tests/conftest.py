import pathlib
import sys

# tests/nets.py and friends are imported as plain modules.
sys.path.insert(0, str(pathlib.Path(__file__).parent))

# tests/mpi only make sense under mpiexec (tests/communication/test_mpi_suites.py launches them)
collect_ignore = [] if "SINGA_MPI_TEST_TMP" in __import__("os").environ else ["mpi"]


@__import__("pytest").fixture(autouse=True)
def _plugins_forgotten_after_each_test():
    """A job that loads a plugin (conf/digits_swish_lion.conf) registers names for its test only."""
    from singa_mpi import plugins

    with plugins.isolated():
        yield
