"""Compatibility layers: other systems' Python names for jobs singa_mpi runs.

:mod:`singa_mpi.compat.singa_v03` takes the names of Apache SINGA 0.3's Python binding
(``tool/python/singa``: ``Sequential(name, argv)``, ``Dense``, ``Convolution2D``, ``SGD(lr_type=...)``,
``Cluster(workspace)``, ``m.fit(X_train, nb_epoch=...)``), so that SINGA's own example scripts run
with their import lines changed.
"""
