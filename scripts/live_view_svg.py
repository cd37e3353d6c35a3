"""Render the live view, as it looks mid-run, into docs/live-view.svg from a real run (bundled models).

    python scripts/live_view_svg.py [--prompt "def fib(n):"] [--out docs/live-view.svg] [--dlm … --ar …]

The picture is the LiveView's own renderable captured at a step about halfway through decoding.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from codila_cli.decoding.config import CodilaConfig
from codila_cli.runtime import default_ar, default_dlm, generate, load_models
from codila_cli.ui.live import LiveView


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", default='def is_palindrome(text):\n    """Return True if text reads the same backwards."""\n')
    ap.add_argument("--out", type=Path, default=Path("docs/live-view.svg"))
    ap.add_argument("--dlm", default=None)
    ap.add_argument("--ar", default=None)
    ap.add_argument("--at", type=float, default=0.5, help="fraction of the canvas committed when captured")
    args = ap.parse_args()
    models = load_models(dlm=args.dlm or default_dlm(), ar=args.ar or default_ar(), device="cpu", dtype="float32")
    record = Console(record=True, width=100, force_terminal=True, color_system="truecolor", file=open("/dev/null", "w"))
    cfg = CodilaConfig(max_new_tokens=96, block_size=4)
    view = LiveView(tokenizer=models.dlm.tokenizer, mask_id=models.dlm.specials.mask, console=record,
                    block_size=cfg.block_size, title="codila codila", min_interval=0.0)
    captured = {}

    def hook(event):
        view(event)
        done = sum(1 for t in event.canvas if t != models.dlm.specials.mask)
        if "frame" not in captured and done >= args.at * len(event.canvas):
            captured["frame"] = view.render()

    generate(models, args.prompt, decoder="codila", config=cfg, seed=0, on_step=hook)
    record.print(captured.get("frame", view.render()))
    record.save_svg(str(args.out), title="codila gen — live view")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
