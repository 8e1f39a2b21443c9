"""Synthetic stores shaped like a job's inputs: smoke tests and benchmarks without real data.

``singa-mpi data synthetic --like JOB.conf`` writes, for every input layer of
the job, a store at its ``store_conf.path`` in its backend with its per-sample
shape (uniform pixel values 0..255, labels 0..classes-1), plus the mean file
if the layer names one.  Existing files are left alone unless ``overwrite``.
"""
from __future__ import annotations

import os

import numpy as np

from singa_mpi.config.load import load_job
from singa_mpi.data.convert import write_store
from singa_mpi.data.stores import KVFileWriter
from singa_mpi.proto import job_pb2


def write_synthetic(job_path: str, count: int = 1000, classes: int = 10, seed: int = 0,
                    overwrite: bool = False) -> list[str]:
    cfg = load_job(job_path)
    rng = np.random.default_rng(seed)
    written = []
    for layer in cfg.proto.neuralnet.layer:
        if not layer.HasField("store_conf") or layer.type not in (job_pb2.kRecordInput, job_pb2.kCSVInput):
            continue
        store = layer.store_conf
        shape = tuple(store.shape)
        backend = store.backend or "textfile"
        if store.path and (overwrite or not os.path.exists(store.path)):
            data = rng.integers(0, 256, (count, *shape)).astype(np.uint8)
            labels = rng.integers(0, classes, count).astype(np.int32) if store.has_label else None
            written.append(write_store(store.path, backend, data, labels, pixels=True))
        if store.mean_file and (overwrite or not os.path.exists(store.mean_file)):
            os.makedirs(os.path.dirname(store.mean_file) or ".", exist_ok=True)
            with KVFileWriter(store.mean_file) as writer:
                writer.write("mean", job_pb2.RecordProto(shape=list(shape),
                                                         data=[127.5] * int(np.prod(shape))))
            written.append(store.mean_file)
    return written
