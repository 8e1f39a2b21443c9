"""Apache SINGA 0.3's Python binding (``tool/python/singa``, tag v0.3.0-rc3) on singa_mpi.

A script written for the binding runs with its imports changed (``from singa.model import *`` to
``from singa_mpi.compat.singa_v03.model import *``, ``from examples.datasets import mnist`` to
``from singa_mpi.compat.singa_v03.datasets import mnist``) and builds the job the binding built:
the same layers, params, names and settings.  :mod:`~singa_mpi.compat.singa_v03.model` says where
it differs from the binding on purpose.
"""
from singa_mpi.compat.singa_v03.model import (RBM, RGB, SGD, AdaGrad, Accuracy, Activation, Algorithm, Autoencoder,
                                              AvgPooling2D, Cluster, Convolution2D, Data, Dense, Dropout, Energy,
                                              Layer, Loss, LRN2D, MaxPooling2D, Model, Parameter, Sequential, Store,
                                              Updater, generate_name, reset_names)

__all__ = ["Model", "Sequential", "Energy", "Store", "Algorithm", "Updater", "SGD", "AdaGrad", "Cluster", "Layer",
           "Data", "Convolution2D", "MaxPooling2D", "AvgPooling2D", "LRN2D", "Loss", "Activation", "Dropout",
           "Accuracy", "RGB", "Dense", "Autoencoder", "RBM", "Parameter", "generate_name", "reset_names"]
