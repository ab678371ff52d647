"""Validation NLL: mean negative log-likelihood per token on held-out windows.

The validation split is cut into consecutive, non-overlapping windows of ``seq_len + 1``
tokens (the +1 supplies the last target); every window is scored in full, so the number
is deterministic and independent of the batch size. MoR models route with the same
top-k as in training (teacher-forced scoring, ``val_nll``: the paper's number). That top-k
looks at the whole window, so a token's depth depends on later tokens; ``val_nll_causal``
scores the same windows with the causal decision decoding uses (``full_forward_causal``: the
aux router's / aux-loss router's own logit, mor.model.decode), the number a deployed model
would get. For Vanilla and Recursive models the two are the same computation. Router statistics: depth histogram for
both routers; dead-token ratio and sampling accuracy for expert-choice; MaxVio and the
entropy of the mean selection probabilities for token-choice (App. G.2).
"""

from __future__ import annotations

import numpy as np
import torch

from mor.metrics import routing as rm


SAMPLE_WINDOWS = 2  # validation windows whose per-token depths are kept (Table 17, Fig. 1)
HIST_BINS = 20


@torch.no_grad()
def evaluate(model, tokens: np.ndarray, seq_len: int, max_tokens: int, batch: int, device) -> dict:
    """Return {'val_nll', 'val_nll_causal', 'val_tokens'} plus router statistics for MoR models.

    For MoR models it also returns, for the figures: ``router_output_hist`` (per recursion,
    normalised histograms of router outputs of selected vs unselected candidates, Fig. 5b)
    and ``sample_token_ids`` / ``sample_token_depths`` (the first windows' tokens and the
    recursion depth each received, Table 17 / Fig. 1).
    """
    model.eval()
    n_windows = min(len(tokens) // (seq_len + 1), max(1, max_tokens // seq_len))
    if n_windows < 1:
        raise ValueError(f"validation split of {len(tokens)} tokens is shorter than one window of {seq_len + 1}")
    windows = np.asarray(tokens[: n_windows * (seq_len + 1)], dtype=np.int64).reshape(n_windows, seq_len + 1)
    nll_sum, causal_sum, count = 0.0, 0.0, 0
    routed = bool(getattr(model, "routers", None))
    selected_last, causal, topk, depths = [], [], [], []
    assign, probs = [], []  # token-choice
    scores, chosen = [], []  # per batch: (Nr, candidates) router outputs and membership
    for i in range(0, n_windows, batch):
        chunk = torch.from_numpy(windows[i : i + batch]).to(device)  # (b, T+1)
        x, y = chunk[:, :-1], chunk[:, 1:]
        out = model(x)
        logp = torch.log_softmax(out.logits.float(), dim=-1)  # (b, T, V)
        nll_sum += -logp.gather(-1, y.unsqueeze(-1)).sum().item()
        count += y.numel()
        if routed:
            from mor.model.decode import full_forward_causal

            logp_c = torch.log_softmax(full_forward_causal(model, x).logits.float(), dim=-1)  # (b, T, V)
            causal_sum += -logp_c.gather(-1, y.unsqueeze(-1)).sum().item()
        if out.routing is not None and out.routing.selected:
            tr = out.routing
            depths.append(tr.depths().cpu())
            scores.append([sc[m].float().cpu() for sc, m in zip(tr.scores, tr.candidates)])
            chosen.append([se[m].cpu() for se, m in zip(tr.selected, tr.candidates)])
            if tr.assignment is not None:  # token-choice: top-1 loads and selection probabilities
                assign.append(tr.assignment.flatten().cpu())
                probs.append(tr.probs.float().reshape(-1, tr.probs.shape[-1]).cpu())  # (b*T, Nr)
            else:
                selected_last.append(tr.selected[-1].cpu())
                # causal decision vs top-k membership, over each recursion's candidates
                causal.append(torch.cat([c[m] for c, m in zip(tr.causal_keep, tr.candidates)]).cpu())
                topk.append(torch.cat([s[m] for s, m in zip(tr.selected, tr.candidates)]).cpu())
    result = {"val_nll": nll_sum / count, "val_nll_causal": (causal_sum if routed else nll_sum) / count,
              "val_tokens": count}
    if depths:
        d = torch.cat(depths).flatten().numpy()
        result.update(mean_depth=float(d.mean()), depth_histogram=rm.depth_histogram(d, model.cfg.num_recursions))
        result["sample_token_ids"] = windows[:SAMPLE_WINDOWS, :-1].flatten().tolist()
        result["sample_token_depths"] = torch.cat(depths)[:SAMPLE_WINDOWS].flatten().tolist()
        result["router_output_hist"] = [
            rm.router_output_histogram(torch.cat([b[r] for b in scores]).numpy(),
                                       torch.cat([b[r] for b in chosen]).numpy(), bins=HIST_BINS)
            for r in range(model.cfg.num_recursions)
        ]
        if assign:  # MaxVio and entropy (App. G.2); sigmoid probs are renormalised to sum to 1
            result.update(
                max_vio=rm.max_vio(torch.cat(assign).numpy(), model.cfg.num_recursions),
                entropy=rm.selection_entropy(torch.cat(probs).numpy(), normalize=True),
            )
        else:
            result.update(
                dead_token_ratio=rm.dead_token_ratio(torch.cat(selected_last).numpy()),
                sampling_accuracy=rm.sampling_accuracy(torch.cat(causal).numpy(), torch.cat(topk).numpy()),
            )
    return result
