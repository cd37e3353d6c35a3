"""Build the dev-ext and heldout-ext … heldout-ext5 prompt sets (issue 26) into the package data.

    python scripts/make_prompt_sets.py --run-dir RUN --site SITE [--only heldout_ext2]

RUN is a run directory whose corpus was built with `codila train corpus --site SITE` (its
corpus/train.jsonl is what the prompts are decontaminated against); SITE holds the packages of
scripts/corpus-packages.txt. dev-ext (80 prompts) comes from DEV_PACKAGES, heldout-ext (120) from
EXTERNAL_PACKAGES, heldout-ext2 (120, session 15) from EXTERNAL2_PACKAGES, heldout-ext3 (120, session 18)
from EXTERNAL3_PACKAGES, heldout-ext4 (120, session 19) from EXTERNAL4_PACKAGES, heldout-ext5 (120,
session 21) from EXTERNAL5_PACKAGES; none is in the corpus.
Settings are chosen on dev-ext (+ dev-ext-bare) only; the held-out sets are reported once per shipped
default. ``--only`` rebuilds one set and leaves the others as they are.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from codila_cli.train.corpus import (
    DEV_PACKAGES,
    EXTERNAL2_PACKAGES,
    EXTERNAL3_PACKAGES,
    EXTERNAL4_PACKAGES,
    EXTERNAL5_PACKAGES,
    EXTERNAL_PACKAGES,
    package_licences,
)
from codila_cli.train.prompt_sets import package_prompts

DATA = Path(__file__).resolve().parent.parent / "src" / "codila_cli" / "data"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--site", type=Path, required=True)
    sets = (("dev_ext", DEV_PACKAGES, 80), ("heldout_ext", EXTERNAL_PACKAGES, 120), ("heldout_ext2", EXTERNAL2_PACKAGES, 120),
            ("heldout_ext3", EXTERNAL3_PACKAGES, 120), ("heldout_ext4", EXTERNAL4_PACKAGES, 120),
            ("heldout_ext5", EXTERNAL5_PACKAGES, 120))
    ap.add_argument("--only", choices=[name for name, _, _ in sets])
    args = ap.parse_args()
    train = args.run_dir / "corpus" / "train.jsonl"
    for name, packages, n in sets:
        if args.only and name != args.only:
            continue
        licences = package_licences(packages, args.site)
        rows = package_prompts(packages, site=args.site, train_jsonl=train, n=n, prefix=name.replace("_", "-"))
        for r in rows:
            r["license"] = licences[r["origin"]]["license"]
            r["version"] = licences[r["origin"]]["version"]
        out = DATA / f"{name}_prompts.jsonl"
        tmp = out.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        tmp.replace(out)
        by = {o: sum(r["origin"] == o for r in rows) for o in packages}
        print(f"{out.name}: {len(rows)} prompts {by}")


if __name__ == "__main__":
    main()
