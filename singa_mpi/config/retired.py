"""SINGA layer types this port does not run, each with what a job should say instead.

None of SINGA 0.1-0.3's example jobs uses them; the parser and the validator
turn them into one-line errors that name the replacement.
"""
from __future__ import annotations

RETIRED_LAYER_TYPES: dict[str, str] = {
    "kLMDBData": "kShardData or kRecordInput: SINGA's reader of Caffe's LMDB databases is not ported; "
                 "write a DataShard folder with `singa-mpi data mnist|cifar10 ... --backend shard` "
                 "(or a kvfile with --backend kvfile for kRecordInput)",
    "kPrefetch": "its sublayers as plain layers (kShardData or kRecordInput, then the parsers): SINGA 0.1-0.2's "
                 "PrefetchLayer was never implemented (its ComputeFeature aborted), and reading here needs no "
                 "prefetch thread",
}

# LayerType values no job writes, though SINGA's enum lists them: the connection layers the planner
# inserts where partitions meet, and kDummy (a layer of SINGA's unit tests).  The enum less these, the
# retired types and kUserLayer is what the built-in layers register (tests/test_registry.py checks it),
# so parsing can name the valid types without importing a layer.
UNWRITTEN_LAYER_TYPES = frozenset({"kBridgeDst", "kBridgeSrc", "kConcate", "kSlice", "kSplit", "kDummy"})
