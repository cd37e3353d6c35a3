"""Training stages for the bundled models (docs/training.md has the exact commands that made them).

    corpus     build the decontaminated corpus (train/corpus.py)
    tokenizer  byte-level BPE (8192 entries) + tokenised corpus arrays
    arinit     causal-LM pretraining of the DLM's network (Dream's recipe: a DLM starts from an AR model)
    dlm        masked-diffusion training from the arinit weights, Dream shift kept → Dream checkpoint
    ar         causal-LM pretraining of the small Qwen3-shaped helper (RUN/ar/final: its HF directory)

The helper is aligned to the DLM by ``codila train align`` (train/align/), the command every pair uses;
docs/training.md has the line for the bundled pair.

Every stage resumes from ``RUN/<stage>/ckpt.pt`` when run again.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from codila_cli.train import networks
from codila_cli.train.checkpoint import load_checkpoint, save_checkpoint
from codila_cli.train.data import load_tokens, sample_batch, tokenize_split
from codila_cli.train.export import export_value, stage_export
from codila_cli.train.loop import LoopConfig, run_loop
from codila_cli.train.tokenizer import BOS, EOS, EXPAND, MASK, THINK_CLOSE, THINK_OPEN

STAGES = ("corpus", "tokenizer", "arinit", "dlm", "sft", "ar", "tasks", "export")  # then `codila train align`
Log = Callable[[dict], None]


def _ids(run: Path) -> dict[str, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(run / "tokenizer" / "tokenizer.json"))
    return {"eos": tok.token_to_id(EOS), "bos": tok.token_to_id(BOS), "mask": tok.token_to_id(MASK),
            "think_open": tok.token_to_id(THINK_OPEN), "think_close": tok.token_to_id(THINK_CLOSE), "expand": tok.token_to_id(EXPAND),
            "vocab": tok.get_vocab_size()}


def stage_corpus(run: Path, *, data_dir: Path | None, site: Path | None = None) -> dict:
    from codila_cli.train.corpus import build_corpus

    return build_corpus(run / "corpus", data_dir=data_dir, site=site)


def stage_tokenizer(run: Path, *, vocab_size: int = 8192, max_chars: int = 30_000_000,
                    reuse: Path | None = None) -> dict:
    """Train the BPE on the corpus, or with ``reuse`` (a checkpoint directory, e.g. the bundled DLM)
    keep that checkpoint's tokenizer, so its weights can be continued on a new corpus; then tokenise."""
    from codila_cli.train.corpus import read_jsonl
    from codila_cli.train.tokenizer import save_tokenizer, train_tokenizer

    if reuse is not None:
        (run / "tokenizer").mkdir(parents=True, exist_ok=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(reuse / f, run / "tokenizer" / f)
        return _tokenise(run)

    def texts():
        total = 0
        for row in read_jsonl(run / "corpus" / "train.jsonl"):
            if row["kind"] == "file":
                total += len(row["text"])
                if total > max_chars:
                    return
                yield row["text"]

    tok = train_tokenizer(texts(), vocab_size=vocab_size)
    save_tokenizer(tok, run / "tokenizer")
    return _tokenise(run)


def _tokenise(run: Path) -> dict:
    ids = _ids(run)
    out = {}
    for split in ("train", "valid"):
        d = tokenize_split(run / "corpus" / f"{split}.jsonl", run / "tokenizer" / "tokenizer.json",
                           run / f"tokens_{split}.npz", bos=ids["bos"], eos=ids["eos"])
        out[split] = {"stream_tokens": len(d.stream), "function_samples": d.n_functions,
                      "function_tokens": len(d.func_tokens)}
    (run / "tokenizer" / "stats.json").write_text(json.dumps(out, indent=2))
    return out


def _batcher(run: Path, split: str, ids: dict, *, batch: int, seq_len: int, seed: int, function_share: float,
             suffix: str = ""):
    data = load_tokens(run / f"tokens_{split}{suffix}.npz")

    def get(step: int) -> torch.Tensor:
        arr = sample_batch(data, step=step, seed=seed, batch=batch, seq_len=seq_len, bos=ids["bos"],
                           eos=ids["eos"], function_share=function_share)
        return torch.from_numpy(arr.astype(np.int64))

    return get


def _valid_batches(run: Path, ids: dict, *, n: int = 8, batch: int = 16, seq_len: int = 256) -> list[torch.Tensor]:
    get = _batcher(run, "valid", ids, batch=batch, seq_len=seq_len, seed=12345, function_share=0.5)
    return [get(i) for i in range(n)]


def stage_arinit(run: Path, *, steps: int, batch: int = 16, seq_len: int = 256, seed: int = 0,
                 lr: float = 2e-3, on_log: Log | None = None) -> dict:
    from codila_cli.train.objectives import causal_lm_loss

    ids = _ids(run)
    torch.manual_seed(seed)
    model = networks.qwen2(networks.DLM_SHAPE, ids["vocab"], ids)
    get = _batcher(run, "train", ids, batch=batch, seq_len=seq_len, seed=seed, function_share=0.5)
    valid = _valid_batches(run, ids)
    cfg = LoopConfig(steps=steps, lr=lr, seed=seed)
    last = run_loop(model=model, stage_dir=run / "arinit", cfg=cfg,
                    train_step=lambda s, g: causal_lm_loss(model, get(s)),
                    valid_loss=lambda: sum(float(causal_lm_loss(model, v)) for v in valid) / len(valid),
                    on_log=on_log)
    torch.save(model.state_dict(), run / "arinit" / "final.pt")
    return {**last, "tokens": steps * batch * seq_len}


def _dlm_valid(model, valid: list[torch.Tensor], mask_id: int) -> float:
    """Mean CE over masked tokens at 15 % masking (fixed masks): comparable across runs."""
    from codila_cli.train.objectives import diffusion_loss

    g = torch.Generator().manual_seed(777)
    vals = [float(diffusion_loss(model, v, mask_id=mask_id, gen=g, t=torch.full((len(v),), 0.15))[1]) for v in valid]
    return sum(vals) / len(vals)


def stage_dlm(run: Path, *, steps: int, batch: int = 8, seq_len: int = 512, seed: int = 1, lr: float = 1e-3,
              on_log: Log | None = None) -> dict:
    from codila_cli.train.objectives import diffusion_loss

    ids = _ids(run)
    model = networks.qwen2(networks.DLM_SHAPE, ids["vocab"], ids)
    init = run / "arinit" / "final.pt"
    if init.exists() and not (run / "dlm" / "ckpt.pt").exists():
        model.load_state_dict(torch.load(init, map_location="cpu", weights_only=True))
    networks.bidirectional(model)
    get = _batcher(run, "train", ids, batch=batch, seq_len=seq_len, seed=seed, function_share=0.5)
    valid = _valid_batches(run, ids)
    cfg = LoopConfig(steps=steps, lr=lr, seed=seed, warmup=50)
    last = run_loop(model=model, stage_dir=run / "dlm", cfg=cfg,
                    train_step=lambda s, g: diffusion_loss(model, get(s), mask_id=ids["mask"], gen=g)[0],
                    valid_loss=lambda: _dlm_valid(model, valid, ids["mask"]), on_log=on_log)
    meta = {"stage": "dlm", "steps": steps, "batch": batch, "seq_len": seq_len, "valid_ce_15pct": last.get("valid"),
            "shape": asdict(networks.DLM_SHAPE)}
    networks.export_checkpoint(model, run / "dlm" / "final", dream=True, ids=ids, run=run, meta=meta)
    return last


def stage_sft(run: Path, *, steps: int, batch: int = 16, seq_len: int = 256, canvas: int = 128,
              prompted_share: float = 0.5, seed: int = 7, lr: float = 4e-4, frontier: float = 0.0,
              init: Path | None = None, bare_body: str = "as-written", on_log: Log | None = None) -> dict:
    """Continue the DLM with prompt-conditioned diffusion (Dream's SFT recipe): for a share of the rows
    the prompt (signature, with or without docstring) stays visible and only the canvas after it (body,
    then end-of-text) is noised, the exact situation `codila gen` puts the model in; the other rows keep
    the plain diffusion objective on file windows so the model stays a general code DLM.

    ``frontier``: the share of prompted rows whose canvas gets left-to-right masks (objectives.py
    ``diffusion_loss(frontier=…)``): a random prefix of the body stays visible, as when blocks are
    committed left to right, the next slot is masked and the rest at rate t.

    ``bare_body``: what a bare-signature example's canvas holds, ``as-written`` (docstring, then code) or
    ``code`` (the docstring dropped; data.py ``tokenize_prompted``). Each has its own token file.

    Starts from ``RUN/dlm/ckpt.pt``, or from the Dream checkpoint directory ``init`` (e.g. the bundled
    DLM, to continue it on a machine that has only the package)."""
    from codila_cli.train.data import load_prompted, tokenize_prompted
    from codila_cli.train.objectives import diffusion_loss

    ids = _ids(run)
    suffix = "" if bare_body == "as-written" else f".{bare_body}"
    for split in ("train", "valid"):
        if not (run / f"prompted_{split}{suffix}.npz").exists():
            tokenize_prompted(run / "corpus" / f"{split}.jsonl", run / "tokenizer" / "tokenizer.json",
                              run / f"prompted_{split}{suffix}.npz", bare_body=bare_body)
    prompted = {s: load_prompted(run / f"prompted_{s}{suffix}.npz") for s in ("train", "valid")}
    if init is not None:
        model = networks.dlm_from_final(run, "sft", ids, init=init)
    else:
        model = networks.bidirectional(networks.qwen2(networks.DLM_SHAPE, ids["vocab"], ids))
        if not (run / "sft" / "ckpt.pt").exists():
            src = run / "dlm" / "ckpt.pt"
            model.load_state_dict(load_checkpoint(src)["model"])
    n_prompted = round(batch * prompted_share)
    stream = _batcher(run, "train", ids, batch=batch - n_prompted, seq_len=seq_len, seed=seed, function_share=0.3)

    def rows_at(split: str, step: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        from codila_cli.train.data import sample_prompted

        rng = np.random.default_rng([seed, step, 3])
        x, m = sample_prompted(prompted[split], rows=rng.integers(len(prompted[split]), size=n), seq_len=seq_len,
                               canvas=canvas, bos=ids["bos"], eos=ids["eos"])
        return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(m)

    if not 0.0 <= frontier <= 1.0:
        raise ValueError(f"frontier must be in [0, 1], got {frontier}")

    def train_step(step: int, g: torch.Generator) -> torch.Tensor:
        xp, mp = rows_at("train", step, n_prompted)
        xs = stream(step)
        ms = torch.ones_like(xs, dtype=torch.bool)
        ms[:, 0] = False
        front = None
        if frontier > 0:
            front = torch.full((batch,), -1, dtype=torch.long)
            rng = np.random.default_rng([seed, step, 5])
            for r in range(n_prompted):
                if rng.random() < frontier:
                    cols = mp[r].nonzero().flatten()  # the canvas
                    front[r] = int(cols[0]) + int(rng.integers(len(cols)))
        return diffusion_loss(model, torch.cat([xp, xs]), mask_id=ids["mask"], gen=g, maskable=torch.cat([mp, ms]),
                              frontier=front)[0]

    def vloss() -> float:
        """Mean CE over canvas tokens at 50 % masking of prompted validation rows (fixed masks)."""
        g = torch.Generator().manual_seed(4242)
        vals = []
        for i in range(6):
            x, m = rows_at("valid", 100_000 + i, 16)
            vals.append(float(diffusion_loss(model, x, mask_id=ids["mask"], gen=g, maskable=m,
                                             t=torch.full((16,), 0.5))[1]))
        return sum(vals) / len(vals)

    cfg = LoopConfig(steps=steps, lr=lr, seed=seed, warmup=50)
    last = run_loop(model=model, stage_dir=run / "sft", cfg=cfg, train_step=train_step, valid_loss=vloss,
                    on_log=on_log)
    meta = {"stage": "sft", "steps": steps, "batch": batch, "seq_len": seq_len, "canvas": canvas,
            "prompted_share": prompted_share, "frontier": frontier, "bare_body": bare_body,
            "init": init.name if init else "dlm", "lr": lr,
            "valid_canvas_ce_50pct": last.get("valid"), "shape": asdict(networks.DLM_SHAPE)}
    networks.export_checkpoint(model, run / "sft" / "final", dream=True, ids=ids, run=run, meta=meta)
    return last


def stage_ar(run: Path, *, steps: int, batch: int = 16, seq_len: int = 256, seed: int = 2, lr: float | None = None,
             shape: str = "base", init: Path | None = None, bare_body: str = "as-written",
             on_log: Log | None = None) -> dict:
    """Causal-LM pretraining of the helper, from random weights or (``init``) continuing an exported
    helper directory of the same shape and vocabulary, e.g. the bundled one (issue 26).

    ``bare_body`` ``code``: the training function samples also hold each documented function once more
    without its docstring (data.py ``tokenize_split``; its own token file); validation is unchanged."""
    from codila_cli.train.objectives import causal_lm_loss

    ids = _ids(run)
    suffix = "" if bare_body == "as-written" else f".{bare_body}"
    if suffix and not (run / f"tokens_train{suffix}.npz").exists():
        tokenize_split(run / "corpus" / "train.jsonl", run / "tokenizer" / "tokenizer.json",
                       run / f"tokens_train{suffix}.npz", bos=ids["bos"], eos=ids["eos"], bare_body=bare_body)
    torch.manual_seed(seed)
    chosen = networks.AR_SHAPES[shape]
    recorded = run / "ar" / "shape.json"
    if recorded.is_file() and networks.ar_shape(run) != chosen:
        raise ValueError(f"{run / 'ar'} was started with another helper shape; use a new run directory")
    recorded.parent.mkdir(parents=True, exist_ok=True)
    recorded.write_text(json.dumps(asdict(chosen)))
    model = networks.qwen3(chosen, ids["vocab"], ids)
    if init is not None and not (run / "ar" / "ckpt.pt").exists():  # a resumed run reads its checkpoint
        networks.load_helper(model, init)
    get = _batcher(run, "train", ids, batch=batch, seq_len=seq_len, seed=seed, function_share=0.5, suffix=suffix)
    valid = _valid_batches(run, ids)
    cfg = LoopConfig(steps=steps, lr=lr or networks.AR_LR[shape], seed=seed)
    last = run_loop(model=model, stage_dir=run / "ar", cfg=cfg,
                    train_step=lambda s, g: causal_lm_loss(model, get(s)),
                    valid_loss=lambda: sum(float(causal_lm_loss(model, v)) for v in valid) / len(valid),
                    on_log=on_log)
    torch.save(model.state_dict(), run / "ar" / "final.pt")
    networks.export_checkpoint(model, run / "ar" / "final", dream=False, ids=ids, run=run,
            meta={"stage": "ar", "steps": steps, "shape": asdict(chosen), "lr": cfg.lr, "seed": seed,
                  "bare_body": bare_body,
                  "init": init.name if init is not None else None})  # what `codila train align --ar` reads
    return last


def _plan_examples(run: Path, split: str, ids: dict, *, source: Path | None = None):
    """SDDC contract examples of the corpus's files, tokenized with the checkpoint the stage starts from
    (``source``, else the run's finished DLM); cached in RUN/plan3_SPLIT.pt."""
    from codila_cli.decoding.plan_config import PlanConfig
    from codila_cli.models.families import load_dlm
    from codila_cli.train.corpus import read_jsonl
    from codila_cli.train.plan_data import PlanExample, build_examples

    cache = run / f"plan3_{split}.pt"  # 3: plain lists with a checksum (2: prompts name the units)
    if cache.exists():  # plain data only (no pickle of classes); a damaged file is an error naming it
        return [PlanExample(i, m) for i, m in zip(*load_checkpoint(cache)["examples"])]
    dlm = load_dlm(source or networks.final_dlm_dir(run), name="dlm", device=torch.device("cpu"), dtype=torch.float32)
    texts = (r["text"] for r in read_jsonl(run / "corpus" / f"{split}.jsonl") if r["kind"] == "file")
    ex = build_examples(texts, tokenizer=dlm.tokenizer, specials=dlm.specials, vocab_rows=dlm.vocab_rows,
                        config=PlanConfig())
    save_checkpoint({"examples": ([e.ids for e in ex], [e.maskable for e in ex])}, cache)
    return ex


def stage_tasks(run: Path, *, steps: int, batch: int = 8, seed: int = 6, lr: float = 3e-4,
                init: Path | None = None, on_log: Log | None = None) -> dict:
    """Multi-task fine-tune of the finished DLM for `infill` (DreamOn objective) and `plan` (SDDC
    contract-formatted programs), alternating steps → RUN/tasks/final. One checkpoint serves both
    commands, so the bundle stays under its size cap."""
    from tokenizers import Tokenizer

    from codila_cli.train.objectives import diffusion_loss, dreamon_batch, dreamon_loss

    ids = _ids(run)
    newline = Tokenizer.from_file(str(run / "tokenizer" / "tokenizer.json")).token_to_id("Ċ")
    plan = {split: _plan_examples(run, split, ids, source=init) for split in ("train", "valid")}
    model = networks.dlm_from_final(run, "tasks", ids, init=init)
    data = {split: load_tokens(run / f"tokens_{split}.npz") for split in ("train", "valid")}

    def infill_loss(split: str, step: int, g: torch.Generator) -> torch.Tensor:
        d = data[split]
        rng = np.random.default_rng([seed, step, 7])
        rows = [d.func_tokens[d.func_offsets[f] : d.func_offsets[f + 1]][:344].tolist()
                for f in rng.integers(d.n_functions, size=batch)]
        x, y, w = dreamon_batch(rows, bos=ids["bos"], eos=ids["eos"], mask=ids["mask"], expand=ids["expand"],
                                newline=newline, seq_len=384, gen=g)
        return dreamon_loss(model, x, y, w)

    def plan_loss(split: str, step: int, g: torch.Generator) -> torch.Tensor:
        ex = plan[split]
        rng = np.random.default_rng([seed, step, 11])
        picks = [ex[i] for i in rng.integers(len(ex), size=batch)]
        L = max(len(e.ids) for e in picks)
        x0 = torch.full((batch, L), ids["eos"], dtype=torch.long)
        allowed = torch.zeros(batch, L, dtype=torch.bool)
        for r, e in enumerate(picks):
            x0[r, : len(e.ids)] = torch.tensor(e.ids)
            allowed[r, e.maskable] = True
        return diffusion_loss(model, x0, mask_id=ids["mask"], gen=g, maskable=allowed)[0]

    def loss_at(split: str, step: int, g: torch.Generator) -> torch.Tensor:
        return infill_loss(split, step, g) if step % 2 == 0 or not plan[split] else plan_loss(split, step, g)

    def vloss() -> float:
        g = torch.Generator().manual_seed(5)
        return sum(float(loss_at("valid", 10_000 + i, g)) for i in range(4)) / 4

    cfg = LoopConfig(steps=steps, lr=lr, seed=seed, warmup=30)
    last = run_loop(model=model, stage_dir=run / "tasks", cfg=cfg, train_step=lambda s, g: loss_at("train", s, g),
                    valid_loss=vloss, on_log=on_log)
    meta = {"stage": "tasks", "steps": steps, "batch": batch, "valid_loss": last.get("valid"),
            "plan_examples": len(plan["train"]), "init": init.name if init is not None else "dlm",
            "shape": asdict(networks.DLM_SHAPE)}
    networks.export_checkpoint(model, run / "tasks" / "final", dream=True, ids=ids, run=run, meta=meta)
    return last


def stage_args(stage: str, args: list[str]) -> dict:
    """Keyword arguments of a model stage from the command line of ``python -m codila_cli.train.stages``
    after STEPS: ``lr=F``/``batch=N``/``seed=N`` (any stage), ``frontier=F`` (sft), ``bare_body=code`` (sft, ar), a bare INIT_DIR
    (sft, tasks, ar) or SHAPE (ar)."""
    table = {"lr": ("lr", float, None), "frontier": ("frontier", float, ("sft",)), "batch": ("batch", int, None),
             "seed": ("seed", int, None),
             "bare_body": ("bare_body", str, ("sft", "ar"))}
    extra: dict = {}
    for arg in args:
        key, eq, value = arg.partition("=")
        if eq and key in table and (table[key][2] is None or stage in table[key][2]):
            name, kind, _ = table[key]
            extra[name] = kind(value)
        elif not eq and stage == "ar" and arg in networks.AR_SHAPES:
            extra["shape"] = arg
        elif not eq and stage in ("tasks", "sft", "ar"):
            extra["init"] = Path(arg)
        else:
            raise SystemExit(f"unknown argument {arg!r} for stage {stage}")
    return extra


if __name__ == "__main__":
    # python -m codila_cli.train.stages RUN corpus [DATA_DIR] | tokenizer
    #                                   | export [DLM_DIR AR_DIR [TASKS_DIR [KEY=VALUE ...]]]
    #                                   | STAGE STEPS          | tasks STEPS [INIT_DIR] | ar STEPS [small|base] [INIT_DIR]
    #                                   | sft STEPS [INIT_DIR] [frontier=F] [bare_body=code]
    #                                   (every model stage also takes lr=F: the peak learning rate)
    import sys

    run_dir, stage, args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    printer = lambda r: print(json.dumps(r), flush=True) if r["step"] % 50 == 0 or "valid" in r else None
    if stage == "corpus":
        print(stage_corpus(run_dir, data_dir=Path(args[0]) if args else None))
    elif stage == "tokenizer":
        print(stage_tokenizer(run_dir))
    elif stage == "export":
        print(stage_export(run_dir, dlm=Path(args[0]) if args else None, ar=Path(args[1]) if len(args) > 1 else None,
                           tasks=Path(args[2]) if len(args) > 2 else None,
                           ar_decoding={k: export_value(v) for k, v in (a.split("=", 1) for a in args[3:])} or None))
    else:
        fn = {"arinit": stage_arinit, "dlm": stage_dlm, "sft": stage_sft, "ar": stage_ar,
              "tasks": stage_tasks}[stage]
        extra = stage_args(stage, args[1:])
        print(fn(run_dir, steps=int(args[0]), on_log=printer, **extra))
