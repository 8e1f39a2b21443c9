"""Data: record stores (kvfile, textfile, hdf5, SINGA 0.1's DataShard) and converters from MNIST,
CIFAR-10, CSV, digits."""
