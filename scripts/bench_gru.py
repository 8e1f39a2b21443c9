"""GRU char-rnn training step: singa_mpi (1 and 2 ranks, data parallel) against PyTorch's ``torch.nn.GRU``.

    python scripts/bench_gru.py [--hidden 512] [--batch 50] [--unroll 50] [--steps 30] [--warmup 5]
                                [--repeat 5] [--ranks 1 2] [--max-bytes 2000000] [--keep DIR]

Both sides train the same model on the same text (``singa-mpi data text``: the Python standard
library's source and its vocabulary, 96-97 symbols) with one thread each: one-hot characters -> GRU
(``hidden`` units, unrolled over ``unroll`` steps) -> linear layer -> softmax cross-entropy at every
step, summed over the steps and averaged over the rows (SINGA's kSoftmaxLoss gradient); gradients
clipped element-wise to [-5, 5]; RMSProp (rho 0.95, lr 0.002 as SINGA's char-rnn); truncated BPTT:
the ``batch`` rows read ``batch`` streams of the text (kCharRNN's layout: row i reads bytes
[i*M, (i+1)*M) with M = len // batch, windows of unroll + 1 characters that move by ``unroll``) and
the hidden state of one batch starts the next (zeros when the streams start again), no gradient
flowing into it.  singa_mpi runs ``alg: kBPTT`` with kCharRNN -> kOneHot, kRNNLabel -> kGRU ->
kInnerProduct -> kSoftmaxLoss (``singa-mpi train`` serially, ``mpiexec -n 2 python -m singa_mpi
train`` for 2 ranks: every layer split on the batch, gradients summed by allreduce); PyTorch runs
``nn.GRU`` -> ``nn.Linear`` -> ``F.cross_entropy`` with ``torch.optim.RMSprop`` in a subprocess under
``torch.set_num_threads(1)``.

Measured: ms per whole training step (forward, backward, clipping, update; for singa_mpi also its
reader and per-step bookkeeping), the mean over ``--steps`` steps after ``--warmup`` steps, whose
one-time costs (first allocations, reading the text) are shown apart.  singa_mpi's comes from
WORKSPACE/metrics.jsonl: the job prints one progress line after the warm-up and one after the timed
steps, and the second line's ``samples_per_s`` covers the timed steps alone (rank 0's clock; on 2
ranks a step ends with the allreduce).  Every process has one BLAS thread (OMP/OPENBLAS/MKL_NUM_THREADS=1).
Step times are the median of ``--repeat`` interleaved rounds (a shared machine is noisy); the
``fastest`` column is the minimum.  PyTorch is a benchmark-only optional dependency: without it the
script prints one line and exits 0.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # scripts/benchkit.py, however run
from benchkit import (
    bench_env,
    blas_threads_as_train,
    train_subprocess,
    verdict,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOAL_RATIO = 1.3  # singa_mpi's 1-rank step time over PyTorch's, at most
GOAL_SPEEDUP = {2: 1.6}  # singa_mpi's n-rank speed-up over its 1 rank, at least
LR, RHO, CLIP, INIT = 0.002, 0.95, 5.0, 0.08
NOTE = ("note: PyTorch's GRU gates, n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), h' = (1-z) * n + z * h, "
        "apply the reset gate after the hidden matmul as SINGA's c = tanh(r * (W_ch h) + W_cx x + b_c) does; "
        "PyTorch adds three hidden-side bias vectors (b_hr, b_hz, b_hn) and puts RMSprop's eps outside the "
        "square root: the same GEMMs (3 input-side, 3 hidden-side per time step) and the same elementwise work "
        "up to those bias adds")

JOB = """name: "bench-gru" seed: 1 train_steps: {total} disp_freq: {steps} disp_after: {disp_after}
train_one_batch {{ alg: kBPTT }}
updater {{ type: kRMSProp rmsprop_conf {{ rho: {rho} }} learning_rate {{ type: kFixed base_lr: {lr} }}
  clip_low: -{clip} clip_high: {clip} }}
neuralnet {{ partition_dim: 0 unroll_len: {unroll}
  layer {{ name: "data" type: kCharRNN unroll_len: 1
    char_rnn_conf {{ path: "{text}" vocab_path: "{vocab}" batchsize: {batch} unroll_len: {unroll} }} }}
  layer {{ name: "onehot" type: kOneHot srclayers: "data" unroll_conn_type: kUnrollOneToAll
    onehot_conf {{ vocab_size: {vocab_size} }} }}
  layer {{ name: "label" type: kRNNLabel srclayers: "data" unroll_conn_type: kUnrollOneToAll }}
  layer {{ name: "gru1" type: kGRU srclayers: "onehot" gru_conf {{ dim_hidden: {hidden} }}
{gru_params} }}
  layer {{ name: "ip1" type: kInnerProduct srclayers: "gru1" innerproduct_conf {{ num_output: {vocab_size} }}
    param {{ name: "w" {init} }} param {{ name: "b" {init} }} }}
  layer {{ name: "loss" type: kSoftmaxLoss srclayers: "ip1" srclayers: "label" }}
}}
"""


# ------------------------------------------------------------------ data and job

def prepare_text(folder: pathlib.Path, max_bytes: int) -> tuple[pathlib.Path, pathlib.Path]:
    """``singa-mpi data text --out folder/text --max-bytes N``: (input.txt, vocab.txt)."""
    from singa_mpi.data.text import write_text_corpus

    text, vocab = write_text_corpus(str(folder / "text"), max_bytes=max_bytes)
    return pathlib.Path(text), pathlib.Path(vocab)


def write_job(args, folder: pathlib.Path, text: pathlib.Path, vocab: pathlib.Path) -> pathlib.Path:
    """The char-rnn job with two progress lines: after the warm-up and after the timed steps."""
    init = f"init {{ type: kUniform low: -{INIT} high: {INIT} }}"
    gru_params = "\n".join(f'    param {{ name: "{g}_{k}" {init} }}' for k in ("hx", "hh", "b") for g in "zrc")
    job = JOB.format(total=args.warmup + args.steps, steps=args.steps, disp_after=args.warmup - 1, rho=RHO, lr=LR,
                     clip=CLIP, unroll=args.unroll, text=text, vocab=vocab, batch=args.batch,
                     vocab_size=vocab.stat().st_size, hidden=args.hidden, gru_params=gru_params, init=init)
    path = folder / "bench_gru.conf"
    path.write_text(job)
    return path


# ------------------------------------------------------------------ the runs

def run_singa(args, conf: pathlib.Path, workspace: pathlib.Path, ranks: int) -> dict:
    """Train in a subprocess on ``ranks`` ranks: ms/step of the warm-up and of the timed steps, and the
    timed steps' mean loss per character, from metrics.jsonl."""
    lines = train_subprocess(conf, workspace, ranks)
    warm, timed = sorted((e for e in lines if e["phase"] == "train"), key=lambda e: e["step"])[-2:]
    return {"ms": 1e3 * args.batch / timed["samples_per_s"], "warmup_ms": 1e3 * args.batch / warm["samples_per_s"],
            "loss": timed["loss"]}


def run_torch(args, text: pathlib.Path, vocab: pathlib.Path) -> dict:
    """:func:`torch_worker` in a subprocess with one thread."""
    cmd = [sys.executable, __file__, "--torch-worker", "--text", str(text), "--vocab", str(vocab)]
    for flag in ("hidden", "batch", "unroll", "steps", "warmup"):
        cmd += [f"--{flag}", str(getattr(args, flag))]
    out = subprocess.run(cmd, check=False, env=bench_env(), capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"PyTorch run failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def torch_worker(args) -> int:
    """The same model, data and update in PyTorch, one thread; prints one JSON line."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    torch.manual_seed(1)
    vocab = np.frombuffer(pathlib.Path(args.vocab).read_bytes(), np.uint8)
    table = np.zeros(256, np.int64)
    table[vocab] = np.arange(len(vocab))
    ids = table[np.frombuffer(pathlib.Path(args.text).read_bytes(), np.uint8)]
    size, batch, unroll, hidden = len(vocab), args.batch, args.unroll, args.hidden
    stream = len(ids) // batch  # kCharRNN's rows: stream i is ids[i*M:(i+1)*M]
    streams = torch.from_numpy(ids[:batch * stream].reshape(batch, stream))
    gru, out = torch.nn.GRU(size, hidden), torch.nn.Linear(hidden, size)
    params = list(gru.parameters()) + list(out.parameters())
    with torch.no_grad():
        for p in params:
            p.uniform_(-INIT, INIT)
    opt = torch.optim.RMSprop(params, lr=LR, alpha=RHO, eps=1e-8)
    state = {"h": torch.zeros(1, batch, hidden), "offset": 0}

    def step() -> float:
        offset = state["offset"]
        window = streams[:, offset:offset + unroll + 1].T  # (unroll + 1, batch)
        x = F.one_hot(window[:-1], size).float()  # (unroll, batch, vocab)
        opt.zero_grad(set_to_none=False)
        y, h = gru(x, state["h"])
        logits = out(y)  # (unroll, batch, vocab)
        loss = F.cross_entropy(logits.reshape(-1, size), window[1:].reshape(-1), reduction="sum") / batch
        loss.backward()
        for p in params:
            p.grad.clamp_(-CLIP, CLIP)
        opt.step()
        nxt = offset + unroll  # kCharRNN: back to 0 (and zeros for h) when the next window would leave a row
        state["offset"] = nxt if nxt + unroll < stream else 0
        state["h"] = h.detach() if state["offset"] else torch.zeros_like(h)
        return loss.item() / unroll

    began = time.perf_counter()
    for _ in range(args.warmup):
        step()
    middle = time.perf_counter()
    losses = [step() for _ in range(args.steps)]
    end = time.perf_counter()
    print(json.dumps({"ms": 1e3 * (end - middle) / args.steps, "warmup_ms": 1e3 * (middle - began) / args.warmup,
                      "loss": float(np.mean(losses)), "torch": torch.__version__}))
    return 0


def measure(args, conf: pathlib.Path, folder: pathlib.Path, text, vocab) -> list[tuple[str, int, dict]]:
    """``--repeat`` interleaved rounds of every run; per row the median (and fastest) of its rounds."""
    runs: dict[tuple[str, int], list[dict]] = {}
    for round_ in range(args.repeat):
        for ranks in args.ranks:
            result = run_singa(args, conf, folder / f"ws{ranks}_{round_}", ranks)
            runs.setdefault(("singa_mpi", ranks), []).append(result)
        runs.setdefault(("pytorch", 1), []).append(run_torch(args, text, vocab))
    rows = []
    for (model, ranks), results in runs.items():
        row = {key: statistics.median(r[key] for r in results) for key in ("ms", "warmup_ms", "loss")}
        row["fastest"] = min(r["ms"] for r in results)
        rows.append((model, ranks, row))
    return rows


# ------------------------------------------------------------------ report

def print_report(rows: list[tuple[str, int, dict]], args, vocab_size: int) -> None:
    """The table, then our 1-rank step time over PyTorch's and our n-rank speed-ups, with verdicts."""
    print(f"GRU char-rnn training step: batch {args.batch}, unroll {args.unroll}, hidden {args.hidden}, vocab "
          f"{vocab_size}, {args.steps} timed steps after {args.warmup} warm-up, one thread per process, "
          f"{os.cpu_count()} cores, median of {args.repeat} round(s)")
    print(f"{'model':<11}{'ranks':>6}{'ms/step':>10}{'fastest':>10}{'warm-up ms/step':>17}{'loss':>8}")
    for model, ranks, r in rows:
        print(f"{model:<11}{ranks:>6}{r['ms']:>10.1f}{r['fastest']:>10.1f}{r['warmup_ms']:>17.1f}{r['loss']:>8.3f}")
    ours = {ranks: r for model, ranks, r in rows if model == "singa_mpi"}
    torch_ms = rows[-1][2]["ms"]
    if 1 in ours:
        ratio = ours[1]["ms"] / torch_ms
        print(f"step time ratio singa_mpi 1 rank / PyTorch 1 thread: {ratio:.2f}x "
              f"(goal <= {GOAL_RATIO:.1f}x: {verdict(ratio <= GOAL_RATIO)}; fastest rounds: "
              f"{ours[1]['fastest'] / rows[-1][2]['fastest']:.2f}x)")
        for ranks, r in ours.items():
            if ranks > 1:
                speedup = ours[1]["ms"] / r["ms"]
                goal = GOAL_SPEEDUP.get(ranks)
                target = f"goal >= {goal:.1f}x: {verdict(speedup >= goal)}" if goal else "no goal at this rank count"
                print(f"speed-up singa_mpi {ranks} ranks over 1 rank: {speedup:.2f}x ({target}; fastest rounds: "
                      f"{ours[1]['fastest'] / r['fastest']:.2f}x)")
    print("ms/step: whole training steps (forward, backward, clipping, RMSProp update), the mean over the timed "
          "steps; warm-up: the first steps, with their one-time costs; loss: mean cross-entropy per character "
          "over the timed steps (same text and sizes; the inits differ)")
    print(NOTE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    # SINGA's examples/char-rnn sizes: hidden 512, batch 50, unroll 50
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--unroll", type=int, default=50)
    parser.add_argument("--steps", type=int, default=30, help="timed training steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed training steps before them")
    parser.add_argument("--repeat", type=int, default=5, help="rounds of every run; step times: their median")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max-bytes", type=int, default=2_000_000, help="text corpus size (data text --max-bytes)")
    parser.add_argument("--keep", help="work in this folder and keep it (default: a temporary one, removed)")
    parser.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--text", help=argparse.SUPPRESS)
    parser.add_argument("--vocab", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be at least 1")
    blas_threads_as_train()  # as `singa-mpi train` chooses (benchkit); before any numpy work
    if args.torch_worker:
        return torch_worker(args)
    if importlib.util.find_spec("torch") is None:
        print("bench_gru: skipped: PyTorch is not installed (pip install torch); it is this benchmark's reference")
        return 0
    folder = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="bench_gru_"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        text, vocab = prepare_text(folder, args.max_bytes)
        conf = write_job(args, folder, text, vocab)
        rows = measure(args, conf, folder, text, vocab)
        print_report(rows, args, vocab.stat().st_size)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
