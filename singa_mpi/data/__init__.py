"""Data: record stores (kvfile, textfile, hdf5) and converters from MNIST, CIFAR-10, CSV, digits."""
