"""App. E's relative maximum decoding batch for MoR-2/3/4 at 360M, two ways side by side.

(a) the seed's simplification: 32 x 2Nr/(Nr+1) (= 42.7 / 48 / 51.2; the seed states 42 / 48 /
    51), i.e. the whole model's memory treated as a KV cache that recursion-wise caching
    shrinks to (Nr+1)/(2Nr);
(b) the exact count (``mor.flops.max_batch``): how many sequences' KV caches fit beside the
    parameters in the GPU's memory, with the unshared first and last layers caching every
    position, recursion r of the expert-choice MoR model caching c_r of them, and MoR-4
    (34 layers: 1 + 8x4 + 1) against a 34-layer vanilla, as App. E does.

Written into the table9 folder (``tables/table9/maxbatch.md`` / ``.csv``): it needs no
training, only the 360M shape, and sits beside the table whose FLOPs model it shares.
Assumptions are stated in the note, not tuned: no constant is fitted to the seed's numbers.
"""

from __future__ import annotations

import pandas as pd

from mor.config import ModelConfig, load_scales
from mor.flops import max_batch, model_bytes, param_count, relative_max_batch, relative_max_batch_exact

GPU_MEMORY = 80e9  # H100 80 GB (App. E: "based on the H100 GPU's VRAM size"), decimal bytes
DTYPE_BYTES = 2  # bf16 weights and KV cache
MAX_LENS = (256, 2048)  # App. E's mean generation length (no prefix); the training context
VOCAB = 49152
SEED = {2: 42, 3: 48, 4: 51}


def mor_config(nr: int) -> ModelConfig:
    """MoR-Nr at 360M; MoR-4 at App. E's 34 layers (1 + 8x4 + 1): the floor depth rule (mor.depth)
    would give 32 layers 1 + 7x4 + 1 = 30, so the paper's extra layers are set here."""
    return ModelConfig(scale="360M", variant="mor", tying="middle_cycle", num_recursions=nr, kv="recursion_wise",
                       layers=34 if nr == 4 else 0)


def vanilla_for(nr: int) -> ModelConfig:
    """App. E: MoR-4 runs 34 layers, and so does its vanilla baseline."""
    return ModelConfig(scale="360M", layers=34 if nr == 4 else 0)


def max_batch_table(memory: float = GPU_MEMORY, max_lens: tuple[int, ...] = MAX_LENS) -> pd.DataFrame:
    s = load_scales()["360M"]
    rows = []
    for nr in (2, 3, 4):
        m, v = mor_config(nr), vanilla_for(nr)
        row = {"Model": f"MoR-{nr}", "Vanilla layers": v.layers or s.layers,
               "Params (MoR / vanilla)": f"{param_count(m, s, VOCAB):,} / {param_count(v, s, VOCAB):,}",
               "Seed": SEED[nr], "(a) 32 x 2Nr/(Nr+1)": round(relative_max_batch(nr), 1)}
        for L in max_lens:
            row[f"(b) exact, len {L}"] = round(relative_max_batch_exact(m, v, s, VOCAB, L, memory, 32, DTYPE_BYTES), 1)
            row[f"max batch MoR / vanilla, len {L}"] = (f"{max_batch(m, s, VOCAB, L, memory, DTYPE_BYTES):,} / "
                                                       f"{max_batch(v, s, VOCAB, L, memory, DTYPE_BYTES):,}")
        rows.append(row)
    return pd.DataFrame(rows)


def note(memory: float = GPU_MEMORY) -> str:
    s = load_scales()["360M"]
    gb = model_bytes(ModelConfig(scale="360M"), s, VOCAB, DTYPE_BYTES) / 1e9
    return (f"Assumptions: {memory / 1e9:.0f} GB of GPU memory (H100), bf16 weights and KV cache ({DTYPE_BYTES} bytes), "
            f"360M shape of grids/scales.yaml (d={s.hidden}, {s.layers} layers, {s.kv_heads} KV heads x "
            f"{s.head_dim}), vocabulary {VOCAB}; MoR: Middle-Cycle, expert-choice with hierarchical capacities, "
            "recursion-wise caching (recursion r caches ceil(c_r L) positions); parameters counted once "
            f"(vanilla 360M: {gb:.2f} GB); activations of the current position neglected (App. E). Each KV cache is "
            "sized for a whole sequence of L positions (a static cache); L = 256 is App. E's mean generation "
            "length, L = 2048 the training context. (a) is exact only when parameters are negligible and no "
            "layer is unshared; (b) counts both, so it sits below (a).")
