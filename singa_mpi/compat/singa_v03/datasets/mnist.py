"""MNIST as SINGA 0.3's binding examples load it: ``examples/mnist/{train,test}_data.bin``."""
from __future__ import annotations

from typing import Any

from singa_mpi.compat.singa_v03.layer import Data
from singa_mpi.compat.singa_v03.model import Store

DATA_DIR = "examples/mnist"


def load_data(workspace: str | None = None, backend: str = "kvfile", nb_rbm: int = 0, checkpoint_steps: int = 0,
              **pvalues: Any) -> tuple[Data, Data, str]:
    """The training and test data layers (``pvalues``: the stores' fields, ``batchsize``, ``shape``,
    ``std_value``, ...) and the workspace (default ``examples/mnist``).  For the RBM stack
    (``nb_rbm`` levels), training starts from the lower RBMs' checkpoints at ``checkpoint_steps``."""
    checkpoints = None
    if checkpoint_steps > 0:
        checkpoints = [f"examples/rbm/rbm{level}/checkpoint/step{checkpoint_steps}-worker0"
                       for level in range(nb_rbm - 1, 0, -1)]
    train = Data(load="recordinput", phase="train", checkpoint=checkpoints,
                 conf=Store(path=f"{DATA_DIR}/train_data.bin", backend=backend, **pvalues))
    test = Data(load="recordinput", phase="test", conf=Store(path=f"{DATA_DIR}/test_data.bin", backend=backend,
                                                             **pvalues))
    return train, test, workspace if workspace is not None else DATA_DIR
