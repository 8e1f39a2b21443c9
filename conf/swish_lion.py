"""A plugin in one file: the Swish activation layer and the Lion updater.

conf/digits_swish_lion.conf loads it with ``plugin: "swish_lion.py"`` (found beside the job); any job
can with ``singa-mpi train JOB --plugin conf/swish_lion.py``.  README: "Writing your own layer".
"""
import numpy as np

from singa_mpi.layers import LAYERS, Layer
from singa_mpi.plugins import extension
from singa_mpi.updaters import UPDATERS, Updater

# What the job file may write: `[swish_conf] { beta: 1.5 }` in a layer, `[lion_conf] { ... }` in the updater
SWISH = extension("swish_conf", beta=1.0)
LION = extension("lion_conf", extends="UpdaterProto", beta1=0.9, beta2=0.99)


@LAYERS.register("kSwish")
class Swish(Layer):
    """y = x·sigmoid(beta·x), element by element: any split of the rows or features works as it is."""

    def setup(self, src_shapes):
        self.beta = self.conf.Extensions[SWISH].beta
        return tuple(src_shapes[0])  # the logical shape of one sample, unchanged

    def forward(self, inputs, train):
        self.x = inputs[0]
        self.s = 0.5 * (np.tanh(0.5 * self.beta * self.x) + 1)  # a sigmoid that never overflows
        return self.x * self.s

    def backward(self, grad, need):
        if not need[0]:
            return [None]
        return [grad * (self.s + self.beta * self.x * self.s * (1 - self.s))]  # d/dx x·s(beta·x)


@UPDATERS.register("kLion")
class Lion(Updater):
    """Lion (Chen et al., 2023): data -= lr·sign(b1·m + (1-b1)·g), then m = b2·m + (1-b2)·g."""

    def __init__(self, conf):
        super().__init__(conf)  # learning rate schedule, weight decay, clipping fields
        self.beta1, self.beta2 = conf.Extensions[LION].beta1, conf.Extensions[LION].beta2

    def apply(self, name, data, grad, lr):
        momentum = self.slot(name, "momentum", data.shape)  # per param, saved in checkpoints
        data -= lr * np.sign(self.beta1 * momentum + (1 - self.beta1) * grad)
        momentum *= self.beta2
        momentum += (1 - self.beta2) * grad
