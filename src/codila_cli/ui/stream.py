"""Stream final text to stdout while decoding (raw completion mode only).

No decoder in codila ever remasks a committed token, so the longest fully committed prefix of the
canvas is final. After each step the newly final **complete lines** are written and flushed (a line
cannot change once its newline is final, even with tokenizers that clean up spaces), and nothing after
a stop token or a stop line (``stop``, decoding/stops.py: a line is only written once it is complete, so
whether it starts with a stop prefix is known) is ever written. At the end
:meth:`finish` writes whatever remains so that the streamed bytes equal the non-streamed output.
"""

from __future__ import annotations

from typing import Any, TextIO

from codila_cli.decoding.events import StepEvent


class StdoutStreamer:
    def __init__(self, *, tokenizer: Any, specials: Any, prompt: str, out: TextIO, stop: tuple[str, ...] = (),
                 echo: bool = True, context: int = 0) -> None:
        from codila_cli.decoding.stops import ends_line

        self.tok, self.sp, self.out = tokenizer, specials, out
        self.stop = stop
        # as runtime decides it: from the prompt's last token
        self.at_line_start = ends_line(tokenizer, tokenizer.encode(prompt, add_special_tokens=False)) if stop else True
        self.written = ""
        self.echo = echo  # False (gen --completion-only): the prompt is not written
        self.prompt = prompt[context:]  # without piped context (prompts.py); its lines go out with the first step: nothing is written before decoding
        # starts, so a prompt refused by generate (too long for the context) leaves stdout empty

    def _emit(self, text: str) -> None:
        if text:
            self.out.write(text)
            self.out.flush()
            self.written += text

    def __call__(self, event: StepEvent) -> None:
        from codila_cli.engine.prompts import committed_text

        completion = committed_text(self.tok, event.canvas, mask_id=self.sp.mask, stop_ids=set(self.sp.stop_ids))
        if self.stop:
            from codila_cli.decoding.stops import stop_offset

            cut = stop_offset(completion, self.stop, at_line_start=self.at_line_start)
            completion = completion if cut is None else completion[:cut]
        text = (self.prompt if self.echo else "") + completion
        text = text[: text.rfind("\n") + 1]  # whole lines only
        if text.startswith(self.written) and len(text) > len(self.written):
            self._emit(text[len(self.written) :])

    def finish(self, final: str) -> None:
        """Write the rest of ``final`` (the full result); ``final`` always extends what was streamed."""
        if final.startswith(self.written):
            self._emit(final[len(self.written) :])
        else:  # cannot happen with append-only canvases; never print a wrong result silently
            from codila_cli.errors import CodilaError

            raise CodilaError("the streamed text differs from the final result (stdout is incomplete)",
                              hint="run again with --no-stream")
