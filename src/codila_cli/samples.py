"""``codila gen --num-samples N``: N decodes of one prompt with seeds s, s+1, …, batched where that
pays (engine.generate.batching_pays), each in a live view of its own when one is asked for. Nothing here prints."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

ViewFactory = Callable[[int], AbstractContextManager]  # sample index -> a live view (a step-event callback)


def sample_seeds(seed: int | None, n: int) -> list[int]:
    """``seed``, ``seed+1``, …; a random base when no seed is given (always reported)."""
    base = secrets.randbelow(2**31 - 64) if seed is None else seed
    return [base + i for i in range(n)]


def all_greedy(cfg: Any) -> bool:
    """True when a decode draws nothing at random, so every seed gives the same text: static CoDiLA's
    helper writes every token (the DLM's temperature is never used), the other decoders sample from the
    DLM at --temperature, and dynamic CoDiLA does both."""
    return not cfg.draws()


def sample_many(models: Any, text: str, *, decoder: str, config: Any, seeds: list[int], system: str | None = None,
                view: ViewFactory | None = None, on_done: Callable[[int, Any], None] | None = None) -> Any:
    """One batched decode when batching pays (engine.generate.batching_pays), else one sample after another; with
    ``view``, a batch is followed by view(0) and samples in turn each get view(i); ``on_done(i, result)``
    after each sample (all at the end of a batch). Returns a BatchOutcome."""
    from contextlib import nullcontext

    from codila_cli.engine.generate import BatchOutcome, batching_pays, generate, generate_many

    n = len(seeds)
    if batching_pays(models):
        with view(0) if view is not None else nullcontext(None) as v:
            out = generate_many(models, [text] * n, decoder=decoder, config=config, seeds=seeds, system=system,
                                **({"on_step": v} if v is not None else {}))
        for i, r in enumerate(out.results):
            if on_done is not None:
                on_done(i, r)
        return out
    t0 = time.perf_counter()
    results = []
    for i, s in enumerate(seeds):
        with view(i) if view is not None else nullcontext(None) as v:
            results.append(generate(models, text, decoder=decoder, config=config, seed=s, system=system,
                                    **({"on_step": v} if v is not None else {})))
        if on_done is not None:
            on_done(i, results[-1])
    return BatchOutcome.one_after_another(results, time.perf_counter() - t0)


def samples_document(outcome: Any, models: Any) -> dict:
    """``gen -n --json``: one document with the models once, every sample, and the batch's accounting."""
    from codila_cli.engine.generate import SCHEMA_VERSION

    described = models.describe()
    samples = []
    for r in outcome.results:
        doc = r.to_json(models=described)
        doc.pop("models", None)
        doc.pop("schema_version", None)
        samples.append(doc)
    return {"schema_version": SCHEMA_VERSION, "command": "gen", "models": described, "samples": samples,
            "batch": outcome.summary()}
