"""Tokenize batches of documents on every CPU of the job, in order, with bounded memory.

Why processes: the fast tokenizer's batch encoding runs in Rust, but turning its ids into
arrays is Python work, and one process tops out far below a 32-core node. Each worker
process loads the tokenizer once and turns a batch of texts into one token array (EOS after
every document) plus the documents' lengths. At most ``2 x workers`` batches are in flight,
and results come back in submission order, so the writer sees the same token stream as a
single process would, whatever the number of workers. A worker that dies (OOM killer)
breaks the pool and fails the job with that cause; a worker whose parent was killed exits
by itself, so ``kill -9`` of a job leaves no orphans.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Iterable, Iterator

import numpy as np

from mor.data.shards import Chunk, Position

_TOK = None  # the worker's tokenizer
_DTYPE = None


def encode(tok, dtype: np.dtype, start: Position, texts: list[str]) -> Chunk:
    """One batch -> ``Chunk``: every document's ids then EOS; the first loses ``start.offset`` tokens."""
    ids = tok.encode_batch(texts)
    lengths = np.fromiter((len(x) + 1 for x in ids), dtype=np.int64, count=len(ids))
    tokens = np.empty(int(lengths.sum()), dtype=dtype)
    pos = 0
    for x, n in zip(ids, lengths):
        tokens[pos:pos + n - 1] = x
        tokens[pos + n - 1] = tok.eos_id
        pos += n
    if start.offset:
        if start.offset >= lengths[0]:
            raise ValueError(f"offset {start.offset} is past the end of document {start} ({lengths[0]} tokens)")
        tokens, lengths = tokens[start.offset:], lengths.copy()
        lengths[0] -= start.offset
    return Chunk(start, tokens, lengths)


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(1.0)


def _init(tokenizer: str, dtype: str, parent: int) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker: the pool is the parallelism
    os.environ["RAYON_NUM_THREADS"] = "1"
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    from mor.data.tokenizer import load_tokenizer

    global _TOK, _DTYPE
    _TOK, _DTYPE = load_tokenizer(tokenizer), np.dtype(dtype)


def _encode_in_worker(start: Position, texts: list[str]) -> Chunk:
    return encode(_TOK, _DTYPE, start, texts)


def encode_batches(batches: Iterable[tuple[Position, list[str]]], tokenizer: str, dtype: np.dtype,
                   workers: int) -> Iterator[Chunk]:
    """Chunks of ``batches`` in order, tokenized by ``workers`` processes (inline when 1)."""
    if workers <= 1:
        from mor.data.tokenizer import load_tokenizer

        tok = load_tokenizer(tokenizer)
        for start, texts in batches:
            yield encode(tok, dtype, start, texts)
        return
    ctx = get_context("spawn")  # no fork of a process that may hold datasets' / fsspec's threads
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init,
                               initargs=(str(tokenizer), np.dtype(dtype).str, os.getpid()))
    pending: collections.deque = collections.deque()
    try:
        for start, texts in batches:
            pending.append(pool.submit(_encode_in_worker, start, texts))
            if len(pending) >= 2 * workers:
                yield _result(pending.popleft())
        while pending:
            yield _result(pending.popleft())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _result(future) -> Chunk:
    try:
        return future.result()
    except BrokenProcessPool as e:
        raise RuntimeError(f"a tokenizer worker process died ({e}); out of memory? "
                           "Run the data rule again: it resumes at the first unfinished shard") from None


def available_cpus() -> int:
    """CPUs this process may run on (Slurm's cpus_per_task binds the job to them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
