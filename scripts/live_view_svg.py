"""Render the live views, as they look mid-run, into SVGs from real runs on the bundled models.

    python scripts/live_view_svg.py [--command gen|infill|plan|all] [--out-dir docs] [--dlm … --ar …]

Writes docs/live-view.svg (gen, CoDiLA B = 4), docs/live-view-infill.svg and docs/live-view-plan.svg.
Each picture is the view's own renderable captured at a step about halfway through decoding.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

from rich.console import Console

from codila_cli.decoding.config import CodilaConfig, InfillConfig
from codila_cli.decoding.plan_config import PlanConfig
from codila_cli.engine.generate import generate
from codila_cli.engine.models import default_ar, default_dlm, default_infill_dlm, load_models
from codila_cli.engine.tasks import infill, plan
from codila_cli.helper_card import recommended_decoding
from codila_cli.ui.live import InfillView, LiveView, PlanView

# held-out prompt 10: one on which the bundled pair writes readable code at gen's settings (most of its
# outputs are weaker, docs/results.md); the picture shows the view, not the model's typical quality
GEN_PROMPT = 'def __init__(self, token, chat_id):\n    """Creates a new message in the given `chat_id`."""\n'
INFILL_SOURCE = '''import os


def count_lines(path):
    """Return the number of lines in the file at path."""
    # codila: fill


def main():
    print(count_lines(os.environ.get("FILE", "setup.py")))
'''
PLAN_PROMPT = "Read a CSV file and print the sum of each column\n# defines: read_rows, column_sums, main"


def capture(view, done_fraction: float, mask_id: int):
    """An on_step hook that feeds the view and keeps its rendering once enough is committed."""
    frame: dict = {}

    def hook(event):
        view(event)
        done = sum(1 for t in event.canvas if t != mask_id)
        if "frame" not in frame and event.canvas and done >= done_fraction * len(event.canvas):
            frame["frame"] = view.render()

    return hook, frame


def save(renderable, out: Path, title: str) -> None:
    record = Console(record=True, width=100, force_terminal=True, color_system="truecolor", file=io.StringIO())
    record.print(renderable)
    record.save_svg(str(out), title=title)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--command", default="all", choices=["gen", "infill", "plan", "all"])
    ap.add_argument("--out-dir", type=Path, default=Path("docs"))
    ap.add_argument("--dlm", default=None)
    ap.add_argument("--ar", default=None)
    ap.add_argument("--at", type=float, default=0.5, help="fraction of the canvas committed when captured")
    args = ap.parse_args()
    null = Console(file=io.StringIO())
    if args.command in ("gen", "all"):
        models = load_models(dlm=args.dlm or default_dlm(), ar=args.ar or default_ar(), device="cpu", dtype="float32")
        mask = models.dlm.specials.mask
        rec = {k: v for k, v in recommended_decoding(args.ar or default_ar()).items() if k != "cache_blocks"}
        cfg = CodilaConfig(max_new_tokens=96, **{"block_size": 4, **rec})  # what `codila gen` runs
        view = LiveView(tokenizer=models.dlm.tokenizer, mask_id=mask, console=null, block_width=cfg.block_size,
                        title="codila gen · codila", min_interval=0.0, prompt=GEN_PROMPT)
        hook, frame = capture(view, args.at, mask)
        generate(models, GEN_PROMPT, decoder="codila", config=cfg, seed=0, on_step=hook)
        save(frame.get("frame", view.render()), args.out_dir / "live-view.svg", "codila gen — live view")
    if args.command in ("infill", "all"):
        from codila_cli.infill_files import find_region, read_source, split

        models = load_models(dlm=args.dlm or default_infill_dlm(), ar=None, device="cpu", dtype="float32")
        mask = models.dlm.specials.mask
        src = read_source("-", stdin_bytes=INFILL_SOURCE.encode())
        region = find_region(src, line=None, lines_range=None)
        before, after = split(src, region)
        view = InfillView(prefix=before, suffix=after, tokenizer=models.dlm.tokenizer, mask_id=mask, console=null,
                          title="codila infill · dreamon", min_interval=0.0)
        hook, frame = capture(view, args.at, mask)
        infill(models, src, region, config=InfillConfig(initial_masks=8, max_middle_tokens=48), seed=0, on_step=hook)
        save(frame.get("frame", view.render()), args.out_dir / "live-view-infill.svg", "codila infill — live view")
    if args.command in ("plan", "all"):
        models = load_models(dlm=args.dlm or "bundled-plan", ar=None, device="cpu", dtype="float32")
        mask = models.dlm.specials.mask
        view = PlanView(tokenizer=models.dlm.tokenizer, mask_id=mask, console=null, title="codila plan",
                        min_interval=0.0)
        frames: dict = {}

        def hook(event):
            view(event)
            if event.row > 0 and "frame" not in frames:  # once the units are being denoised, mid-way
                left = sum(1 for row in view._rows.values() for t in row[0] if t == mask)
                total = sum(len(row[0]) for r, row in view._rows.items() if r > 0)
                if total and left <= (1 - args.at) * total:
                    frames["frame"] = view.render()

        plan(models, PLAN_PROMPT, config=PlanConfig(max_units=3), seed=0, on_step=hook)
        save(frames.get("frame", view.render()), args.out_dir / "live-view-plan.svg", "codila plan — live view")


if __name__ == "__main__":
    main()
