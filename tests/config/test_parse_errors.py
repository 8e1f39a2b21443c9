"""Protobuf's parse errors reworded: each names FILE:LINE:COL, the field or block, and what was expected,
never protobuf's own words (a garbage file, a file cut short, a string or list left open)."""
from __future__ import annotations

import pytest

from singa_mpi.config.load import parse_job
from singa_mpi.errors import ConfigError
from singa_mpi.proto import job_pb2

PROTOBUF_WORDS = ("Expected identifier", 'Expected "', "String missing", "Message type", "codec can't",
                  "Couldn't parse", "Enum type", "''")


def parse_error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_job(text, "job.conf")
    message = str(info.value)
    assert "\n" not in message and not any(words in message for words in PROTOBUF_WORDS), message
    return message


def test_an_unknown_field_with_no_close_name_lists_the_fields_of_its_block():
    fields = ", ".join(sorted(job_pb2.UpdaterProto.DESCRIPTOR.fields_by_name))
    assert parse_error("updater { type: kSGD lr: 0.1 }") == (
        f"job.conf:1:22: updater.lr: unknown field of UpdaterProto: expected one of {fields}")
    assert parse_error("hello world this is garbage").startswith(
        "job.conf:1:1: hello: unknown field of JobProto: expected one of checkpoint_after, ")


def test_what_is_no_field_name_where_one_belongs_is_named():
    assert parse_error('{"name": "x"}') == ('job.conf:1:1: "{" with no field name before it: expected a field '
                                            'name of JobProto first (name { ... })')
    assert parse_error('name: "x" @') == ('job.conf:1:11: "@" where a field name belongs: expected a field name '
                                          'of JobProto (name: value, or name { ... })')
    assert parse_error('neuralnet { layer { "name": "a" } }') == (
        "job.conf:1:21: layer (#0): \"name\": a string where a field name belongs: expected a field name of LayerProto, "
        "without quotes")


def test_a_file_that_ends_inside_a_block_names_the_block_and_where_it_opened():
    assert parse_error('name: "x"\nneuralnet {\n  layer {\n    name: "a"\n    type: kReLU\n') == (
        "job.conf:5:11: layer 'a' (#0, kReLU): the file ends inside layer { ... } opened at line 3:9: "
        'expected "}" to close it')
    assert parse_error("updater { learning_rate { type: kStep step_conf { gamma: 0.5 }") == (
        "job.conf:1:62: the file ends inside updater.learning_rate { ... } opened at line 1:25: expected \"}\" "
        "to close it")


def test_a_file_that_ends_after_a_field_name_says_what_was_still_expected():
    assert parse_error("seed") == 'job.conf:1:5: seed: the file ends after the field name: expected ":" and a value'
    assert parse_error("train_steps:") == "job.conf:1:13: train_steps: the file ends before its value: expected an integer"
    assert parse_error("name: ") == 'job.conf:1:7: name: the file ends before its value: expected a "quoted string"'
    assert parse_error("train_one_batch { alg:") == (
        "job.conf:1:23: train_one_batch.alg: the file ends before its value: expected one of kBP, kCD, kBPTT")
    assert parse_error("updater") == ("job.conf:1:8: updater: the file ends after the field name: expected "
                                      "{ ... } around its fields")


def test_a_string_left_open_or_badly_escaped_names_the_field():
    assert parse_error('name: "unterminated\nseed: 1') == (
        'job.conf:1:7: name = "unterminated: the string has no closing quote: expected " before the line ends '
        "(a string ends on the line it starts)")
    assert parse_error(r'name: "a\x"') == ("job.conf:1:7: name: a bad escape in its string (truncated \\xXX "
                                           r'escape): expected \\ for a backslash, \" for a quote')


def test_brackets_where_none_belong_or_left_open_are_named():
    assert parse_error("cluster { [singa.x]: 1 }") == (
        "job.conf:1:18: [...] inside ClusterProto, which takes no extensions: expected a field name of "
        "ClusterProto without [ ]")
    assert parse_error('name: "x" [ seed: 1') == ('job.conf:1:17: a "[" with no "]" after the name that follows it: '
                                                  "expected [extension_name] { ... } (a plugin's fields), or no \"[\"")
    assert parse_error("updater { momentum: 0.9[5 }") == (
        'job.conf:1:25: "[" where a field name belongs: expected a field name, or [extension_name] { ... } for a '
        "plugin's fields")
    assert parse_error('neuralnet { layer { name: "a" srclayers: ["b" "c" } }').endswith(
        'srclayers: expected "," between the items of a [ ... ] list, and "]" after the last')
