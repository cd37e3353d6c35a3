"""The alignment run behind ``codila train align``: one process, or one per GPU under torchrun (DDP).

Every rank holds its own frozen DLM and a copy of the helper wrapped in
``torch.nn.parallel.DistributedDataParallel``. A step draws ``--batch`` rows in all; row r of step s
(its window, its masks, its blocks) depends only on (seed, s, r), and rank k takes rows k, k+W, …, split
into ``--grad-accum`` micro-batches, so the same global batch gives the same update on any number of
processes and after any resume. Rank 0 writes the checkpoint (atomically: every ``--ckpt-every`` steps
and on Ctrl-C / SIGTERM), ``log.jsonl``, ``loss.png`` and, at the end, the helper directory.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from codila_cli.train.align.loss import PairIds, alignment_loss, block_topk, plan_row


def _row_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([abs(int(p)) for p in parts]).generate_state(1)[0])


def make_rows(stream: np.ndarray, rows: list[int], *, seed: int, step: int, seq_len: int, bos: int | None) -> torch.Tensor:
    """[len(rows), seq_len] windows of ``stream`` (``bos`` first when the DLM has one)."""
    body = seq_len - (bos is not None)
    out = np.zeros((len(rows), seq_len), np.int64)
    for i, r in enumerate(rows):
        start = int(np.random.default_rng(_row_seed(seed, step, r, 1)).integers(0, max(1, len(stream) - body)))
        window = np.asarray(stream[start : start + body], np.int64)
        if len(window) < body:  # a short validation stream: the rest is end-of-text
            window = np.concatenate([window, np.full(body - len(window), stream[-1], np.int64)])
        out[i] = window if bos is None else np.concatenate([[bos], window])
    return torch.from_numpy(out)


class Step:
    """What one step trains on: the block size, frontier or not, and each row's plan."""

    def __init__(self, cfg: Any, step: int) -> None:
        self.cfg, self.step = cfg, step
        rng = np.random.default_rng(_row_seed(cfg.seed, step, 0, 2))
        self.block = cfg.block_sizes[int(rng.integers(len(cfg.block_sizes)))]
        self.frontier = (step % 20) < round(20 * cfg.frontier)  # the share holds over every 20 steps

    def plans(self, rows: list[int], n: int, *, weighting: str | None = None) -> list:
        c = self.cfg
        return [plan_row(n, block=self.block, blocks=c.blocks_per_row, frontier=self.frontier, ctx_max=c.context,
                         ctx_prob=c.context_share, weighting=weighting or c.weighting,
                         gen=torch.Generator().manual_seed(_row_seed(c.seed, self.step, r, 3))) for r in rows]


def _optimizer(cfg: Any, model: torch.nn.Module, device: torch.device) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    if cfg.optimizer == "adamw8bit":
        try:
            import bitsandbytes as bnb
        except ImportError:
            from codila_cli.errors import UsageError

            raise UsageError("--optimizer adamw8bit needs bitsandbytes", hint="pip install bitsandbytes, or use adamw") from None
        return bnb.optim.AdamW8bit(groups, lr=cfg.lr, betas=(0.9, 0.95))
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def lr_at(step: int, cfg: Any) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak (the bundled stages' schedule)."""
    from codila_cli.train.loop import LoopConfig
    from codila_cli.train.loop import lr_at as schedule

    return schedule(step, LoopConfig(steps=cfg.steps, lr=cfg.lr, warmup=cfg.warmup))


class Models:
    """The frozen DLM, the trainable helper and what the loss needs of them, on one device."""

    def __init__(self, cfg: Any, pair: Any, device: torch.device) -> None:
        from codila_cli.models.ar import load_ar
        from codila_cli.models.families import load_dlm
        from codila_cli.models.loading import choose_dtype

        self.dlm_dtype = choose_dtype(cfg.dtype, device)
        self.denoiser = load_dlm(pair.dlm_path, name=cfg.dlm, device=device, dtype=self.dlm_dtype)
        self.dlm = self.denoiser.model.requires_grad_(False).eval()
        self.helper = load_ar(pair.ar_path, name=cfg.ar, device=device, dtype=torch.float32, engine="transformers")
        self.ar = self.helper.model.requires_grad_(True).train()  # the loader hands out frozen, eval-mode networks
        if cfg.grad_checkpointing if cfg.grad_checkpointing is not None else device.type == "cuda":
            self.ar.config.use_cache = False
            self.ar.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        bridge = pair.bridge
        head = self.dlm.lm_head.weight
        self.head_s = head[: len(bridge.shared_ids)] if bridge.contiguous else head[bridge.shared_ids.to(device)]
        open_ids, close_ids = self.helper.wrapper_ids()  # what the decoder feeds at inference
        mapped = getattr(bridge, "inner", None)  # a TokenMap (models/token_map.py): two vocabularies
        self.banned = ~(mapped or bridge).ar_allowed.to(device)
        self.ids = PairIds(mask=pair.dlm_specials.mask, open_ids=open_ids, close_ids=close_ids,
                           shared=bridge.shared_ids, contiguous=bridge.contiguous,
                           ar_shared=bridge.ar_ids if mapped is not None else None,
                           to_ar=bridge.to_ar if mapped is not None else None,
                           ar_fill=bridge.ar_eos if mapped is not None else 0,
                           shifted=self.denoiser.shifted)

    def loss(self, wrapped: Any, x0: torch.Tensor, step: Step, plans: list, *, weighting: str,
             topk: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        return alignment_loss(self.dlm, wrapped, x0, plans, ids=self.ids, block=step.block, weighting=weighting,
                              frontier=step.frontier, head_s=self.head_s,
                              ar_embedding=self.ar.get_input_embeddings().weight, banned=self.banned, topk=topk)

    def marginals(self, cache: Any, x0: torch.Tensor, step: Step, rows: list[int], plans: list):
        """The rows' top-k block marginals: read from ``cache``, else computed by the DLM and stored."""
        got = cache.get(step.step, rows)
        if got is None:
            got = block_topk(self.dlm, x0, plans, ids=self.ids, block=step.block, head_s=self.head_s, k=cache.k)
            cache.put(step.step, rows, [len(p.starts) for p in plans], *got)
        return got


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def validate(cfg: Any, models: Models, valid: np.ndarray, bos: int | None, device: torch.device) -> dict:
    """Mean block CE on fixed held-out windows, per block size (plain mean; frontier blocks in the
    training share)."""
    out = {}
    rows = list(range(cfg.valid_rows))
    models.ar.eval()
    with torch.no_grad(), _autocast(device):
        for i, b in enumerate(cfg.block_sizes):
            x0 = make_rows(valid, rows, seed=cfg.seed + 7919, step=i, seq_len=cfg.seq_len, bos=bos).to(device)
            total = 0.0
            for front, share in ((False, 1 - cfg.frontier), (True, cfg.frontier)):
                if share > 0:
                    st = Step(cfg, i)
                    st.block, st.frontier = b, front
                    total += share * float(models.loss(models.ar, x0, st, st.plans(rows, cfg.seq_len, weighting="mean"),
                                                       weighting="mean"))
            out[str(b)] = round(total, 4)
    models.ar.train()
    return {"valid": round(sum(out.values()) / len(out), 4), "valid_by_block": out}


def train(cfg: Any, pair: Any, meta: dict, *, shard: Any, on_log: Any = None) -> dict:
    """Train to ``cfg.steps`` (resuming from ``training/ckpt.pt`` with ``--resume``); returns the last
    log record, with ``output`` set on rank 0 once the helper is written."""
    from codila_cli.eval.distributed import device_for
    from codila_cli.models.loading import choose_device
    from codila_cli.train.checkpoint import deferred_interrupt, save_checkpoint
    from codila_cli.train.loop import plot_log

    device = choose_device(device_for(shard, cfg.device))
    torch.manual_seed(cfg.seed)
    models = Models(cfg, pair, device)
    model: Any = models.ar
    if shard.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(models.ar, device_ids=[device.index] if device.type == "cuda" else None)
    opt = _optimizer(cfg, models.ar, device)
    state_dir = cfg.state_dir
    cache = None
    if cfg.marginals_cache is not None:
        from codila_cli.train.align.cache import MarginalsCache, cache_key

        cache = MarginalsCache(cfg.marginals_cache, cache_key(cfg, pair, dtype=str(models.dlm_dtype).removeprefix("torch.")),
                               main=shard.main)
    ckpt_path, log_path = state_dir / "ckpt.pt", state_dir / "log.jsonl"
    step = 0
    pending: dict | None = None  # the record of an update whose log line is not written yet
    if cfg.resume:
        from codila_cli.train.checkpoint import load_checkpoint

        state = load_checkpoint(ckpt_path, map_location=device)
        models.ar.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
        pending = state.get("record")  # an interrupt came between the update and its log line
    if shard.main:
        (state_dir / "run.json").write_text(json.dumps(cfg.fingerprint(), indent=2) + "\n", encoding="utf-8")
    train_stream = np.load(state_dir / "data" / "train.npy", mmap_mode="r")
    valid_stream = np.load(state_dir / "data" / "valid.npy", mmap_mode="r")
    bos = pair.dlm_specials.bos
    mine = list(range(shard.rank, cfg.batch, shard.world))
    micro = [mine[i :: cfg.grad_accum] for i in range(cfg.grad_accum)]

    def save() -> None:
        if shard.main:
            save_checkpoint({"model": models.ar.state_dict(), "opt": opt.state_dict(), "step": step,
                             "record": pending}, ckpt_path)

    def finish(record: dict) -> None:
        """The step's validation when it is due, then its log line; an interrupt before the line is written
        leaves the record in the checkpoint (``save``), and ``--resume`` finishes it (issue 60: a resumed
        run lost the line, and with it the helper's ``valid_block_ce``, in three of the battery's runs)."""
        nonlocal pending
        at = record["step"]
        if (at % cfg.valid_every == 0 or at == cfg.steps) and "valid" not in record:
            if shard.main:
                record.update(validate(cfg, models, valid_stream, bos, device))
            if device.type == "cuda":
                record["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        with deferred_interrupt():  # the line and the end of the pending record together
            if shard.main:
                with open(log_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")
            pending = None
        if shard.main and on_log:
            on_log(record)

    last: dict = _last_record(log_path, step) if cfg.resume else {"step": step}
    t_start = time.perf_counter()
    try:
        if pending is not None:
            last = pending
            finish(last)
        while step < cfg.steps:
            t0 = time.perf_counter()
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg)
            st = Step(cfg, step)
            total = torch.zeros((), device=device)
            misses = cache.misses if cache else 0
            for k, rows in enumerate(micro):
                x0 = make_rows(train_stream, rows, seed=cfg.seed, step=step, seq_len=cfg.seq_len, bos=bos).to(device)
                plans = st.plans(rows, cfg.seq_len)
                sync = contextlib.nullcontext() if k == len(micro) - 1 or shard.world == 1 else model.no_sync()
                with sync:
                    with _autocast(device):
                        topk = models.marginals(cache, x0, st, rows, plans) if cache else None
                        loss = models.loss(model, x0, st, plans, weighting=cfg.weighting, topk=topk)
                    (loss / cfg.grad_accum).backward()
                total += loss.detach() / cfg.grad_accum
            gnorm = torch.nn.utils.clip_grad_norm_(models.ar.parameters(), cfg.grad_clip)
            if shard.world > 1:
                import torch.distributed as dist

                dist.all_reduce(total)
                total /= shard.world
            dt = time.perf_counter() - t0
            record = {"step": step + 1, "loss": round(float(total), 5), "grad_norm": round(float(gnorm), 4),
                      "lr": lr_at(step, cfg), "block": st.block, "frontier": st.frontier,
                      "tokens_per_second": round(cfg.batch * cfg.seq_len / dt, 1),
                      "blocks_per_second": round(cfg.batch * (1 if st.frontier else cfg.blocks_per_row) / dt, 2),
                      "elapsed": round(time.perf_counter() - t_start, 1)}
            if cache:  # micro-batches of this rank whose marginals the DLM computed (0: all read from the cache)
                record["dlm_forwards"] = cache.misses - misses
                record["cache_damaged"] = cache.damaged  # entries refused and recomputed so far (cache.py)
            with deferred_interrupt():  # the update, its step count and its pending record together
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                pending = record
            finish(record)
            last = record
            if step % cfg.ckpt_every == 0 or step == cfg.steps:
                save()
    except KeyboardInterrupt:
        save()
        raise
    if shard.main:
        plot_log(log_path, state_dir / "loss.png")
        from codila_cli.train.align.output import select_decoding, write_helper

        decoding = select_decoding(cfg, models, pair, device) if cfg.select_decoding else {}
        last["output"] = str(write_helper(cfg, pair, models.ar, meta=meta, last=last, decoding=dict(decoding)))
        last["codila_decoding"] = {k: v for k, v in decoding.items() if not k.startswith("_")}
    if shard.world > 1:  # every rank waits for rank 0's files before the process group goes away
        import torch.distributed as dist

        dist.barrier()
    return last


def _last_record(log_path: Path, step: int) -> dict:
    """The log line of ``step`` (the last one written for it), else ``{"step": step}``."""
    try:
        lines = log_path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return {"step": step}
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("step") == step:
            return record
    return {"step": step}
