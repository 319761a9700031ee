"""PNG pictures: attention heatmaps (paper 000 Fig. 3), BLEU curves (Fig. 2),
grConv trees (paper 002 Fig. 6) and maps of word and phrase representations
(paper 004 Figs. 4, 5).

Rendered with matplotlib's Agg backend (no display needed); every function
returns PNG bytes, which callers write to files or decode for TensorBoard.
"""

from __future__ import annotations

import io

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


DPI = 100


def _png(fig) -> bytes:
    """PNG of exactly figsize x DPI pixels (constrained layout keeps the labels inside)."""
    plt = _pyplot()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    plt.close(fig)
    return buffer.getvalue()


def attention_size(n_source: int, n_target: int) -> tuple[float, float]:
    """Figure size in inches of a heatmap: room for the token labels on both axes."""
    return max(4.0, 0.3 * n_source + 2.0), max(3.0, 0.3 * n_target + 2.0)


def attention_png(source_tokens: list[str], target_tokens: list[str], alignment, title: str | None = None) -> bytes:
    """The alignment matrix as a grey-scale image, as in paper 000 Fig. 3.

    Source words along the x axis (top), generated words along the y axis;
    pixel (i, j) is alpha_ij, from black (0) to white (1).

    Args:
      source_tokens: the S source tokens (with "[EOS]").
      target_tokens: the T generated tokens (with "[EOS]").
      alignment: [T, S] attention weights.
    """
    plt = _pyplot()
    alignment = np.asarray(alignment, dtype=np.float32)[:len(target_tokens), :len(source_tokens)]
    fig, ax = plt.subplots(figsize=attention_size(len(source_tokens), len(target_tokens)), layout="constrained")
    ax.imshow(alignment, cmap="gray", vmin=0.0, vmax=1.0, aspect="equal", interpolation="nearest")
    ax.set_xticks(range(len(source_tokens)))
    ax.set_xticklabels(source_tokens, rotation=90, fontsize=9)
    ax.set_yticks(range(len(target_tokens)))
    ax.set_yticklabels(target_tokens, fontsize=9)
    ax.xaxis.tick_top()
    if title:
        fig.suptitle(title, fontsize=9)
    return _png(fig)


def bleu_png(series: dict[str, list[tuple[str, float | None]]], xlabel: str, title: str,
             ylabel: str = "BLEU") -> bytes:
    """One labelled line per model over shared x categories (None values are gaps)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    for label, points in series.items():
        xs = list(range(len(points)))
        ys = [np.nan if v is None else v for _, v in points]
        ax.plot(xs, ys, marker="o", label=label)
        ax.set_xticks(xs)
        ax.set_xticklabels([x for x, _ in points])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    return _png(fig)


def png_to_tensor(png: bytes):
    """PNG bytes -> [1, H, W, 4] uint8 tensor for tf.summary.image."""
    import tensorflow as tf

    return tf.image.decode_png(png, channels=4)[None]


def grconv_tree_png(tokens: list[str], gates, threshold: float = 0.1, title: str | None = None) -> bytes:
    """The structure a grConv encoder built for one sentence (paper 002 Fig. 6).

    Leaves are the words (level 0); node j of level t sits above the words
    j..j+t it covers. Each node is joined to its children by its gating
    coefficients: a solid line to the left child when w_l > threshold, to the
    right child when w_r > threshold, and dashed lines to both when the new
    activation's w_c > threshold; line opacity is the coefficient.

    Args:
      tokens: the L source tokens (with "[EOS]").
      gates: [L-1, L-1, 3] (level t-1, node j, [w_c, w_l, w_r]) of this sentence.
    """
    plt = _pyplot()
    gates = np.asarray(gates, dtype=np.float32)
    n = len(tokens)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.75 * n + 1.0), max(3.0, 0.45 * n + 1.5)), layout="constrained")
    pos = lambda t, j: (j + t / 2.0, t)
    for t in range(1, n):
        for j in range(n - t):
            w_c, w_l, w_r = gates[t - 1, j]
            (x, y), (xl, yl), (xr, yr) = pos(t, j), pos(t - 1, j), pos(t - 1, j + 1)
            for weight, (cx, cy) in ((w_l, (xl, yl)), (w_r, (xr, yr))):
                if weight > threshold:
                    ax.plot([x, cx], [y, cy], color="black", alpha=float(min(1.0, weight)), lw=1.5)
            if w_c > threshold:
                for cx, cy in ((xl, yl), (xr, yr)):
                    ax.plot([x, cx], [y, cy], color="tab:blue", ls="--", alpha=float(min(1.0, w_c)), lw=1.0)
    xs = [pos(t, j)[0] for t in range(n) for j in range(n - t)]
    ys = [pos(t, j)[1] for t in range(n) for j in range(n - t)]
    ax.scatter(xs, ys, s=12, color="grey", zorder=3)
    for j, token in enumerate(tokens):
        ax.text(j, -0.35, token, rotation=60, ha="right", va="top", fontsize=9)
    ax.set_ylim(-2.5, n - 0.5)
    ax.set_xlim(-1.0, n)
    ax.axis("off")
    ax.set_title(title or f"grConv structure (edges with gating coefficient > {threshold})", fontsize=9)
    return _png(fig)


MAP_LABELS = 150           # at most this many labels on a representation map


def spread_labels(points, max_labels: int = MAP_LABELS, spacing: float = 0.03) -> list[int]:
    """Which points of a map get a label: in the given order (the caller's
    priority, e.g. most frequent first), each point whose label would not
    sit nearer than `spacing` x the map's extent to one already chosen, up to
    `max_labels`.

    Args:
      points: [N, 2] coordinates.

    Returns:
      The chosen indices, in order.
    """
    points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    if not len(points):
        return []
    extent = float(np.max(np.ptp(points, axis=0))) or 1.0
    chosen: list[int] = []
    for i, p in enumerate(points):
        if len(chosen) == max_labels:
            break
        if not chosen or np.min(np.linalg.norm(points[chosen] - p, axis=1)) >= spacing * extent:
            chosen.append(i)
    return chosen


def representation_map_png(points, labels: list[str], title: str, groups: list[str] | None = None,
                           max_labels: int = MAP_LABELS) -> bytes:
    """A 2-D map of learned vectors with their labels, as paper 004 shows the
    word embeddings (Fig. 4) and the phrase representations (Fig. 5).

    Args:
      points: [N, 2] coordinates (t-SNE of the vectors,
        `nmt_tf.evaluation.representations.tsne_2d`).
      labels: the N words or phrases, in priority order for labelling.
      title: the figure's title.
      groups: optional N group names; each group gets a colour and a legend
        entry (e.g. phrase lengths).
      max_labels: labels are drawn for at most this many points, chosen by
        `spread_labels` so that they do not pile up; the title says how many.
    """
    plt = _pyplot()
    points = np.asarray(points, dtype=np.float32).reshape(-1, 2)
    n = len(points)
    side = float(np.clip(0.8 * np.sqrt(n) + 3.0, 6.0, 16.0))
    fig, ax = plt.subplots(figsize=(side, side), layout="constrained")
    names = list(dict.fromkeys(groups)) if groups is not None else [None]
    for k, name in enumerate(names):
        members = [i for i in range(n) if groups is None or groups[i] == name]
        ax.scatter(points[members, 0], points[members, 1], s=10, color=f"C{k % 10}", label=name, alpha=0.8)
    chosen = spread_labels(points, max_labels)
    for i in chosen:
        ax.annotate(labels[i], points[i], xytext=(2, 2), textcoords="offset points", fontsize=7)
    if groups is not None:
        ax.legend(fontsize=8, loc="best")
    ax.set_xticks([])
    ax.set_yticks([])
    shown = f"all {n} labelled" if len(chosen) == n else f"{len(chosen)} of {n} labelled"
    ax.set_title(f"{title}\n(t-SNE, {shown})", fontsize=10)
    return _png(fig)
