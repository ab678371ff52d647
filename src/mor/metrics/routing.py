"""Router evaluation metrics for MoR (arXiv 2507.10524, App. G.2, Sec. 4 / Fig. 5b, Fig. 1).

Pure functions: numpy arrays or torch tensors (duck-typed, torch is never imported) in,
plain Python floats / lists / dicts out. No model imports.

Expert-choice: ``dead_token_ratio``, ``sampling_accuracy``, ``router_output_histogram``.
Token-choice:  ``max_vio``, ``selection_entropy``.
Both:          ``depth_histogram``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = [
    "max_vio",
    "selection_entropy",
    "dead_token_ratio",
    "sampling_accuracy",
    "router_output_histogram",
    "depth_histogram",
]


def _as_array(x: Any, name: str) -> np.ndarray:
    """Convert numpy / torch / list input to a numpy array; reject empty input."""
    if hasattr(x, "detach"):  # torch tensor (bf16/fp16 are not numpy-convertible)
        x = x.detach().cpu()
        if x.is_floating_point():
            x = x.float()
        x = x.numpy()
    arr = np.asarray(x)
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    return arr


def _as_bool(x: Any, name: str) -> np.ndarray:
    arr = _as_array(x, name)
    if arr.dtype != np.bool_:
        raise ValueError(f"{name} must be a bool array, got dtype {arr.dtype}")
    return arr


def _as_ids(x: Any, name: str, lo: int, hi: int) -> np.ndarray:
    """Flattened integer ids, validated to lie in [lo, hi]."""
    arr = _as_array(x, name)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {arr.dtype}")
    arr = arr.reshape(-1).astype(np.int64)
    if arr.min() < lo or arr.max() > hi:
        raise ValueError(f"{name} values must lie in [{lo}, {hi}], got [{arr.min()}, {arr.max()}]")
    return arr


def _check_n(n: int, name: str) -> None:
    if int(n) != n or n < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {n}")


def max_vio(assignment: Any, n_experts: int) -> float:
    """MaxVio (App. G.2, Wang et al. 2024):  (max_i Load_i - mean Load) / mean Load.

    Load_i = number of tokens assigned (top-1) to expert i; mean Load = N / Nr (perfect balance).
    ``assignment``: integer expert ids in [0, Nr), any shape (flattened). 0 = perfectly balanced.
    """
    _check_n(n_experts, "n_experts")
    a = _as_ids(assignment, "assignment", 0, n_experts - 1)        # (N,)
    load = np.bincount(a, minlength=n_experts)                      # (Nr,)
    mean_load = a.size / n_experts
    return float((load.max() - mean_load) / mean_load)


def selection_entropy(probs: Any, *, normalize: bool = False) -> float:
    """Entropy of the mean selection probabilities (App. G.2):  H = -sum_i p̄_i log p̄_i.

    ``probs``: (N, Nr) per-token selection probabilities (leading dims flattened);
    p̄ = mean over the N tokens; natural log; terms with p̄_i = 0 contribute 0. Uniform routing
    gives log Nr. ``normalize=True`` rescales p̄ to sum to 1 first (for sigmoid routers whose
    per-token probabilities do not sum to 1); the default is the paper's formula as written.
    """
    p = _as_array(probs, "probs").astype(np.float64)
    if p.ndim < 2:
        raise ValueError(f"probs must have shape (N, Nr), got {p.shape}")
    if not np.all(np.isfinite(p)) or p.min() < 0:
        raise ValueError("probs must be finite and non-negative")
    p_bar = p.reshape(-1, p.shape[-1]).mean(axis=0)                 # (Nr,)
    if normalize:
        total = p_bar.sum()
        if total <= 0:
            raise ValueError("probs sum to zero; cannot normalize")
        p_bar = p_bar / total
    nz = p_bar[p_bar > 0]
    return float(-(nz * np.log(nz)).sum())


def dead_token_ratio(selected_last: Any) -> float:
    """Dead token ratio (App. G.2): share of token positions never selected at the last recursion.

    Interpretation: ``selected_last`` is the (batch, seq) bool top-k membership at the FINAL
    recursion step. A position t is "dead" when no sequence in the batch selects it,
    i.e. all(~selected_last[:, t]); the ratio is mean_t of that indicator. It measures positional
    bias (the router always dropping the same positions). With Nr=3 the last step keeps 1/3 of
    the tokens, so the maximum is 2/3 -- the paper's 66.7% means fully position-fixed selection.
    """
    s = _as_bool(selected_last, "selected_last")
    if s.ndim != 2:
        raise ValueError(f"selected_last must have shape (batch, seq), got {s.shape}")
    dead = ~s.any(axis=0)                                           # (seq,)
    return float(dead.mean())


def sampling_accuracy(pred_selected: Any, topk_selected: Any) -> float:
    """Sampling accuracy (App. G.2): mean over tokens of 1[pred_selected == topk_selected].

    ``pred_selected``: the causal inference-time router decision (e.g. sigmoid(z) > 0.5, or the
    auxiliary router's prediction); ``topk_selected``: the training-time top-k membership.
    Both bool, same shape, e.g. (Nr, batch, seq); averaged over every token and recursion given.
    """
    p = _as_bool(pred_selected, "pred_selected")
    t = _as_bool(topk_selected, "topk_selected")
    if p.shape != t.shape:
        raise ValueError(f"pred_selected shape {p.shape} != topk_selected shape {t.shape}")
    return float((p == t).mean())


def router_output_histogram(
    scores: Any,
    selected: Any,
    bins: int | Sequence[float] = 50,
    value_range: tuple[float, float] | None = None,
) -> dict:
    """Normalised histograms of router outputs, selected vs unselected tokens (Fig. 5b).

    ``scores``: router outputs g (any shape); ``selected``: bool top-k membership, same shape.
    ``bins``: number of bins or explicit edges; both groups share the same edges (over
    ``value_range`` or the range of all scores). Each group's counts are divided by the
    group's size so they sum to 1 (all zeros for an empty group).
    Returns {"bin_edges": [...], "selected": [...], "unselected": [...],
             "n_selected": int, "n_unselected": int}.
    """
    s = _as_array(scores, "scores").astype(np.float64)
    m = _as_bool(selected, "selected")
    if s.shape != m.shape:
        raise ValueError(f"selected shape {m.shape} != scores shape {s.shape}")
    if isinstance(bins, (int, np.integer)):
        if bins < 1:
            raise ValueError(f"bins must be >= 1, got {bins}")
    elif len(bins) < 2:
        raise ValueError("bins must be an int or at least 2 edges")
    edges = np.histogram_bin_edges(s, bins=bins, range=value_range)     # (n_bins + 1,)

    def norm_counts(v: np.ndarray) -> list[float]:
        c, _ = np.histogram(v, bins=edges)
        return (c / v.size).tolist() if v.size else [0.0] * (len(edges) - 1)

    return {
        "bin_edges": edges.tolist(),
        "selected": norm_counts(s[m]),
        "unselected": norm_counts(s[~m]),
        "n_selected": int(m.sum()),
        "n_unselected": int((~m).sum()),
    }


def depth_histogram(depths: Any, n_recursions: int) -> list[int]:
    """Tokens per recursion depth: out[d-1] = #{tokens with depth d}, d = 1..Nr (Fig. 1, Table 17).

    ``depths``: integer recursion depths in [1, Nr], any shape (flattened).
    """
    _check_n(n_recursions, "n_recursions")
    d = _as_ids(depths, "depths", 1, n_recursions)                 # (N,)
    return np.bincount(d - 1, minlength=n_recursions).tolist()
