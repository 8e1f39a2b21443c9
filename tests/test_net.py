"""The net tells each layer, before the first pass, which of its inputs backward will want gradients for."""
import numpy as np

from singa_mpi.net import Net, Wire
from singa_mpi.testing import build_layer

WB = 'param { name: "w" init { type: kGaussian std: 0.1 } } param { name: "b" init { type: kConstant value: 0 } }'


def test_every_layer_knows_which_input_gradients_backward_will_want():
    source = build_layer('name: "x" type: kSTanh', [(3, 8, 8)], batch=2)  # stands in for data: no params
    first = build_layer(f'name: "c1" type: kConvolution convolution_conf {{ num_filters: 4 kernel: 3 pad: 1 }} {WB}',
                        [(3, 8, 8)], batch=2)
    second = build_layer(f'name: "c2" type: kConvolution convolution_conf {{ num_filters: 4 kernel: 3 pad: 1 }} '
                         f'{WB}', [(4, 8, 8)], batch=2)
    Net([Wire(source, [], []), Wire(first, [source], ["data"]), Wire(second, [first], ["data"])])
    assert source.input_grads == [] and first.input_grads == [False] and second.input_grads == [True]
    assert build_layer('name: "y" type: kSTanh', [(3,)], batch=1).input_grads is None  # on its own: unknown
    x = np.ones((2, 3, 8, 8))
    first.forward([x], True)  # the route is chosen knowing that no input gradient is wanted
    assert first.backward(np.ones((2, 4, 8, 8)), [False]) == [None]
