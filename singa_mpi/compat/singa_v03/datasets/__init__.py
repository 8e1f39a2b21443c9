"""SINGA 0.3 binding examples' ``datasets`` helpers (``examples/datasets/mnist.py``, ``cifar10.py``):
``load_data()`` gives the training and test input layers over SINGA's record files
(``examples/mnist/train_data.bin``, ...: paths relative to the working folder, as in SINGA) and the
workspace.  ``singa-mpi data -h`` makes such stores from the original data files."""
