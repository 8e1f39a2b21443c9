"""Unrolling recurrent nets: SINGA's copies, names, connections and shared params; bad fields in one line."""
import pytest

from singa_mpi.config import unroll
from singa_mpi.config.load import layers_for_phase, parse_job
from singa_mpi.errors import ConfigError

CHAR_RNN = """
name: "u" train_steps: 1 train_one_batch { alg: kBPTT }
neuralnet {
  unroll_len: 3
  layer { name: "data" type: kCharRNN unroll_len: 1 char_rnn_conf { path: "t" vocab_path: "v" unroll_len: 3 } }
  layer { name: "onehot" type: kOneHot srclayers: "data" unroll_conn_type: kUnrollOneToAll onehot_conf { vocab_size: 5 } }
  layer { name: "gru" type: kGRU srclayers: "onehot" gru_conf { dim_hidden: 4 }
          param { name: "z_hx" init { type: kUniform } } param { name: "r_hx" share_from: "other" } }
  layer { name: "ip" type: kInnerProduct srclayers: "gru" innerproduct_conf { num_output: 5 } }
  layer { name: "last" type: kSigmoid srclayers: "ip" unroll_len: 1 unroll_conn_type: kUnrollFirstToLast }
  layer { name: "lag" type: kSigmoid srclayers: "ip" shift: 1 }
}
"""


def copies(text: str):
    cfg = parse_job(text)
    return cfg, {conf.name: conf for _, conf in layers_for_phase(cfg.proto, "train")}


def test_singas_copies_names_and_connections():
    _, net = copies(CHAR_RNN)
    assert list(net) == ["data", "0#onehot", "1#onehot", "2#onehot", "0#gru", "1#gru", "2#gru",
                         "0#ip", "1#ip", "2#ip", "last", "0#lag", "1#lag", "2#lag"]
    assert [list(net[f"{t}#onehot"].srclayers) for t in range(3)] == [["data"]] * 3  # one copy feeds all
    assert [list(net[f"{t}#gru"].srclayers) for t in range(3)] == [["0#onehot"], ["1#onehot", "0#gru"],
                                                                   ["2#onehot", "1#gru"]]  # chained in time
    assert [list(net[f"{t}#ip"].srclayers) for t in range(3)] == [["0#gru"], ["1#gru"], ["2#gru"]]
    assert list(net["last"].srclayers) == ["2#ip"]  # first copy <- the source's last
    assert [list(net[f"{t}#lag"].srclayers) for t in range(3)] == [[], ["0#ip"], ["1#ip"]]  # shift 1
    assert [net[f"{t}#gru"].unroll_index for t in range(3)] == [0, 1, 2]


def test_copies_share_copy_0s_params_under_the_files_names():
    _, net = copies(CHAR_RNN)
    assert [(p.name, p.share_from) for p in net["0#gru"].param] == [("z_hx", ""), ("r_hx", "other")]
    assert [(p.name, p.share_from) for p in net["2#gru"].param] == [("2#z_hx", "z_hx"), ("2#r_hx", "other")]


def test_a_net_without_unrolling_is_unchanged():
    cfg = parse_job(CHAR_RNN.replace("unroll_len: 3\n", "", 1).replace("unroll_len: 3 }", "}"))
    names = [conf.name for _, conf in layers_for_phase(cfg.proto, "train")]
    assert names == ["data", "onehot", "gru", "ip", "last", "lag"]


@pytest.mark.parametrize("edit,field,message", [
    (("unroll_len: 3\n", "unroll_len: 0\n"), "unroll_len", "neuralnet.unroll_len = 0: expected at least 1"),
    (('shift: 1', 'shift: 3'), "shift", "layer 'lag' (#5, kSigmoid): shift[0] = 3: expected 0..2 (the layer "
                                         "is unrolled 3 times)"),
    (('srclayers: "ip" unroll_len: 1 unroll_conn_type: kUnrollFirstToLast', 'srclayers: "ip" unroll_len: 2'),
     "srclayers", "layer 'last' (#4, kSigmoid): srclayers[0] = 'ip': expected a source unrolled 2 times or not "
                  "at all for kUnrollOneToOne (it is unrolled 3 times)"),
    (("unroll_conn_type: kUnrollFirstToLast", "unroll_conn_type: kUnrollCustomized"), "unroll_conn_type",
     "unroll_conn_type[0] = kUnrollCustomized: expected kUnrollOneToOne"),
])
def test_bad_unrolling_is_one_line_with_file_and_line(edit, field, message):
    cfg = parse_job(CHAR_RNN.replace(*edit, 1), "u.conf")
    with pytest.raises(ConfigError) as info:
        unroll.check(cfg)
    text = str(info.value)
    assert text.startswith("u.conf:") and message in text and "\n" not in text


MLP = """
name: "m" train_steps: 1 train_one_batch { alg: kBP }
neuralnet {
  unroll_len: 3
  layer { name: "data" type: kRecordInput store_conf { path: "d" batchsize: 4 shape: 5 } }
  layer { name: "ip" type: kInnerProduct srclayers: "data" innerproduct_conf { num_output: 2 } }
  layer { name: "loss" type: kSoftmaxLoss srclayers: "ip" srclayers: "data" }
}
"""


def test_an_mlp_unrolled_says_once_that_it_trains_tied_copies():
    with pytest.warns(UserWarning) as said:
        parse_job(MLP, "m.conf")
    assert [str(w.message) for w in said] == [
        "m.conf:4:3: neuralnet.unroll_len = 3: no layer carries state across the 3 copies (no kGRU, no shift, "
        "no kUnrollOneToAll or kUnrollFirstToLast source): each step trains 3 tied copies of the net, sharing "
        "its params and adding their gradients, as SINGA did; leave unroll_len out for one copy"]
    with pytest.warns(UserWarning, match=r"^m.conf:5:22: layer 'ip': unroll_len = 2: "):  # a layer's own field
        parse_job(MLP.replace("unroll_len: 3\n", "").replace('name: "ip"', 'name: "ip" unroll_len: 2'), "m.conf")


@pytest.mark.parametrize("text", [
    CHAR_RNN, CHAR_RNN.replace("type: kGRU", "type: kSigmoid").replace("kOneHot", "kSigmoid"),
    MLP.replace('srclayers: "data" innerproduct', 'srclayers: "data" shift: 1 innerproduct'),
    MLP.replace("unroll_len: 3\n", ""),
])
def test_a_net_whose_copies_are_wired_in_time_or_not_unrolled_says_nothing(text):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parse_job(text, "u.conf")
