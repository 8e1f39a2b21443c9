"""The cost model: what a plan's training step will take, before it is launched.

:mod:`.kernels` times each sub-layer's kernels at its own shapes (cached per machine),
:mod:`.rates` holds the memory bandwidth and the communicator's calibrated latency and bandwidth, and
:mod:`.model` walks every rank's program with them (``singa-mpi plan JOB -n N --cost``).
"""
