"""The one table of knobs (decoding/config.py) and what is derived from it: dataclass defaults and
ranges, gen's flags, config.toml's schema, eval's keys, the helper card, the -v line; the choice rules'
invariant (decoding/rules.py); a knob spelled in few files."""

from __future__ import annotations

import math
import re
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from codila_cli.decoding.block import BlockConfig
from codila_cli.decoding.config import (
    GEN_KNOBS,
    INFILL_KNOBS,
    CodilaConfig,
    DreamConfig,
    InfillConfig,
    SamplingConfig,
    ThresholdConfig,
)
from codila_cli.decoding.knobs import build, flat, knob_fields
from codila_cli.decoding.llada import LladaConfig
from codila_cli.decoding.plan_config import PLAN_KNOBS, PlanConfig

SRC = Path(__file__).resolve().parents[1] / "src" / "codila_cli"
CONFIGS = [(DreamConfig, GEN_KNOBS), (ThresholdConfig, GEN_KNOBS), (CodilaConfig, GEN_KNOBS), (LladaConfig, GEN_KNOBS),
           (BlockConfig, GEN_KNOBS), (InfillConfig, INFILL_KNOBS),
           (PlanConfig, PLAN_KNOBS)]
# fields that are no knob: plan's --commit takes "single" or γ (contract.py::parse_commit), --defines names,
# and the budget menu is the contract's vocabulary of budgets
NOT_KNOBS = {"commit", "budget_menu", "defines"}
# knobs whose range holds only together with another knob: the values that let each end be tried
CONTEXT = {
    "entropy_steps": {"convention": "fast-dllm", "cache": "prefix", "max_new_tokens": 100_000, "block_length": 100_000},
    "max_middle_tokens": {"initial_masks": 1},
    "initial_masks": {"max_middle_tokens": 4096},
    "cache_blocks": {"cache": "prefix"},
    "steps": {}, "tokens_per_step": {},
}


@pytest.mark.parametrize("cls, table", CONFIGS, ids=lambda c: getattr(c, "__name__", ""))
def test_every_config_field_is_a_knob_with_the_tables_default(cls, table):
    names = [n for n in knob_fields(cls) if not (cls is PlanConfig and n in NOT_KNOBS)]
    assert set(names) <= set(table), set(names) - set(table)
    defaults = flat(cls())
    assert {n: defaults[n] for n in names} == {n: table.default(n) for n in names}


def _config(cls, table, name, value):
    ctx = {k: v for k, v in CONTEXT.get(name, {}).items() if k in knob_fields(cls)}
    fixed = {n: getattr(cls(), n) for n in NOT_KNOBS if n in knob_fields(cls)}
    return build(cls, lambda n: value if n == name else ctx.get(n, table.default(n)), **fixed)


@pytest.mark.parametrize("cls, table", CONFIGS, ids=lambda c: getattr(c, "__name__", ""))
def test_each_knobs_declared_range_is_what_the_config_accepts(cls, table):
    """Each end of a declared range is accepted and the value just past it refused (ValueError), every
    choice is accepted and another refused: the table says what validation does."""
    checked = 0
    for name in knob_fields(cls):
        if cls is PlanConfig and name in NOT_KNOBS:
            continue
        k = table[name]
        if k.choices:
            allowed = [c for c in k.choices if not (cls in (CodilaConfig, InfillConfig) and c == "origin")]
            for c in allowed:
                _config(cls, table, name, c)
            with pytest.raises(ValueError):
                _config(cls, table, name, "no-such-choice")
            checked += 1
        for end, open_, step in ((k.lo, k.open_lo, -1), (k.hi, k.open_hi, +1)):
            if end is None:
                continue
            inside = end if not open_ else (end - step * 1e-6 if k.kind is float else end - step)
            outside = end + step * (1 if k.kind is int else 1e-3) if not open_ else end
            _config(cls, table, name, k.kind(inside))
            assert k.in_range(k.kind(inside)) and not k.in_range(k.kind(outside)) or outside == k.off
            if outside != k.off:
                with pytest.raises(ValueError):
                    _config(cls, table, name, k.kind(outside))
            checked += 1
    assert checked >= 3


@pytest.mark.parametrize("command, table", [("gen", GEN_KNOBS), ("infill", INFILL_KNOBS), ("plan", PLAN_KNOBS)])
def test_the_commands_flags_are_the_tables(command, table):
    """Every knob with a flag is an option of that name (and its short flag), reading its CODILA_* variable
    (gen; infill and plan have none), offering exactly its choices, in its panel (infill: "Decoding"), with the
    table's default in its help; no knob without a flag has one."""
    import typer.main

    from codila_cli.cli.app import app

    params = {p.name: p for p in typer.main.get_command(app).commands[command].params}
    flagged = 0
    for k in table.values():
        if not k.option:
            assert k.name not in params, k.name
            continue
        p = params[k.name]
        assert k.option in p.opts and (not k.letter or k.letter in p.opts), (k.name, p.opts)
        assert p.envvar == (k.env_var if command == "gen" else None), k.name
        assert p.default is None and p.rich_help_panel == (k.panel if command != "infill" else "Decoding")
        assert f"[default: {k.default_words(helper=command == 'gen')}]" in p.help, k.name
        if k.choices:
            assert list(getattr(p.type, "choices", ())) == list(k.choices), k.name
        if k.kind is bool:
            assert p.secondary_opts == ["--no-" + k.option[2:]], k.name
        flagged += 1
    assert flagged >= {"gen": 30, "infill": 8, "plan": 6}[command]


def test_config_schema_and_eval_keys_come_from_the_table():
    from codila_cli.config import SCHEMA
    from codila_cli.eval.settings import KEYS, parse_setting, recommended_label

    assert SCHEMA["gen"] == {k.name: k.file_types() for k in GEN_KNOBS.values() if k.section == "gen"}
    assert set(SCHEMA["runtime"]) == {"device", "dtype"}
    assert KEYS["codila"][:4] == ("B", "tau", "W", "P") and KEYS["dream"] == ("K", "steps", "exact", "alg")
    rec = {"candidate_blocks": 1, "ar_context": 64, "ar_repetition_penalty": 1.5, "ar_syntax_guard": True,
           "ar_no_repeat_ngram": 8, "cache": "prefix", "cache_blocks": 8, "conditioning": "topk:16"}
    label = recommended_label(rec)
    assert label == "codila:B=4,W=1,cond=topk:16,cache=prefix,cb=8,ctx=64,rp=1.5,sg=1,ng=8"
    cfg = parse_setting(label, max_new_tokens=64).config  # the label runs what it names
    assert {k: v for k, v in flat(cfg).items() if k in rec} == rec
    assert recommended_label({**rec, "cache": "none"}).endswith("ctx=64,rp=1.5,sg=1,ng=8")  # no window without a cache
    with pytest.raises(ValueError, match="ng"):
        parse_setting("codila:ng=1", max_new_tokens=8)


def test_the_helper_card_accepts_only_recommendable_knobs_in_range(tmp_path):
    from codila_cli.helper_card import check, read_card, validate_decoding, write_card

    assert set(GEN_KNOBS.recommendable()) == {"block_size", "candidate_blocks", "conditioning", "cache",
                                              "cache_blocks", "ar_context", "ar_repetition_penalty",
                                              "ar_syntax_guard", "ar_no_repeat_ngram"}
    card = read_card({"codila_decoding": {"ar_context": 8, "tau": 0.5, "ar_repetition_penalty": 0.5,
                                          "cache": "fast", "ar_no_repeat_ngram": 1, "ar_syntax_guard": 1,
                                          "by_block_size": {"8": {"ar_repetition_penalty": 2}, "x": {}}}})
    assert card.decoding == {"ar_context": 8}
    assert card.by_block_size == {8: {"ar_repetition_penalty": 2.0}}
    assert len(card.problems) == 6  # tau, rp 0.5, cache "fast", ng 1, sg 1 (not a bool), block size "x"
    assert card.recommended(block_size=8) == {"ar_context": 8, "ar_repetition_penalty": 2.0}
    assert card.recommended() == {"ar_context": 8}
    assert check("ar_repetition_penalty", 1.3) is None and "range" in check("ar_context", -1)
    with pytest.raises(ValueError, match="recommendable"):
        validate_decoding({"tau": 0.5})
    cfg = write_card({"a": 1, "codila_decoding": {"ar_context": 4}}, decoding={}, training={"dlm": {"name": "x"}})
    assert "codila_decoding" not in cfg and read_card(cfg).aligned_dlm == {"name": "x"}


def test_dash_v_settings_line_is_the_eval_label():
    from types import SimpleNamespace

    from codila_cli.report import settings_line

    ckpt = SimpleNamespace(dtype=torch.float32)
    models = SimpleNamespace(dlm=SimpleNamespace(name="d", device="cpu", ckpt=ckpt), ar=None)
    cfg = CodilaConfig(candidate_blocks=1, ar_no_repeat_ngram=8, tau=0.5)
    assert settings_line("codila", cfg, models) == ("settings: codila:B=4,tau=0.5,W=1,cache=none,ctx=0,rp=1,ng=8  "
                                                    f"dlm: d (cpu, float32)  threads: {torch.get_num_threads()}")
    assert settings_line("dream", DreamConfig(max_new_tokens=16), models).startswith("settings: dream:steps=16  ")


def test_helper_heuristics_knobs_are_spelled_in_at_most_three_files():
    """A helper knob lives where it is declared (decoding/config.py), where its flag is (cli/gen.py) and
    where it acts (decoding/rules.py or the decoder): nowhere else in the package."""
    texts = {p: p.read_text(encoding="utf-8") for p in SRC.rglob("*.py")}
    for name in ("ar_repetition_penalty", "ar_no_repeat_ngram", "ar_syntax_guard", "conditioning",
                 "parallel_blocks", "verify_penalty", "exact_steps", "entropy_steps", "alg_temp", "ar_temperature",
                 "ar_verify", "initial_masks", "expand_budget", "broadcast_delete", "cache_blocks"):
        # block_length and early_stop: SHARED below (the samplers of three families read them)
        pat = re.compile(r"(?<![\w-])" + name + r"(?![\w-])")
        hits = sorted(str(p.relative_to(SRC)) for p, t in texts.items() if pat.search(t))
        assert len(hits) <= 3, (name, hits)


# Every knob is named in code (identifiers, attribute reads, keywords, string keys, flag and CODILA_*
# strings, eval keys; not comments, docstrings or prose such as help texts and hints) in at most three
# files: where the table declares it (decoding/config.py), where it acts, and at most one more; the
# commands' flags are made from the table (cli/options.py::with_knob_flags) and name no knob. The
# exceptions below list every file that names the knob, each with its reason: a new file that names one
# fails the test; read the knob through the table instead, or add it here with its reason.
SHARED = {
    "block_size": {"decoding/config.py", "decoding/codila.py", "decoding/dreamon.py",  # both block decoders
                   "helper_card.py", "resolve.py",  # a helper's card is keyed by block size
                   "eval/settings.py",  # the paper's grids and the default label's B
                   "train/align/output.py",  # training measures which block size to recommend
                   "decoding/block.py",  # CoDiLA's blocks on a block-diffusion model (SDAR)
                   "models/sdar.py",  # an SDAR checkpoint's trained block size (config.json's key)
                   "models/stable_diffcoder.py",  # likewise, for a Stable-DiffCoder checkpoint that says one
                   "models/validate.py"},  # that key checked as a size before a network is built (issue 60)
    "alg": {"decoding/config.py", "decoding/dream.py", "decoding/codila.py", "decoding/dreamon.py",
            "decoding/marginals.py",  # the confidence rules themselves
            "resolve.py"},  # CoDiLA has no origin rule: the one cross-knob rule between decoders
    "block_length": {"decoding/config.py", "decoding/threshold.py", "decoding/llada.py",  # the block decoders
                     "decoding/block.py", "decoding/llada_fast.py"},  # Fast-dLLM's (Dream's, LLaDA's), LLaDA's, SDAR's
    "exact": {"decoding/config.py", "decoding/llada.py", "decoding/block.py",  # the configs of the samplers it runs
              "engine/generate.py"},  # where it acts: FreeDave instead of the sampler (decoding/freedave.py)
    "early_stop": {"decoding/config.py", "decoding/base.py",  # the table; the canvas, where it acts
                   "decoding/llada.py", "decoding/block.py"},  # LLaDA's and SDAR's configs beside their samplers
    "tau": {"decoding/config.py", "decoding/codila.py", "eval/settings.py",  # CoDiLA's rule; the paper's grid
            "decoding/block.py"},  # CoDiLA inside a block-diffusion model's blocks
    "max_middle_tokens": {"decoding/config.py", "decoding/dreamon.py",
                          "eval/settings.py",  # eval's own length flag sets it
                          "serve/requests.py"},  # OpenAI's max_tokens sets it
}
# Names that are also everyday words of the code (a tensor's device and dtype, training steps, a KV
# cache, the threshold decoder, HF's max_new_tokens, OpenAI's temperature/top_p/top_k/stop): a name
# search cannot tell the knob from the word, so they are not measured here.
WORDS = {"device", "dtype", "steps", "stop", "cache", "decoder", "max_new_tokens", "temperature", "top_p",
         "top_k", "tokens_per_step", "threshold", "eps"}


def _code_spellings(knob, tree) -> bool:
    """Whether a module's code names ``knob``: an identifier, attribute or keyword, or a string that is
    the name, holds its flag or CODILA_* variable, or an eval key (``codila:B=4``); a string with
    whitespace in it is prose (a help text, a hint, a message) and a docstring is documentation."""
    return _names_knob(knob, _summary(tree))


def _summary(tree) -> tuple[set[str], list[str]]:
    """A module's names (identifiers, attributes, keywords, arguments) and its strings that may name a knob
    (not docstrings, not prose with whitespace): read once per module, then matched against every knob."""
    import ast

    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    names, strings = set(), []
    for n in ast.walk(tree):
        name = (n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute)
                else n.arg if isinstance(n, (ast.keyword, ast.arg)) else None)
        if name is not None:
            names.add(name)
        elif (isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
              and not any(c.isspace() for c in n.value)):
            strings.append(n.value)
    return names, strings


def _names_knob(knob, summary: tuple[set[str], list[str]]) -> bool:
    names, strings = summary
    if knob.name in names:
        return True
    flags = [re.escape(s) for s in (knob.option, knob.env_var) if s]
    return any(s == knob.name or any(re.search(r"(?<![\w-])" + f + r"(?![\w-])", s) for f in flags) or (
        knob.short and re.search(r"(?<=[:,])" + re.escape(knob.short) + "=", s)) for s in strings)


def knob_files() -> dict[str, set[str]]:
    """For each knob of the three tables, the package files whose code names it (``_code_spellings``)."""
    import ast

    summaries = {str(p.relative_to(SRC)): _summary(ast.parse(p.read_text(encoding="utf-8"))) for p in SRC.rglob("*.py")}
    out = {}
    for name in dict.fromkeys([*GEN_KNOBS, *INFILL_KNOBS, *PLAN_KNOBS]):
        knobs = [t[name] for t in (GEN_KNOBS, INFILL_KNOBS, PLAN_KNOBS) if name in t]
        out[name] = {f for f, summary in summaries.items() if any(_names_knob(k, summary) for k in knobs)}
    return out


def test_each_knob_is_named_in_at_most_three_files_or_where_the_table_says_why():
    files = knob_files()
    measured = [n for n in files if n not in WORDS]
    assert len(measured) >= 30 and set(SHARED) <= set(measured)
    for name in measured:
        table = "decoding/plan_config.py" if name in PLAN_KNOBS and name not in INFILL_KNOBS else "decoding/config.py"
        assert table in files[name], name  # declared in its table
        if name in SHARED:
            assert files[name] <= SHARED[name], (name, sorted(files[name] - SHARED[name]))
            assert files[name] == SHARED[name], (name, "no longer named in", sorted(SHARED[name] - files[name]))
        else:
            assert len(files[name]) <= 3, (name, sorted(files[name]))


def test_the_measure_sees_code_and_not_prose(tmp_path):
    import ast

    k = GEN_KNOBS["block_size"]
    code = ['x = cfg.block_size', 'f(block_size=4)', 'd["block_size"]', 'o = "--block-size"', 'e = "CODILA_BLOCK_SIZE"',
            'g = ["codila:B=4,tau=0.5"]']
    prose = ['"""Uses block_size."""', '# cfg.block_size', 'h = "try a smaller --block-size"', 'x = cfg.block_sizes',
             'y = "BB=4"']
    assert all(_code_spellings(k, ast.parse(c)) for c in code)
    assert not any(_code_spellings(k, ast.parse(c)) for c in prose)


# --- choice rules: a rule may only lower a logit ------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(rho=st.floats(1.0, 20.0), seen=st.lists(st.integers(0, 39), max_size=12),
       tail=st.lists(st.integers(0, 39), max_size=6), n=st.integers(2, 5), seed=st.integers(0, 2**16))
def test_every_rule_only_lowers_logits(rho, seen, tail, n, seed):
    from codila_cli.decoding.rules import NoRepeatNGram, RepetitionPenalty, Text

    z = torch.randn(40, generator=torch.Generator().manual_seed(seed)) * 5
    text = Text(seen, left=seen, done=seen)
    for rule in (RepetitionPenalty(rho, 40), NoRepeatNGram(n, frozenset({0}))):
        state = rule.start(text)
        if state is None:
            continue
        for tok in tail:
            state = rule.step(state, tok)
        row = z.clone()
        rule.lower_row(state, row)
        assert bool((row <= z).all())
        cols = list(range(40))
        low = rule.lower(state, cols, z.clone())
        assert bool((low <= z).all()) and torch.equal(low, row)  # the short path and the full path agree


def test_the_guard_rule_only_bans(tiny_models):
    from codila_cli.decoding.rules import GuardRule, Text
    from codila_cli.decoding.syntax_guard import SyntaxGuard

    guard = SyntaxGuard(tiny_models.ar.tokenizer, tiny_models.ar.vocab_rows)
    rule = GuardRule(guard)
    ids = tiny_models.ar.tokenizer.encode("def f(x):\n    return g(x", add_special_tokens=False)
    state = rule.start(Text(ids, left=ids))
    z = torch.randn(tiny_models.ar.vocab_rows)
    row = z.clone()
    rule.lower_row(state, row)
    changed = row != z
    assert bool(changed.any()) and bool(torch.isneginf(row[changed]).all())
    cols = list(range(len(z)))
    assert torch.equal(rule.lower(state, cols, z.clone()), row)
    assert not math.isinf(float(row[~changed].min()))


def test_rules_follow_the_config(tiny_models):
    from codila_cli.decoding.rules import GuardRule, NoRepeatNGram, RepetitionPenalty, build_rules

    kinds = lambda cfg, raw=True: [type(r) for r in build_rules(cfg, ar=tiny_models.ar, end_ids=(0,), raw=raw)]
    assert kinds(CodilaConfig()) == []
    on = CodilaConfig(ar_repetition_penalty=1.3, ar_no_repeat_ngram=4, ar_syntax_guard=True)
    assert kinds(on) == [RepetitionPenalty, NoRepeatNGram, GuardRule]
    assert kinds(on, raw=False) == [RepetitionPenalty, NoRepeatNGram]  # a chat answer gets no guard
    assert {f.name for f in fields(SamplingConfig)} <= set(GEN_KNOBS)


def test_gen_help_reads_in_panels_in_the_tables_order():
    """`codila gen --help` groups its options in panels (decoding/knobs.py::PANELS order), each knob's
    flag in the panel the table gives it, the common settings before the decoder internals."""
    import typer.main

    from codila_cli.cli.app import app
    from codila_cli.decoding.knobs import PANELS

    command = typer.main.get_command(app).commands["gen"]
    by_name = {p.name: p for p in command.params}
    for k in GEN_KNOBS.values():
        if k.option:
            assert by_name[k.name].rich_help_panel == k.panel, k.name
    from typer.testing import CliRunner

    full = CliRunner().invoke(app, ["gen", "--help-all"])
    assert full.exit_code == 0
    text = full.stdout
    heads = [line[:-1] for line in text.splitlines() if line.endswith(":") and line[:-1] in PANELS]
    assert heads == sorted(heads, key=PANELS.index) and heads[:4] == ["Input", "Model", "Decoding", "CoDiLA helper"]
    at = lambda flag: text.index(f"\n  {flag} ")
    assert at("--max-new-tokens") < at("--ar-context") < at("--entropy-steps") < at("--json")
    # --help folds "Decoder internals" to its flags (each whole on its line), the other panels stay in full
    short = CliRunner().invoke(app, ["gen", "--help"]).stdout
    internals = [k for k in GEN_KNOBS.values() if k.option and k.panel == "Decoder internals"]
    folded = short.split("\nDecoder internals:\n")[1].split("\n\n")[0]
    assert [w.strip(",.") for w in folded.split() if w.startswith("--") and w != "--help-all."] == [k.option for k in internals]
    words = lambda t: " ".join(t.split())
    assert all(words(k.help)[:24] not in words(short) and words(k.help)[:24] in words(text) for k in internals)
    assert "\n  --ar-context " in short and len(short.splitlines()) < len(text.splitlines()) - 25


@pytest.mark.parametrize("name", ["infill", "plan", "eval"])
def test_infill_plan_and_eval_help_put_every_option_in_a_named_panel(name):
    """Issue 41: the other commands read like gen's --help: every option in a panel of PANELS (input,
    model, decoding, sandbox, output, runtime), only --help left under "Options", panels in order; an
    infill knob's flag in the decoding panel."""
    import typer.main
    from typer.testing import CliRunner

    from codila_cli.cli.app import app
    from codila_cli.decoding.knobs import PANELS

    command = typer.main.get_command(app).commands[name]
    loose = [p.name for p in command.params if p.param_type_name == "option" and not getattr(p, "rich_help_panel", None)]
    assert loose == [], loose
    assert {getattr(p, "rich_help_panel", None) for p in command.params} - {None} <= set(PANELS)
    if name == "infill":
        by_name = {p.name: p for p in command.params}
        assert all(by_name[k].rich_help_panel == "Decoding" for k in INFILL_KNOBS if k in by_name)
    text = CliRunner().invoke(app, [name, "--help"]).stdout
    heads = [line[:-1] for line in text.splitlines() if line.endswith(":") and line[:-1] in PANELS]
    assert heads == sorted(heads, key=PANELS.index) and heads[-1] == "Options"
    assert text.split("\nOptions:\n")[1].split() == ["-h,", "--help", "Show", "this", "message", "and", "exit."]


def test_the_live_view_draws_the_grid_knob_of_each_decoder():
    from codila_cli.ui.live import view_block

    assert view_block(CodilaConfig(block_size=8)) == 8
    assert view_block(ThresholdConfig(block_length=16)) == 16
    assert view_block(DreamConfig()) is None


def test_which_settings_need_the_helper_is_said_by_the_config_and_eval_refuses_them_without_one(tiny):
    """`needs_helper` is the one rule eval, the server and the infill task ask: codila always, DreamOn only
    with an entropy threshold; eval refuses such a setting without an AR helper before anything loads."""
    from codila_cli.errors import UsageError
    from codila_cli.eval.session import choose_settings

    assert CodilaConfig().needs_helper and not DreamConfig().needs_helper and not ThresholdConfig().needs_helper
    assert InfillConfig(tau=0.5).needs_helper and not InfillConfig().needs_helper
    dlm = str(tiny["dlm"])
    for benchmark, label in (("he-infill-single", "dreamon:tau=0.5"), ("heldout", "codila:B=4")):
        with pytest.raises(UsageError, match="need an AR helper"):
            choose_settings(benchmark=benchmark, labels=[label], sweep=False, dlm=dlm, ar=None, max_new_tokens=32)
    plan = choose_settings(benchmark="he-infill-single", labels=["dreamon:K=1"], sweep=False, dlm=dlm, ar=None,
                           max_new_tokens=32)
    assert [p.label for p in plan.settings] == ["dreamon:K=1"] and plan.ar is None
