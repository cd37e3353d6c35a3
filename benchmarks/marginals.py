"""How informative are a DLM's marginals on the held-out prompts? Mean top-1 probability per canvas slot
of the first forward (every slot masked), the quantity CoDiLA's helper reads as soft tokens.

    python benchmarks/marginals.py [--dlm bundled-dlm] [--slots 96] [--limit 120]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from codila_cli.engine.models import load_models
from codila_cli.engine.prompts import encode_prompt
from codila_cli.eval.heldout import load_heldout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dlm", default="bundled-dlm")
    ap.add_argument("--slots", type=int, default=96)
    ap.add_argument("--limit", type=int, default=120)
    args = ap.parse_args()
    dlm = load_models(dlm=args.dlm, ar=None, device="cpu", dtype="float32").dlm
    top: list[list[float]] = [[] for _ in range(args.slots)]
    for task in load_heldout()[: args.limit]:
        ids, _ = encode_prompt(dlm.tokenizer, dlm.specials, task["prompt"])
        x = torch.tensor([ids + [dlm.specials.mask] * args.slots])
        probs = dlm.logits(x, rows=(len(ids), len(ids) + args.slots))[0].softmax(-1)
        for j, p in enumerate(probs.max(-1).values.tolist()):
            top[j].append(p)
    mean = [statistics.mean(v) for v in top]
    print(json.dumps({"dlm": args.dlm, "prompts": len(top[0]), "top1_slot0": round(mean[0], 3),
                      "top1_slot1": round(mean[1], 3), "top1_slot2": round(mean[2], 3),
                      "top1_mean_slots_2_plus": round(statistics.mean(mean[2:]), 3),
                      "top1_max_slots_2_plus": round(max(mean[2:]), 3)}))


if __name__ == "__main__":
    main()
