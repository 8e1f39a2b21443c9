"""Make the rnnlm example's data: kvfiles of WordRecords, as SINGA 0.3's create_data.cc made them.

    python examples/rnnlm/create_data.py --python-docs --out examples/rnnlm
    python examples/rnnlm/create_data.py --train train.txt --valid valid.txt [--test test.txt] --out DIR

Writes DIR/train_data.bin, DIR/valid_data.bin (and DIR/test_data.bin), the paths SINGA's job.conf
reads, and DIR/vocab.txt (word, index, class).  Input text has one sentence per line, words
separated by white space; the end of each line is the word ``</s>`` (index 0), as in the RNNLM
toolkit's corpora.  ``--python-docs`` makes such a corpus from the docstrings of Python's own
standard library (a few MB of English that every Python installation has; no download).

The vocabulary and its classes follow create_data.cc: words by descending count in the training
text (``</s>`` first), cut into ``--class-size`` classes of about equal total frequency.  Beyond
SINGA: ``--vocab-size N`` keeps the N-1 most frequent words and maps the others to ``<unk>``, so
that the vocabulary fits the job's ``vocab_size`` (3720 in SINGA's job.conf); SINGA dropped the
validation and test words its vocabulary lacked, and so does this script without ``<unk>``.
"""
from __future__ import annotations

import argparse
import ast
import collections
import os
import re
import sys
import sysconfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # rnnlm_pb2, beside this file

from singa_mpi import plugins  # noqa: E402,F401 -- maps job_pb2 for rnnlm_pb2's import
import rnnlm_pb2  # noqa: E402

from singa_mpi.data.convert import atomic_path  # noqa: E402
from singa_mpi.data.stores import KVFileWriter  # noqa: E402

END, UNKNOWN = "</s>", "<unk>"
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.python_docs:
        train, valid, test = python_docs_corpus(args.max_words)
    else:
        if not (args.train and args.valid):
            raise SystemExit("create_data.py: give --train and --valid text files, or --python-docs")
        train, valid = read_sentences(args.train), read_sentences(args.valid)
        test = read_sentences(args.test) if args.test else []
    vocab = build_vocab(train, args.vocab_size)
    classes = split_classes([count for _, count in vocab], args.class_size)
    os.makedirs(args.out, exist_ok=True)
    for name, sentences in (("train", train), ("valid", valid), ("test", test)):
        if sentences:
            path = os.path.join(args.out, f"{name}_data.bin")
            written = write_words(path, sentences, vocab, classes)
            print(f"wrote {path}: {written} words")
    with open(os.path.join(args.out, "vocab.txt"), "w") as f:
        for index, (word, count) in enumerate(vocab):
            f.write(f"{word}\t{index}\t{classes[index]}\t{count}\n")
    print(f"vocabulary: {len(vocab)} words in {max(classes) + 1} classes ({os.path.join(args.out, 'vocab.txt')})")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--python-docs", action="store_true", help="make the corpus from the standard library's docstrings")
    p.add_argument("--train", help="training text, one sentence per line")
    p.add_argument("--valid", help="validation text")
    p.add_argument("--test", help="test text (optional)")
    p.add_argument("--out", required=True, help="folder for train_data.bin, valid_data.bin, test_data.bin, vocab.txt")
    p.add_argument("--class-size", type=int, default=100, help="word classes (default 100, SINGA's numclass)")
    p.add_argument("--vocab-size", type=int, default=3720,
                   help="at most this many words, <unk> and </s> included (default 3720, SINGA's job.conf); "
                        "0 keeps every word")
    p.add_argument("--max-words", type=int, default=80000, help="--python-docs: training words (default 80000)")
    return p


def read_sentences(path: str) -> list[list[str]]:
    """Lines of white-space separated words (empty lines kept: they are a lone ``</s>``)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return [line.split() for line in f]


def python_docs_corpus(max_words: int) -> tuple[list[list[str]], list[list[str]], list[list[str]]]:
    """(train, valid, test) sentences from the docstrings of the standard library, lower-cased words
    only; every 20th sentence goes to validation, the next to test; the training part stops at
    ``max_words`` words (each sentence's ``</s>`` counted)."""
    train, valid, test, words = [], [], [], 0
    for k, sentence in enumerate(_docstring_sentences()):
        part = k % 20
        if part == 0:
            valid.append(sentence)
        elif part == 1:
            test.append(sentence)
        elif words < max_words:
            train.append(sentence)
            words += len(sentence) + 1
        if words >= max_words and len(valid) * 18 >= len(train):
            break
    return train, valid, test


def _docstring_sentences():
    root = sysconfig.get_paths()["stdlib"]
    for folder, dirs, files in sorted(os.walk(root)):
        dirs[:] = sorted(d for d in dirs if d not in ("test", "tests", "idle_test", "site-packages", "__pycache__"))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
            except (SyntaxError, UnicodeDecodeError, OSError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    for text in _SENTENCE_END.split(doc or ""):
                        words = _WORD.findall(text.lower())
                        if 4 <= len(words) <= 40:
                            yield words


def build_vocab(sentences: list[list[str]], limit: int) -> list[tuple[str, int]]:
    """(word, count) by descending count, ``</s>`` first (create_data.cc's learnVocab and sortVocab);
    beyond ``limit`` words the rarest become ``<unk>``."""
    counts = collections.Counter(word for sentence in sentences for word in sentence)
    ranked = sorted(counts.items(), key=lambda item: -item[1])  # stable: ties keep first appearance
    end = (END, len(sentences))
    if limit and len(ranked) + 1 > limit:
        kept, dropped = ranked[:limit - 2], ranked[limit - 2:]
        unknown = (UNKNOWN, sum(count for _, count in dropped))
        return [end] + sorted(kept + [unknown], key=lambda item: -item[1])
    return [end] + ranked


def split_classes(counts: list[int], class_size: int) -> list[int]:
    """Each word's class (create_data.cc's splitClasses with old_classes = 1): words in vocabulary order
    fill class a until the running frequency passes (a + 1) / class_size."""
    total = float(sum(counts))
    classes, running, current = [], 0.0, 0
    for count in counts:
        running = min(running + count / total, 1.0)
        classes.append(current)
        if running > (current + 1) / class_size and current < class_size - 1:
            current += 1
    return classes


def write_words(path: str, sentences: list[list[str]], vocab: list[tuple[str, int]], classes: list[int]) -> int:
    """One WordRecord per word, ``</s>`` after each sentence; keys 00000, 00001, ... as SINGA's."""
    index = {word: i for i, (word, _) in enumerate(vocab)}
    first, last = {}, {}
    for i, c in enumerate(classes):
        first.setdefault(c, i)
        last[c] = i + 1
    record, written = rnnlm_pb2.WordRecord(), 0
    with atomic_path(path) as tmp:
        writer = KVFileWriter(tmp)
        try:
            for sentence in sentences:
                for word in sentence + [END]:
                    i = index.get(word, index.get(UNKNOWN))
                    if i is None:
                        continue  # SINGA skipped words its vocabulary lacks
                    c = classes[i]
                    record.word, record.word_index, record.class_index = word, i, c
                    record.class_start, record.class_end = first[c], last[c]
                    writer.write(f"{written:05d}", record)
                    written += 1
        finally:
            writer.file.close()
    return written


if __name__ == "__main__":
    sys.exit(main())
