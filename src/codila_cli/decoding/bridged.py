"""CoDiLA's block writer across two vocabularies (models/token_map.py::TokenMap): the helper's own
decoding/soft_ar.py::SoftBlockWriter, fed in its vocabulary and answered back in the DLM's.

Per block: π [m, V_dlm] is carried onto the paired AR ids (the rest of its mass is dropped, the writer
renormalises); forced tokens, the left context and the text the choice rules read are mapped id by id
(an unpaired forced token conditions nothing, an unpaired context token is left out); the helper's
choices, restricted to paired ids, are mapped back. With ids that pair one to one in order (the Dream /
Qwen case) :func:`make_writer` returns the plain writer: nothing here runs.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import torch


def make_writer(ar: Any, bridge: Any, **kw: Any) -> Any:
    """The block writer for ``ar`` under ``bridge`` (a VocabBridge, or a TokenMap)."""
    from codila_cli.decoding.soft_ar import SoftBlockWriter
    from codila_cli.models.token_map import TokenMap

    if isinstance(bridge, TokenMap):
        return BridgedWriter(SoftBlockWriter(ar, bridge.inner, **kw), bridge)
    return SoftBlockWriter(ar, bridge, **kw)


class _MappedText:
    """A BlockText (decoding/rules.py) in the AR's ids."""

    def __init__(self, text: Any, tmap: Any) -> None:
        self._text, self._map = text, tmap

    def _mapped(self, ids: list[int] | None) -> list[int] | None:
        return None if ids is None else self._map.ids_to_ar(ids)

    @cached_property
    def seen(self) -> list[int]:
        return self._map.ids_to_ar(self._text.seen)

    @cached_property
    def left(self) -> list[int] | None:
        return self._mapped(self._text.left)

    @cached_property
    def done(self) -> list[int] | None:
        return self._mapped(self._text.done)


class BridgedWriter:
    def __init__(self, inner: Any, tmap: Any) -> None:
        self.inner, self.map = inner, tmap

    @property
    def ar(self) -> Any:
        return self.inner.ar

    @ar.setter
    def ar(self, value: Any) -> None:  # a batch row's view of the helper (decoding/batch.py::RowAR)
        self.inner.ar = value

    def _forced(self, forced: list[int | None]) -> list[int | None]:
        to_ar = self.map.to_ar
        return [None if t is None or t >= len(to_ar) or int(to_ar[t]) < 0 else int(to_ar[t]) for t in forced]

    def write(self, pi: torch.Tensor, forced: list[int | None], *, context: list[int] | None = None,
              text: Any = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Tokens [m] in the DLM's ids (soft_ar.py::SoftBlockWriter.write, across the map)."""
        out = self.inner.write(self.map.pi_to_ar(pi), self._forced(forced),
                               context=self.map.ids_to_ar(context) if context else context,
                               text=None if text is None else _MappedText(text, self.map), generator=generator)
        back = self.map.to_dlm.to(out.device)[out]
        own = torch.tensor([-1 if t is None else t for t in forced], device=out.device)
        return torch.where(own >= 0, own, back)

    def verify(self, pi: torch.Tensor, proposal: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
        """AR top-1 [W, B] in the DLM's ids, teacher-forced on ``proposal`` (an unpaired id reads as
        end-of-text in the helper's vocabulary)."""
        to_ar = self.map.to_ar.to(proposal.device)[proposal]
        top = self.inner.verify(self.map.pi_to_ar(pi), torch.where(to_ar >= 0, to_ar, self.map.ar_eos), forced)
        return self.map.to_dlm.to(top.device)[top]
