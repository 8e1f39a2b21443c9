"""CIFAR-10 as SINGA 0.3's binding examples load it: ``examples/cifar10/{train,test}_data.bin`` and
the mean image ``image_mean.bin``."""
from __future__ import annotations

from singa_mpi.compat.singa_v03.layer import Data
from singa_mpi.compat.singa_v03.model import Store

DATA_DIR = "examples/cifar10"


def load_data(workspace: str | None = None, backend: str = "kvfile", batchsize: int = 64, random: int = 5000,
              shape: tuple[int, ...] = (3, 32, 32), std: float = 127.5, mean: float = 127.5
              ) -> tuple[Data, Data, str]:
    """The training data (skipping up to ``random`` records at the start) and the test data, both less
    the mean image, in batches of ``batchsize``; the workspace (default ``examples/cifar10``).  As in
    the binding, ``std`` and ``mean`` are not used (the mean image is)."""
    del std, mean
    mean_file = f"{DATA_DIR}/image_mean.bin"
    train = Data(load="recordinput", phase="train",
                 conf=Store(path=f"{DATA_DIR}/train_data.bin", mean_file=mean_file, backend=backend,
                            random_skip=random, batchsize=batchsize, shape=shape))
    test = Data(load="recordinput", phase="test",
                conf=Store(path=f"{DATA_DIR}/test_data.bin", mean_file=mean_file, backend=backend,
                           batchsize=batchsize, shape=shape))
    return train, test, workspace if workspace is not None else DATA_DIR
