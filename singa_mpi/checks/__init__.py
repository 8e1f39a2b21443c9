"""Checking a job: what it means, before anything runs (``singa-mpi check``, and every launch).

Parsing (:mod:`singa_mpi.config`: text -> a config with positions) knows nothing of layers; checking
builds the layers of each phase to learn shapes and params, so it sits above them and nothing below
the planner imports it.  :func:`singa_mpi.checks.job.validate` is the entry point:

* ``job``: the job's own fields, then each phase, then the updater; the :class:`~singa_mpi.checks.job.Summary`;
* ``phase``: one phase's net (names, sources, layer fields, shapes, batches, data files);
* ``params``: params' names, init, owners and sharing;
* ``algorithms``: what kCD and kBPTT need of the net;
* ``checkpoint_paths``: a job's ``checkpoint_path`` files, and which job writes them.
"""
