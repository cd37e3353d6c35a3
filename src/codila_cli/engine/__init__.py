"""codila's runtime as a library: load models once (:mod:`.models`), then run requests through an
:class:`Engine` (:mod:`.core`): gen (:mod:`.generate`), infill and plan (:mod:`.tasks`). The CLI, eval
and ``codila serve`` share it. Submodules import torch lazily."""

from codila_cli.engine.core import Engine
from codila_cli.engine.models import Models, default_ar, default_dlm, default_infill_dlm, load_models

__all__ = ["Engine", "Models", "default_ar", "default_dlm", "default_infill_dlm", "load_models"]
