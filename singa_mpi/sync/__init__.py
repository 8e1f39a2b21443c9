"""Parameter synchronisation strategies: how replicated parameters get summed and updated.

* :mod:`.shared_memory` -- all workers of the group on one node: node-shared
  values, gradient chunks summed in place, batch-factored weights from their factors;
* :mod:`.allreduce` -- bucketed non-blocking Allreduce, any number of nodes.
"""
