"""Runtimes: what a process runs a job with.

* :mod:`.serial` -- the whole net in one process;
* :mod:`.worker` -- one worker of a group (an MPI rank whose rank in the group
  communicator is its location ID), running its part of the partition plan.

Both implement :class:`singa_mpi.runtimes.base.Runtime`; the trainer sees only that.
"""
