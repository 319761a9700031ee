"""Sentences through a translate or score function on the host: in batches
of similar length, several batches at once on threads, the results back
in the lines' order.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np


def as_text(value) -> str:
    """A signature's string output (bytes; undecodable bytes become U+FFFD) as str."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def translate_lines(translate_fn, lines, batch_size: int = 64, progress=None,
                    keys=("translation", "score", "source_tokens", "target_tokens", "alignment"),
                    parallel_batches: int = 2) -> dict:
    """Translates all `lines` (str or bytes) and returns {key: list in input order}.

    Sentences are sorted by length and batched (less padding, fewer wasted
    decoding steps), `parallel_batches` batches at once on as many threads
    (one batch's search leaves the cores part of the time idle; see
    `nmt_tf.translate --parallel_batches`); the results come back in the
    order of `lines`. Token lists drop their "" padding and alignments are
    cut to [target tokens, source tokens].
    """
    lines = [l.encode("utf-8") if isinstance(l, str) else l for l in lines]
    results = {k: [None] * len(lines) for k in keys}
    run = lambda batch: {k: np.asarray(v) for k, v in translate_fn(batch).items()}   # tensors or arrays
    for index, out in batches_by_length(run, lines, batch_size, parallel_batches):
        _collect(out, index, keys, results)
        if progress is not None:
            progress.update(len(index))
    return results


def batches_by_length(call, lines: list, batch_size: int, parallel_batches: int = 1, by_length: bool = True,
                      length=lambda line: len(line.split())):
    """Yields (index, call([lines[i] for i in index])) for the batches of
    `batch_size` lines, in order: with `by_length`, batches of similar length
    (by `length`, words by default; shortest first), else in the order of
    `lines`. `parallel_batches` calls run at once on as many threads; after
    an error the batches not started are dropped."""
    order = list(range(len(lines)))
    if by_length:
        order.sort(key=lambda i: length(lines[i]))
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    pool = concurrent.futures.ThreadPoolExecutor(parallel_batches)
    try:
        yield from zip(batches, pool.map(lambda index: call([lines[i] for i in index]), batches))
    finally:
        pool.shutdown(cancel_futures=True)


def scored_pairs(score_fn, sources, targets, batch_size: int = 64) -> list:
    """The (batch result, row) of each (source, target) pair (str or bytes),
    in order, from `score_fn(sources, targets)` (a score signature's call,
    byte strings in) over batches of similar target length (by words)."""
    pairs = [(s.encode("utf-8") if isinstance(s, str) else s, t.encode("utf-8") if isinstance(t, str) else t)
             for s, t in zip(sources, targets)]
    call = lambda batch: score_fn([s for s, _ in batch], [t for _, t in batch])
    return rows_by_line(batches_by_length(call, pairs, batch_size, length=lambda pair: len(pair[1].split())),
                        len(pairs))


def rows_by_line(batched, count: int, on_batch=None) -> list:
    """The (batch result, row) of each of `count` lines, in the lines' order,
    from `batches_by_length`'s (index, result) pairs; `on_batch(n)` is called
    after each batch of n lines (progress)."""
    rows = [None] * count
    for index, result in batched:
        for row, i in enumerate(index):
            rows[i] = (result, row)
        if on_batch:
            on_batch(len(index))
    return rows


def _collect(out: dict, index: list, keys, results: dict) -> None:
    """Rows of one batch's `out` into `results` at the lines' positions `index`."""
    for row, i in enumerate(index):
        src = [t.decode("utf-8") for t in out["source_tokens"][row] if t]
        tgt = [t.decode("utf-8") for t in out["target_tokens"][row] if t]
        for key in keys:
            value = out[key][row]
            if key == "source_tokens":
                value = src
            elif key == "target_tokens":
                value = tgt
            elif key == "alignment":
                value = np.asarray(value[:len(tgt), :len(src)])
            elif isinstance(value, bytes):
                value = value.decode("utf-8")
            elif isinstance(value, np.ndarray) and value.dtype.kind == "O":
                value = [v.decode("utf-8") for v in value]
            else:
                value = value.item() if hasattr(value, "item") else value
            results[key][i] = value
