"""SINGA's char-rnn (SINGA's examples/char-rnn/job.conf), written with singa_mpi.api: a GRU reads text
one character at a time and learns to predict the next one (BPTT over 50 steps, the hidden state
carried from batch to batch).

    singa-mpi data text --out data/text                  # Python's own source as the text, no download
    python examples/python/char_rnn.py --steps 300
    mpiexec -n 2 python examples/python/char_rnn.py --steps 300
    singa-mpi sample workspace/char_rnn/job.conf --workspace workspace/char_rnn    # text from the trained net

The job built is conf/char_rnn.conf, field for field (tests/examples/test_python_examples.py).
"""
from __future__ import annotations

import argparse
import os
import sys

import singa_mpi.api as sm

GRU_PARAMS = [f"{gate}_{part}" for part in ("hx", "hh", "b") for gate in "zrc"]


def build(text: str = "data/text/input.txt", vocabulary: str = "data/text/vocab.txt", vocab_size: int = 97) -> sm.Job:
    def uniform(name: str) -> sm.Param:
        return sm.Param(name, sm.Uniform(-0.08, 0.08))

    net = sm.Net(unroll_len=50)  # every layer but the reader unrolled over 50 characters
    net.add(sm.CharRNN(text, vocabulary, batchsize=32, unroll_len=50, name="data"))
    net.add(sm.Layer("kOneHot", "onehot", "data", unroll_conn_type=["kUnrollOneToAll"],
                     onehot_conf={"vocab_size": vocab_size}))
    net.add(sm.Layer("kRNNLabel", "label", "data", unroll_conn_type=["kUnrollOneToAll"]))
    net.add(sm.Layer("kGRU", "gru1", "onehot", gru_conf={"dim_hidden": 256},
                     params=[uniform(name) for name in GRU_PARAMS]))
    net.add(sm.InnerProduct(vocab_size, "ip1", "gru1", w=uniform("w"), b=uniform("b")))
    net.add(sm.SoftmaxLoss("loss", srcs=["ip1", "label"]))
    rate = sm.LearningRate("kStep", 0.005, gamma=0.9, change_freq=500)
    return sm.Job("char-rnn", net, algorithm="kBPTT",
                  updater=sm.Updater("kRMSProp", rate, rmsprop_conf={"rho": 0.95}, clip_low=-5, clip_high=5),
                  seed=1, train_steps=3000, disp_freq=100, test_steps=10, test_freq=500)


def main(argv: list[str] | None = None) -> sm.History:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--steps", type=int, help="train this many steps (default: the job's 3000)")
    parser.add_argument("--workspace", default="workspace/char_rnn", help="where to write (default: %(default)s)")
    args = parser.parse_args(argv)
    if not os.path.exists("data/text/input.txt"):
        sys.exit("char_rnn.py: no data/text/input.txt: make it with `singa-mpi data text --out data/text`")
    return build().fit(args.workspace, steps=args.steps, overwrite=True)


if __name__ == "__main__":
    main()
