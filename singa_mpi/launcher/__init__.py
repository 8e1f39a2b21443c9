"""Running a job, in one process or as one rank of an MPI job.

The way of a job: :mod:`.describe` computes the launch description from the job, the launched world
and the request (pure: the config parsed and checked once, the topology, each phase's plan and every
rank's proved program, the facts to vote on); :mod:`.checks` reads what can be read before any
communication; :mod:`.vote` decides, on every rank alike, whether to go on; :mod:`.run` then gives
each rank its role (:mod:`singa_mpi.runtimes.roles`) and runs the command's body on it
(:mod:`.train`, or :mod:`singa_mpi.test_command`).  :mod:`.start` starts a rank (its liveness
record, the world communicator); :mod:`.options` holds what the user asked for.
"""
from singa_mpi.launcher.options import Request, RunOptions
from singa_mpi.launcher.train import run_training

__all__ = ["Request", "RunOptions", "run_training"]
