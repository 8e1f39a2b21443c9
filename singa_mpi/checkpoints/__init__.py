"""Checkpoints: the HDF5 file format (:mod:`.hdf5`), gathering and restoring a running
job's state under any partitioning (:mod:`.snapshot`), and the ``ckpt`` commands (:mod:`.tools`)."""
