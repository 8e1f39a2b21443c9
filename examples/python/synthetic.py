"""The examples' --synthetic option: random rows in place of a data set the machine does not have
(imported by mnist_mlp.py, mnist_rbm.py and cifar10_cnn.py from this folder)."""
from __future__ import annotations

import argparse


def synthetic_rows(text: str) -> int:
    """--synthetic's value: at least 5 rows (a fifth as many more are made for the test)."""
    try:
        rows = int(text)
    except ValueError:
        rows = 0
    if rows < 5:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of rows >= 5 (a fifth as many more are the "
                                         f"test's)")
    return rows
