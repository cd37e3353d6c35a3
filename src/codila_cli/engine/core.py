"""The engine: loaded models plus their resolved settings, running requests (gen, infill, plan; one, or
many decoded together), for the CLI, ``eval`` and a long-running server alike.

A server keeps one :class:`Engine` for its lifetime: each request decodes as one row of the engine's
shared :class:`~codila_cli.decoding.batch.StepBatcher` (:meth:`Engine.generate` with ``batched=True``),
so requests that arrive while others decode join them at the next step. Nothing here prints: decoders
emit step events (``on_step``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from codila_cli.decoding.events import OnStep, no_op
from codila_cli.engine.models import Models


@dataclass
class Engine:
    """``models`` the gen pair; ``infill_models`` the infill model (with the same helper), or None where
    there is none; ``settings`` the resolved gen request the models were loaded for (resolve.GenRequest:
    decoder, its config, where each value came from). ``batcher`` is created on first batched use;
    ``on_batch(kind, rows)`` sees every forward the hardware runs for batched requests (a server's metrics)."""

    models: Models
    infill_models: Models | None = None
    settings: Any = None
    on_batch: Any = None
    lanes: int = 1  # batched steps that may run at once (decoding/batch.py::StepBatcher; a server's --lanes)
    threads: Any = None  # engine/threads.py::Threads: torch's CPU threads and why
    wide: bool = False  # a lone request's steps may take every thread (StepBatcher's ``wide``; a server's check)
    stack: bool = True  # rows share stacked forwards (False: serve --deterministic, StepBatcher's ``stack``)
    _batcher: Any = field(default=None, repr=False)

    @classmethod
    def load(cls, *, dlm: str, ar: str | None, infill_dlm: str | None = None, device: str = "auto",
             dtype: str = "auto", compile: bool = False, settings: Any = None, threads: int | None = None,
             server: bool = False, quantize: str = "none", quantize_ar: str = "none") -> Engine:
        """Load the gen pair and (``infill_dlm``) the infill model, sharing the helper. ``threads``: torch's
        CPU threads (None or 0: the default of engine/threads.py, all usable cores for a ``server``);
        ``quantize``: the DLMs' weights (both), ``quantize_ar`` the helper's (models/quantize.py)."""
        from codila_cli.engine.models import load_models
        from codila_cli.engine.threads import apply_threads

        chosen = apply_threads(threads, serve=server)  # before loading: loading runs on these threads too

        extra = (infill_dlm,) if infill_dlm is not None and infill_dlm != dlm else ()
        # the fit check sizes activations for the command's canvas (a server's requests may ask for any)
        longest = None if server else getattr(getattr(settings, "config", None), "max_new_tokens", None)
        models = load_models(dlm=dlm, ar=ar, device=device, dtype=dtype, compile=compile, also=extra,
                             quantize=quantize, quantize_ar=quantize_ar, max_new_tokens=longest)
        infill = None
        if infill_dlm is not None:
            infill = models if infill_dlm == dlm else load_models(dlm=infill_dlm, ar=None, device=device, dtype=dtype,
                                                                            quantize=quantize)
            if infill is not models and models.ar is not None:
                infill.attach_helper(models.ar)
        models.threads_note = chosen.warning
        return cls(models=models, infill_models=infill, settings=settings, threads=chosen)

    @property
    def batcher(self) -> Any:
        if self._batcher is None:
            from codila_cli.decoding.batch import StepBatcher

            self._batcher = StepBatcher(on_step=self.on_batch, lanes=self.lanes, wide=self.wide, stack=self.stack,
                                        threads=self.threads.count if self.threads is not None else None)
        return self._batcher

    def generate(self, prompt: str, *, decoder: str, config: Any, seed: int | None = None, system: str | None = None,
                 on_step: OnStep = no_op, batched: bool = False, on_row: Any = None,
                 messages: list[dict] | None = None, language: Any = None) -> Any:
        """One completion (engine/generate.py::generate); ``batched``: as a row of the shared batch."""
        from codila_cli.engine.generate import generate

        return generate(self.models, prompt, decoder=decoder, config=config, seed=seed, system=system, on_step=on_step,
                        batcher=self.batcher if batched else None, on_row=on_row, messages=messages, language=language)

    def generate_many(self, prompts: list[str], *, decoder: str, config: Any, seeds: list[int],
                      system: str | None = None, on_step: OnStep = no_op, batched: bool = True) -> Any:
        from codila_cli.engine.generate import generate_many

        return generate_many(self.models, prompts, decoder=decoder, config=config, seeds=seeds, system=system,
                             on_step=on_step, batched=batched)

    def infill_tokens(self, prefix: str, suffix: str, *, config: Any, seed: int | None = None,
                      on_step: OnStep = no_op, batched: bool = False, on_row: Any = None) -> Any:
        """The middle between ``prefix`` and ``suffix`` (engine/tasks.py::infill_tokens) on the infill model."""
        from codila_cli.engine.tasks import infill_tokens

        return infill_tokens(self.require_infill(), prefix, suffix, config=config, seed=seed, on_step=on_step,
                             batcher=self.batcher if batched else None, on_row=on_row)

    def infill(self, src: Any, region: Any, *, config: Any, seed: int | None = None, instruction: str | None = None,
               on_step: OnStep = no_op) -> Any:
        from codila_cli.engine.tasks import infill

        return infill(self.require_infill(), src, region, config=config, seed=seed, instruction=instruction,
                      on_step=on_step)

    def plan(self, prompt: str, *, config: Any, contract: Any = None, seed: int | None = None,
             on_step: OnStep = no_op) -> dict:
        from codila_cli.engine.tasks import plan

        return plan(self.models, prompt, config=config, contract=contract, seed=seed, on_step=on_step)

    def require_infill(self) -> Models:
        if self.infill_models is None:
            from codila_cli.errors import UsageError

            raise UsageError("no infill model is loaded", hint="load one (codila serve --infill-dlm dreamon)")
        return self.infill_models
