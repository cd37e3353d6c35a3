"""Documentation that must stay true: docs/cli.md is regenerated from --help."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cli_reference_is_current():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "scripts" / "gen_cli_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (ROOT / "docs" / "cli.md").read_text() == mod.render(), "run: python scripts/gen_cli_docs.py"


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = 'pip install -q torch==2.13.0 && pip install -q -e ".[test,eval,train,serve]" && python -m pytest'
    assert command in readme and command in ci


def test_settings_reference_is_current():
    spec = importlib.util.spec_from_file_location("gen_settings_docs", ROOT / "scripts" / "gen_settings_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (ROOT / "docs" / "settings.md").read_text() == mod.render(), "run: python scripts/gen_settings_docs.py"


# pages a user reads for how things are now (history: CHANGELOG.md and docs/results/, dated there)
CURRENT = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in ("cli.md", "settings.md"))]


def _sentences(text: str) -> list[str]:
    import re

    return re.split(r"(?<=[.;])\s+|\n\n", text)


def test_defaults_the_docs_state_are_the_codes():
    """Where a page states a flag's default (`--flag`, X by default / defaults to X / (default: X)), X is
    the knob table's; where it states a bundled helper's recommended value (`knob` X), X is its card's;
    where it spells the label `codila gen` runs by default, the label is the one eval derives."""
    import re

    from codila_cli.decoding.config import GEN_KNOBS, INFILL_KNOBS
    from codila_cli.decoding.plan_config import PLAN_KNOBS
    from codila_cli.eval.settings import recommended_label
    from codila_cli.helper_card import recommended_decoding

    by_flag = {k.option: k for t in (PLAN_KNOBS, INFILL_KNOBS, GEN_KNOBS) for k in t.values() if k.option}
    card = recommended_decoding("bundled-ar")
    checked = 0
    for page in CURRENT:
        for sentence in _sentences(page.read_text(encoding="utf-8")):
            forms = (r"`(--[a-z-]+)[^`]*`, `?([\w.:-]+)`? by default", r"`(--[a-z-]+)[^`]*` \(default:? `?([\w.:-]+)`?[),]",
                     r"`(--[a-z-]+)[^`]*` defaults to `?([\w.:-]+)`?")
            for flag, value in (hit for form in forms for hit in re.findall(form, sentence)):
                k = by_flag.get(flag)
                if k is None or "default" not in sentence:
                    continue
                allowed = {str(k.default), k.default_words(helper=False), k.default_text, k.default_words()}
                assert value in allowed, f"{page.name}: {flag} default {value!r}, the code's {k.default_words()!r}"
                checked += 1
            for name, value in re.findall(r"`(\w+)` (\w[\w.:]*)", sentence):
                if name in card and "recommend" in sentence:
                    assert value == str(card[name]).lower() if isinstance(card[name], bool) else value == str(card[name]), \
                        f"{page.name}: the bundled helper's {name} {value!r}, its card's {card[name]!r}"
                    checked += 1
            for label in (hit for line in sentence.splitlines() if "codila gen` runs" in line or "default" in line
                          for hit in re.findall(r"codila:B=(\d+)(,[^`\s)]*rp=[^`\s)]*)", line)):
                b = int(label[0])
                want = recommended_label({**recommended_decoding("bundled-ar", block_size=b), "block_size": b})
                assert f"codila:B={label[0]}{label[1]}" == want, f"{page.name}: a default label, the code's {want}"
                checked += 1
    assert checked >= 5


def test_no_reference_to_a_file_that_is_not_in_the_repository():
    """Paths to the repository's own files (docs/…, src/…, tests/…, benchmarks/…, scripts/…, markdown
    links) in the pages, the code and the tests name files that exist."""
    import re

    files = [*CURRENT, *(ROOT / "src").rglob("*.py"), *(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "scripts").iterdir()]
    path = re.compile(r"(?<![\w./-])((?:docs|benchmarks|scripts|tests|src)/[\w./-]*\w\.(?:md|py|jsonl|json|sh|svg|png|toml))(?!\w)")
    link = re.compile(r"\]\(([^)#\s]+)")
    missing = []
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(encoding="utf-8", errors="replace")
        for m in path.finditer(text):
            if not (ROOT / m.group(1)).exists() and "<" not in m.group(1):
                missing.append(f"{f.relative_to(ROOT)}: {m.group(1)}")
        if f.suffix == ".md":
            for m in link.finditer(text):
                if not m.group(1).startswith(("http://", "https://", "mailto:")) and not (f.parent / m.group(1)).exists():
                    missing.append(f"{f.relative_to(ROOT)}: link {m.group(1)}")
    assert not missing, missing


def test_the_bundled_helpers_values_in_docs_models_are_its_cards():
    """docs/models.md's flag table names the bundled helper's recommended values (issue 50 found 96 and
    1.3 there while the card says 64 and 1.5): each one is the card's."""
    import re

    from codila_cli.models.registry import bundled_path

    card = json.loads((bundled_path("bundled-ar") / "config.json").read_text())["codila_decoding"]
    rows = [line for line in (ROOT / "docs" / "models.md").read_text().splitlines()
            if line.startswith("| `--") and "bundled" in line]
    seen = {}
    for row in rows:
        flag = re.match(r"\| `--([a-z-]+)`", row).group(1)
        for value in re.findall(r"bundled(?: helper)?:? `?([^`),;]+?)`?\)", row):
            seen[flag.replace("-", "_")] = value.strip()
    assert set(seen) >= {"ar_context", "ar_repetition_penalty", "candidate_blocks", "conditioning", "cache", "cache_blocks"}
    for knob, value in seen.items():
        assert str(card[knob]) == value, (knob, value, card[knob])


def test_every_path_a_message_names_exists_and_none_is_the_developers_own():
    """Hints and help name docs/*.md files a user can open (each exists in the repository) and never
    ../shared, which only the project's developers and CI have (issue 50: the MBPP hint pointed there)."""
    import re

    src = ROOT / "src" / "codila_cli"
    named = {m for p in src.rglob("*.py") for m in re.findall(r"docs/[a-z0-9_-]+\.(?:md|svg)", p.read_text())}
    assert named and not [n for n in sorted(named) if not (ROOT / n).is_file()]
    assert not [p for p in src.rglob("*.py") if "../shared" in p.read_text()]
