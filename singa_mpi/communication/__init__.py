"""Communicators: the only code that moves data between workers.

* :mod:`.mpi` -- MPI through mpi4py (the only module of the package that imports it);
* :mod:`.local` -- the same interface inside one process, for serial tests.
"""
