"""singa_mpi: an MPI-native re-creation of Apache SINGA 0.x's distributed deep learning system."""

__version__ = "0.1.0"
