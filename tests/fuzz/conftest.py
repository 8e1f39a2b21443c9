"""The fuzz and fault suite: its markers, and one summary line per file at the end of the run."""
import fuzz_support


def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz: property-based fuzzing (SINGA_MPI_FUZZ=long: the nightly size)")
    config.addinivalue_line("markers", "mpi: launches mpiexec itself (needs MPI on PATH, no outer mpiexec)")


def pytest_terminal_summary(terminalreporter):
    lines = fuzz_support.summary_lines()
    if lines:
        terminalreporter.section("fuzz and fault suite")
        for line in lines:
            terminalreporter.write_line(line)
