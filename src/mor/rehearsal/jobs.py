"""One rehearsal per job kind, each through the function the Slurm job runs (``mor.jobs.KINDS``).

A rehearsal calls the kind's job function with the preset's settings on fake tensors
(``mor.rehearsal.fake``), passing its stand-ins for what fake tensors cannot run through the
job's own parameters (the train job's ``loop`` and ``seams``; the evaluator, the weights reader,
the engine's ``measure``): it patches none of our code. It returns a row for the table: run id, job, world size,
micro-batch, status, and for a train job the peak per GPU by category, measured
(``mor.rehearsal.measure``) and modelled (``mor.memory``).

The train job is the job function up to its training loop: ``train_job`` loads the grid, finds
the data, builds the model, optimizer and sampler, resolves the micro-batch and wraps the model
for DDP / FSDP (over a fake process group of the preset's world size) exactly as on the cluster;
its loop (``Trainer.fit``) is replaced by one ``Trainer.train_step`` (forward, backward, AdamW;
the first, second and last micro-batch of the rank's share of the global batch) under the memory
tracker. A measured peak above what the plan may use of the GPU (``mor.memory.usable_bytes``:
90 % less 1.5 GiB for the CUDA context, NCCL and fragmentation) fails the row.

The eval and lmeval jobs read a finished run, whose final weights a rehearsal does not have:
the job functions run on a stand-in of the run folder (``trained_run_stand_in``: its training
summary and config.json) and build the model under the fake mode at full size on the job's
device; only the weight *read* is skipped (status "ok (weights not read)"). Eval scores one batch
at ``eval.batch``; lmeval scores one batch of full windows through the adapter at its batch size.
``mor.memory`` has no estimate for either: their memory is measured only.

The throughput job runs on a stand-in of the run folder too: the job sizes both settings'
engines (batch 32 and the relative maximum batch, the KV pool from the GPU's memory) and builds
them with its own code, CUDA graphs off (capture cannot be faked); each engine's first run is
replaced by each eager pass kind once at full rows through its Stepper (``_probe_passes``), with
no scheduler, so nothing is read back (status "ok (weights not read; eager passes without the
scheduler; no graph capture)"). Its memory, measured, stands beside the job's own budget.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mor.config import model_shape
from mor.layout import RunPaths
from mor.model.routers.registry import router_kind
from mor.grids import load_grid
from mor.jobs import KINDS
from mor.rehearsal import measure
from mor.rehearsal.data import ensure_data
from mor.rehearsal.fake import (GiB, RehearsalError, cuda_queries, engine_tensors, fake_device, fake_process_group,
                                 free_memory)

STATES = 3  # micro-batches of a step that the memory pass runs (``one_step``)
CLUSTER_VOCAB = 49152  # the cluster tokenizer's (HuggingFaceTB/SmolLM-135M), where a scale has none


@dataclass
class Row:
    """One line of the rehearsal table."""

    run_id: str
    job: str
    world_size: int
    micro_batch: int
    status: str  # "ok" or "FAILED: <why>"
    gpu_gib: float
    route: str = ""  # how it was measured (docs/rehearsal.md)
    measured: dict = field(default_factory=dict)  # bytes by measure.CATEGORIES
    modelled: dict = field(default_factory=dict)


def cpu_bf16(precision: str, device) -> torch.dtype | None:
    """The trainer's autocast dtype off CUDA, where the run asks for bf16 (the job refuses it
    there): the same casts of the weights and matmul inputs as the GPU's autocast."""
    return None if precision == "fp32" else torch.bfloat16


def _create_moments(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """AdamW's moments as they are from the second step on (it makes them lazily, at its first
    step): one step on zero gradients, outside the measurement."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _kept_bucket(state, bucket):
    """A DDP communication hook that keeps the bucket as it is (what an all-reduce of equal
    gradients would give), where the fake process group's future carries no tensor."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def one_step(device: str, backward: bool = True):
    """The train job's seams for a rehearsal: ``(seams, loop)`` for ``train_job``, its loop
    (``Trainer.fit``, and the DDP / FSDP trainers' own) replaced by one measured training step.

    Off CUDA the trainer autocasts to bf16 where the run asks for it (``cpu_bf16``). The router
    statistics the step logs after the update select rows by a mask (a shape that depends on the
    data, which fake tensors do not have): none are logged; the step itself is done then. The
    synthetic pool (``mor.rehearsal.data``) is a few hundred windows: a one-pass run
    (``train.data_order: pass``) of the cluster's length would be refused; one step fits any pool.

    ``backward=False``: the backward pass does nothing (on fake CUDA the autograd engine asks
    for a CUDA context, PyTorch issue #92627); the rest of the step runs on no gradients, for
    the first micro-batch only (every micro-batch takes the same path: the first one checks it)."""
    from mor.train.trainer import TrainerSeams

    seams = TrainerSeams(router_stats=lambda model, trace: {},
                         check_pass=lambda sampler, steps, epochs, source: 1,
                         **({} if device == "cuda" else {"autocast_dtype": cpu_bf16}),
                         **({} if backward else {"backward": lambda loss: None}))

    def loop(trainer) -> dict:
        model = trainer.ddp_model or trainer.model
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model.register_comm_hook(None, _kept_bucket)  # the fake group's all-reduce returns nothing
        _create_moments(trainer.model, trainer.optimizer)
        # Micro-batches 3 .. accum-1 repeat micro-batch 2 (gradients held, no synchronisation):
        # the first (gradients made), the second and the last (synchronised) are every state
        # the step's memory goes through (``Trainer.micro_batches`` gives the first ``accum``)
        accumulation, trainer.accum = trainer.accum, min(trainer.accum, STATES if backward else 1)
        with measure.StorageTracker(model, trainer.optimizer) as mt:
            trainer.train_step()
        return {"micro_batch": trainer.micro, "accumulation": accumulation, "memory": mt.peak,
                "phase": mt.peak_phase}

    return seams, loop


def run_vocab(run, data_root: Path) -> int:
    """The model's vocabulary: the scale's, else the tokenizer's (a local one is a file; a hub
    one is the cluster's, whose size the token manifest records)."""
    from mor.data.paths import data_paths
    from mor.data.tokenizer import vocab_size

    if model_shape(run.model).vocab:
        return model_shape(run.model).vocab
    paths = data_paths(run.data, Path(data_root))
    return vocab_size(paths) if str(paths.tokenizer).endswith(".json") else CLUSTER_VOCAB


def _train_pass(grid: str, run_id: str, mode: str, preset, device: str, data_root: Path, backward: bool) -> dict:
    """The train job on fake ``device`` with its loop cut to one step (``one_step``)."""
    from mor.launch.cost import memory_fit
    from mor.train.trainer import DistInfo

    run = load_grid(grid, mode).run(run_id).config
    # On fake CUDA one rank without a wrapper: DDP's reducer and FSDP time their work with CUDA
    # events, which need a real device; the wrappers run in the CPU pass at the preset's world size
    world = preset.world_size if device != "cuda" else 1
    execution = dict(preset.execution)
    if execution.get("micro_batch") == "auto":
        # the plan's micro-batch, from the memory model on the preset's GPU (what the job's 'auto'
        # asks on CUDA; off CUDA it would take the draw size)
        execution["micro_batch"] = memory_fit(run, preset)[0]
    job = "train" if backward else "train (forward)"
    seams, loop = one_step(device, backward)
    with tempfile.TemporaryDirectory(prefix="rehearsal-") as tmp, \
            fake_process_group(world), fake_device(run_id, job, device, preset.gpu_memory_gib or 80.0, devices=world):
        dist = DistInfo(rank=0, world_size=world) if world > 1 else None
        return KINDS["train"].run(grid=grid, run_id=run_id, mode=mode, run_dir=tmp, data_root=str(data_root),
                                  device=device, dist=dist, parallel=preset.parallel, execution=execution,
                                  seams=seams, loop=loop)


def rehearse_train(grid: str, run_id: str, mode: str, preset, device: str, data_root: Path) -> Row:
    """One optimizer step of the train job at the preset's world size, micro-batch and execution.

    ``device`` 'cuda' (a CUDA build of torch): the job runs on fake CUDA, one rank, through its
    first forward pass (device, dtype and kernel checks of the CUDA paths: bf16 autocast, the
    fused AdamW on zero gradients), then the whole step (forward, backward, AdamW) runs on fake CPU
    tensors under bf16 autocast for the memory. 'cpu': the second part only."""
    from mor.memory import training_memory, usable_bytes

    run = load_grid(grid, mode).run(run_id).config
    vocab = run_vocab(run, data_root)
    ensure_data(run, data_root, vocab)
    world = preset.world_size
    route = "fake cpu step"
    if device == "cuda":
        fwd = _train_pass(grid, run_id, mode, preset, "cuda", data_root, backward=False)
        route = "fake cuda forward + fake cpu step"
    out = _train_pass(grid, run_id, mode, preset, "cpu", data_root, backward=True)
    row = Row(run_id, "train", world, out["micro_batch"], "ok", preset.gpu_memory_gib, route=route)
    row.measured = out["memory"]
    t, ex = run.train, preset.exec_config
    dtype = "fp32" if t.precision == "fp32" else "bf16"
    est = training_memory(run.model, model_shape(run.model), vocab, t.seq_len, row.micro_batch, dtype, world,
                          preset.parallel, ex.activation_checkpointing, ex.loss_chunk)
    row.modelled = measure.modelled(est)
    if run.model.variant == "mor" and router_kind(run.model.router.type).shapes_from_routing:
        # the packing's sizes come from scalar reads, which the fake mode answers with 1 (mor.rehearsal.fake)
        row.status = ("ok (memory not measured: token-choice packs each recursion to the token counts its "
                      "routing reads back, which fake tensors do not have; the transient shown is a floor)")
    usable = usable_bytes(preset.gpu_memory_gib * GiB)
    if preset.gpu_memory_gib and row.measured["total"] > usable:
        row.status = (f"FAILED: measured peak {row.measured['total'] / GiB:.1f} GiB > {usable / GiB:.1f} GiB "
                      f"usable of the {preset.gpu_memory_gib:g} GiB GPU at micro-batch {row.micro_batch}")
    return row


NOT_REHEARSED: dict[str, str] = {}  # job kinds without a rehearsal, and why
NO_WEIGHTS = "weights not read"  # the status note of a job that reads a trained run (docs/rehearsal.md)


def no_weights(file: Path, model: torch.nn.Module) -> None:
    """The weights reader a rehearsal passes to a job that opens a finished run
    (``mor.trained.open_run``'s ``read_weights``): it reads nothing. The model is built under the
    fake mode at full size, on the job's device, in the dtype the job builds it in; only the
    final weights' values are absent."""


def trained_run_stand_in(run, run_dir: Path, vocab: int) -> None:
    """``run_dir`` as a finished run without its weights: the training summary and config.json
    the readers check (``mor.trained.open_run``); the jobs read it with ``no_weights``."""
    import json

    from mor.lm_eval.job import lm_eval_settings

    paths = RunPaths.of(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    summary = {"config_hash": run.config_hash, "tokens_seen": run.train.tokens, "steps": 1, "train_time_s": 1.0,
               "tokens_per_s": 1.0, "final_loss": 1.0, "mfu": None}
    paths.summary.write_text(json.dumps(summary))
    paths.config.write_text(json.dumps({"config": run.to_dict(), "vocab_size": vocab}))
    # the eval job reads the lmeval job's result when the grid asks for tasks: a stand-in with no accuracies
    paths.lm_eval.write_text(json.dumps({"run_id": run.run_id, "settings": lm_eval_settings(run.eval),
                                                      "tasks": {}}))


def one_eval_batch(out: dict, measure_memory: bool):
    """The evaluator a rehearsal passes to the eval job: the job's own ``evaluate`` over one batch
    at the eval batch size (every batch has the same shape; the validation split is cut to
    ``eval.batch`` windows), under the memory counter.

    A MoR model's router statistics, read after the forward passes (the candidates selected by
    a boolean mask, numpy histograms), have shapes that depend on the data, which fake tensors do
    not have: the forward's routing trace is dropped before them, as the train rehearsal drops
    ``router_stats``; both forward passes (top-k and causal routing) run."""
    import dataclasses

    from mor.eval import job as eval_job

    def one_batch(model, tokens, seq_len, max_tokens, batch, device):
        evaluate = eval_job.evaluate  # the job's default evaluator (mor.eval.nll.evaluate)
        tokens = tokens[: batch * (seq_len + 1)]
        out["device"] = next(model.parameters()).device.type  # where the job built the model
        hook = model.register_forward_hook(lambda m, args, o: dataclasses.replace(o, routing=None))
        try:
            if not measure_memory:
                return evaluate(model, tokens, seq_len, max_tokens, batch, device)
            with measure.StorageTracker(model) as mt:
                result = evaluate(model, tokens, seq_len, max_tokens, batch, device)
            out["memory"] = mt.peak
            return result
        finally:
            hook.remove()

    return one_batch


def _on_cuda(out: dict, run_id: str, job: str) -> None:
    if out.get("device") != "cuda":
        raise RehearsalError(run_id, job, "(the job's device)", RuntimeError(
            f"asked for cuda, the job built its model on {out.get('device')}"))


def _eval_pass(grid: str, run_id: str, mode: str, preset, device: str, data_root: Path, vocab: int) -> dict:
    """The eval job on fake ``device``, one rank, on a stand-in of the finished run."""
    run = load_grid(grid, mode).run(run_id).config
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="rehearsal-") as tmp:
        trained_run_stand_in(run, Path(tmp) / "run", vocab)
        with fake_device(run_id, "eval", device, preset.gpu_memory_gib or 80.0):
            KINDS["eval"].run(grid=grid, run_id=run_id, mode=mode, run_dir=str(Path(tmp) / "run"),
                              out=str(Path(tmp) / "row.jsonl"), data_root=str(data_root), device=device,
                              evaluate=one_eval_batch(out, measure_memory=device == "cpu"), read_weights=no_weights)
    return out


def rehearse_eval(grid: str, run_id: str, mode: str, preset, device: str, data_root: Path) -> Row:
    """The eval job (``mor.eval.job.eval_job``) at the grid's eval batch size, weights not read.

    'cuda': the job on fake CUDA (device and dtype checks of its path), then on fake CPU for the
    memory (on fake CUDA SDPA takes the math backend and materialises the scores); 'cpu': the
    second only. ``mor.memory`` has no estimate for eval: measured only."""
    run = load_grid(grid, mode).run(run_id).config
    vocab = run_vocab(run, data_root)
    ensure_data(run, data_root, vocab)
    return _scoring_row("eval", _eval_pass, lambda out: run.eval.batch, f"ok ({NO_WEIGHTS})",
                        grid, run_id, mode, preset, device, data_root, vocab)


def _scoring_row(job: str, one_pass, batch_of, ok: str, grid: str, run_id: str, mode: str, preset, device: str,
                 data_root: Path, vocab: int) -> Row:
    """A scoring job's row (eval, lmeval): on 'cuda' its pass on fake CUDA first (devices and
    dtypes), then on fake CPU for the memory; the row fails when the measured peak exceeds what
    the plan may use of the GPU (``mor.memory.usable_bytes``)."""
    from mor.memory import usable_bytes

    route = f"fake cpu {job}"
    if device == "cuda":
        _on_cuda(one_pass(grid, run_id, mode, preset, "cuda", data_root, vocab), run_id, job)
        route = f"fake cuda {job} + fake cpu {job}"
    out = one_pass(grid, run_id, mode, preset, "cpu", data_root, vocab)
    row = Row(run_id, job, 1, batch_of(out), ok, preset.gpu_memory_gib, route=route, measured=out["memory"])
    usable = usable_bytes(preset.gpu_memory_gib * GiB)
    if preset.gpu_memory_gib and row.measured["total"] > usable:
        row.status = (f"FAILED: measured peak {row.measured['total'] / GiB:.1f} GiB > {usable / GiB:.1f} GiB "
                      f"usable of the {preset.gpu_memory_gib:g} GiB GPU at {job} batch {row.micro_batch}")
    return row


LMEVAL_CONTINUATION = 32  # tokens scored per request in the lmeval rehearsal's batch (a long multiple-choice answer)


def one_lmeval_batch(vocab: int, out: dict, measure_memory: bool):
    """The lmeval job's seams for a rehearsal: ``(evaluate_tasks, seams)`` for ``lmeval_job``.

    The harness's task loop is replaced by one batch of the adapter's own
    scoring (``MoRLM._loglikelihood_tokens``) at the job's batch size: every request a full
    window (``max_length`` tokens in, the last ``LMEVAL_CONTINUATION`` scored), the largest shape
    a loglikelihood task gives it. The task data and the cluster tokenizer come from the hub,
    which a rehearsal does not reach: the tokenizer is a stand-in with the run's vocabulary and
    its end-of-text id 0. The adapter is told CUDA is there (on fake CUDA it would otherwise move
    the model to the CPU, what it does where no GPU is; off CUDA it never asks), and reads no
    weights (``no_weights``)."""
    from types import SimpleNamespace

    from mor.lm_eval.adapter import AdapterSeams

    tok = SimpleNamespace(eos_id=0, vocab_size=vocab, encode=lambda text: [1], decode=lambda ids: "")

    def one_batch(lm, settings, tasks_dir):
        L, k = lm.max_length, LMEVAL_CONTINUATION
        ids = [1 + i % (vocab - 1) for i in range(L + 1)]  # context + continuation: one full window
        requests = [(None, ids[:-k], ids[-k:])] * lm.batch_size
        out["batch"], out["window"] = lm.batch_size, L
        out["device"] = next(lm.model.parameters()).device.type  # where the job built the model
        if not measure_memory:
            lm._loglikelihood_tokens(requests, disable_tqdm=True)
            return {}
        with measure.StorageTracker(lm.model) as mt:
            lm._loglikelihood_tokens(requests, disable_tqdm=True)
        out["memory"] = mt.peak
        return {}

    return one_batch, AdapterSeams(load_tokenizer=lambda spec: tok, read_weights=no_weights,
                                   cuda_available=lambda: True)


def _lmeval_pass(grid: str, run_id: str, mode: str, preset, device: str, data_root: Path, vocab: int) -> dict:
    """The lmeval job on fake ``device``, one rank, on a stand-in of the finished run."""
    run = load_grid(grid, mode).run(run_id).config
    out: dict = {}
    evaluate_tasks, seams = one_lmeval_batch(vocab, out, measure_memory=device == "cpu")
    with tempfile.TemporaryDirectory(prefix="rehearsal-") as tmp:
        trained_run_stand_in(run, Path(tmp) / "run", vocab)
        with fake_device(run_id, "lmeval", device, preset.gpu_memory_gib or 80.0):
            KINDS["lmeval"].run(grid=grid, run_id=run_id, mode=mode, run_dir=str(Path(tmp) / "run"),
                                out=str(Path(tmp) / "lm_eval_out.json"), data_root=str(data_root), device=device,
                                evaluate_tasks=evaluate_tasks, seams=seams)
    return out


def rehearse_lmeval(grid: str, run_id: str, mode: str, preset, device: str, data_root: Path) -> Row:
    """The lmeval job (``mor.lm_eval.job.lmeval_job``) at its batch size, weights not read
    (``one_lmeval_batch``); routes as ``rehearse_eval``. Measured only (``mor.memory`` has no
    estimate for lmeval). A grid without lm-eval tasks has nothing to rehearse."""
    run = load_grid(grid, mode).run(run_id).config
    if not run.eval.lm_eval_tasks:
        return Row(run_id, "lmeval", 1, 0, "not rehearsed (the grid asks for no lm-eval tasks)", preset.gpu_memory_gib)
    vocab = run_vocab(run, data_root)
    ensure_data(run, data_root, vocab)
    return _scoring_row("lmeval", _lmeval_pass, lambda out: out["batch"],
                        f"ok ({NO_WEIGHTS}; stand-in tokenizer and requests)", grid, run_id, mode, preset, device,
                        data_root, vocab)


THROUGHPUT_OK = f"ok ({NO_WEIGHTS}; eager passes without the scheduler; no graph capture)"


class _Probed(Exception):
    """Raised by the probe in place of the engine's run: the probe's findings, back to ``measure``."""

    def __init__(self, found: dict):
        super().__init__("engine probed")
        self.found = found


def _fill_context(bm, slots: list[int], length: int) -> None:
    """Every storing column of ``slots`` holds ``length`` entries, as a sequence that has fed
    ``length`` tokens (the state ``BlockManager.fill`` leaves, taken a whole block at a time)."""
    k = -(-length // bm.bs)
    for s in slots:
        for c in range(len(bm.store)):
            bm.table[s, c, :k] = [bm.free.popleft() for _ in range(k)]
            bm.nblocks[s, c], bm.length[s, c] = k, length
    bm.peak = max(bm.peak, bm.used)


def _probe_passes(engine, requests, on_finish=None):
    """In place of ``Engine.run``: each eager pass kind once through the engine's own Stepper,
    at ``engine.batch`` rows, every row a live sequence at the longest context the pool holds
    for that many (``max_len`` - 2: the head's enter part appends one more): enter, one
    mixed-depth shared-block pass (row i at recursion i mod Nr), and a head pass whose every
    row continues (its enter part included). No scheduler: nothing is read back."""
    st, bm, rows = engine.stepper, engine.blocks, engine.batch
    if rows > engine.max_live:
        raise ValueError(f"batch {rows} > the engine's admission limit {engine.max_live}")
    per_seq = bm.num_blocks // (rows * len(bm.store))  # blocks each row's column may take
    context = min(engine.max_len - 2, per_seq * bm.bs - 2)
    if context < 1:
        raise ValueError(f"the KV pool ({bm.num_blocks} blocks) cannot hold {rows} live sequences")
    slots, pos = list(range(rows)), [context] * rows
    _fill_context(bm, slots, context)
    with torch.no_grad(), st.relax.installed():
        st.sampling = False
        st.enter(slots, [1] * rows, pos)
        st.block(slots, [i % st.nr for i in range(rows)], pos)
        st.head(slots, pos, n_cont=rows)
    raise _Probed({"rows": rows, "context": context, "pool": engine.cache.nbytes(), "max_live": engine.max_live,
                   "block_size": bm.bs, "attention": engine.attention, "padded": st.pad})


def engine_passes(out: dict):
    """The measure a rehearsal passes to the throughput job: each setting cut to its engine. The
    job sizes the engine (App. E's memory, the relative maximum batch, the engine's memory
    budget) and its own ``measure`` builds it (options, KV pool) as on the cluster; the engine's
    first run is ``_probe_passes`` (``measure``'s ``run_engine``), under the memory counter from
    before the engine is built (the pool and the passes). CUDA graphs are off (the job's
    ``graphs=False``): capture cannot be faked."""
    from mor.engine import job as tp_job

    def probe(model, reqs, batch, max_len, warmup_tokens, device, dtype, memory_bytes=None, graphs=None):
        with measure.StorageTracker(model) as mt:
            try:
                tp_job.measure(model, reqs, batch, max_len, warmup_tokens, device, dtype, memory_bytes, graphs,
                               run_engine=_probe_passes)
                raise RuntimeError("the engine ran without the probe")
            except _Probed as p:
                found = p.found
        found.update(batch=batch, memory=mt.peak, memory_bytes=memory_bytes, graphs=graphs,
                     device=next(model.parameters()).device.type)
        out.setdefault("settings", []).append(found)
        return {"batch": batch, "recursion_share": []}

    return probe


def _throughput_pass(grid: str, run_id: str, mode: str, preset, device: str, data_root: Path, vocab: int) -> dict:
    """The throughput job on fake ``device`` (one process) on a stand-in of the finished run.
    The GPU's memory queries answer for the preset's GPU, its free memory the total less the
    model's parameters (which the job moves there before it asks); off 'cuda' too, so that the
    cluster protocol's 'device' memory sizes the engine on the fake CPU as on the GPU."""
    from mor.config import model_shape
    from mor.flops import model_bytes
    from mor.throughput_protocol import load_protocol

    run = load_grid(grid, mode).run(run_id).config
    p = load_protocol(mode)
    elem = torch.tensor([], dtype=getattr(torch, p["dtype"])).element_size()
    gpu = int((preset.gpu_memory_gib or 80.0) * GiB)
    free = gpu - int(model_bytes(run.model, model_shape(run.model), vocab, elem))
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="rehearsal-") as tmp, contextlib.ExitStack() as stack:
        trained_run_stand_in(run, Path(tmp) / "run", vocab)
        stack.enter_context(engine_tensors())
        if device != "cuda":
            stack.enter_context(cuda_queries(gpu / GiB))
        stack.enter_context(fake_device(run_id, "throughput", device, gpu / GiB))
        stack.enter_context(free_memory(free, gpu))
        run_dir = Path(tmp) / "run"
        KINDS["throughput"].run(grid=grid, run_id=run_id, mode=mode, run_dir=str(run_dir),
                                out=str(RunPaths.of(run_dir).throughput), data_root=str(data_root), device=device,
                                graphs=False, measure=engine_passes(out), read_weights=no_weights)
    return out


def rehearse_throughput(grid: str, run_id: str, mode: str, preset, device: str, data_root: Path) -> Row:
    """The throughput job (``mor.engine.job.throughput_job``) at App. E's protocol, weights not
    read: both settings' engines (batch ``fixed_batch`` and the relative maximum batch) built by
    the job's own code at the preset GPU's memory, each eager pass kind run once at full rows
    (``_probe_passes``). The row: the larger setting's measured peak (parameters; the KV pool
    and the passes under *transient*) beside the job's own memory model, the engine's budget
    (parameters + KV: ``modelled``); it fails above what the plan may use of the GPU."""
    from mor.config import model_shape
    from mor.flops import model_bytes
    from mor.memory import usable_bytes
    from mor.throughput_protocol import load_protocol

    run = load_grid(grid, mode).run(run_id).config
    vocab = run_vocab(run, data_root)
    ensure_data(run, data_root, vocab)
    out = _throughput_pass(grid, run_id, mode, preset, device, data_root, vocab)
    if device == "cuda":
        _on_cuda(out["settings"][0], run_id, "throughput")
    big = max(out["settings"], key=lambda f: (f["memory"]["total"], f["batch"]))
    parts = [f"batch {f['batch']}: {f['memory']['total'] / GiB:.2f} GiB (KV pool {f['pool'] / GiB:.2f}, "
             f"context {f['context']}, {f['attention']})" for f in out["settings"]]
    row = Row(run_id, "throughput", 1, big["batch"], THROUGHPUT_OK, preset.gpu_memory_gib,
              route=f"fake {device} engine passes; " + "; ".join(parts), measured=big["memory"])
    elem = torch.tensor([], dtype=getattr(torch, load_protocol(mode)["dtype"])).element_size()
    params, budget = float(model_bytes(run.model, model_shape(run.model), vocab, elem)), float(big["memory_bytes"])
    row.modelled = {"params": params, "transient": budget - params, "total": budget}  # the engine's budget
    usable = usable_bytes(preset.gpu_memory_gib * GiB)
    if preset.gpu_memory_gib and row.measured["total"] > usable:
        row.status = (f"FAILED: measured peak {row.measured['total'] / GiB:.1f} GiB > {usable / GiB:.1f} GiB "
                      f"usable of the {preset.gpu_memory_gib:g} GiB GPU at throughput batch {row.micro_batch}")
    return row


def rehearse(kind: str, grid: str, run_id: str, mode: str, preset, device: str, data_root: Path) -> Row:
    """The rehearsal of one job; a failure becomes a row whose status says why."""
    fn = {"train": rehearse_train, "eval": rehearse_eval, "lmeval": rehearse_lmeval,
          "throughput": rehearse_throughput}.get(kind)
    if fn is None:
        why = NOT_REHEARSED.get(kind, "no rehearsal for this kind")
        return Row(run_id, kind, preset.world_size, 0, f"not rehearsed ({why})", preset.gpu_memory_gib)
    try:
        return fn(grid, run_id, mode, preset, device, data_root)
    except RehearsalError as e:
        world = preset.world_size if KINDS[kind].ranks == "all" else 1
        return Row(run_id, kind, world, 0, f"FAILED: {e}", preset.gpu_memory_gib, route=f"fake {device}")


__all__ = ["GiB", "Row", "rehearse", "rehearse_train"]
