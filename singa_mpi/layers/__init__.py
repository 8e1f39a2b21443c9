"""Layers grouped by SINGA's families: input, neuron, loss, output, connection (rbm, rnn later)."""
from singa_mpi.layers.base import LAYERS, Layer, LayerConfigError, LayerContext, layer_class, layer_class_of

__all__ = ["LAYERS", "Layer", "LayerConfigError", "LayerContext", "layer_class", "layer_class_of"]
