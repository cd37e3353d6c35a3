"""SDDC plan: contract parser, template round trip, canvas isolation, commitment, metrics, the command."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from codila_cli.cli import app
from codila_cli.contract import Contract, ContractError, Entry, parse_contract
from codila_cli.decoding.plan_config import PlanConfig
from codila_cli.decoding.sddc import ContractTemplate, decode_plan
from codila_cli.plan_metrics import all_defined, misbound_overrun

GOOD = "@unit 1 role=function budget=32 def=parse use=\n@unit 2 role=main budget=16 def= use=parse\n@end\n"


def test_parse_good_contract():
    c = parse_contract(GOOD)
    assert [e.role for e in c.entries] == ["function", "main"] and c.entries[1].uses == ("parse",)
    assert parse_contract(c.text()) == c


@pytest.mark.parametrize("text", ["", "@end\n", "@unit 2 role=main budget=3 def= use=\n@end\n",
                                  "@unit 1 role=boss budget=3 def=a use=\n@end\n",
                                  "@unit 1 role=main budget=x def= use=\n@end\n",
                                  "@unit 1 role=function budget=3 def= use=\n@end\n",
                                  "@unit 1 role=main budget=3 def=1a use=\n@end\n",
                                  "@unit 1 role=main budget=3 def= use=\n", GOOD + "junk\n"])
def test_bad_contracts_raise_contract_error(text):
    with pytest.raises(ContractError):
        parse_contract(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_only_raises_contract_error(text):
    try:
        parse_contract(text)
    except ContractError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["function", "class", "helper", "main"]), st.integers(1, 2048),
                          st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), max_size=3)),
                min_size=1, max_size=5))
def test_contract_text_round_trip(raw):
    import keyword

    entries = tuple(Entry(i + 1, r, b, tuple(d for d in defs if not keyword.iskeyword(d)) or ("x",), ())
                    for i, (r, b, defs) in enumerate(raw))
    c = Contract(entries)
    assert parse_contract(c.text()) == c


def test_template_round_trip(tiny_models):
    dlm = tiny_models.dlm
    cfg = PlanConfig(max_units=3)
    tpl = ContractTemplate(dlm.tokenizer, dlm.specials, cfg, dlm.vocab_rows)
    c = parse_contract("@unit 1 role=function budget=32 def=f use=\n@unit 2 role=main budget=64 def= use=f\n@end\n")
    ids, slots = tpl.layout(tpl.values_of(c))
    back, warnings = tpl.read(ids, slots)
    assert back == c and warnings == []
    masked_ids, _ = tpl.layout()
    assert masked_ids.count(dlm.specials.mask) == len(slots)


def _plan(tiny_models, contract, **kw):
    cfg = PlanConfig(**kw)
    events = []
    res = decode_plan(tiny_models.dlm, tiny_models.dlm.tokenizer.encode("count words"), config=cfg,
                      contract=contract, generator=torch.Generator().manual_seed(0), on_step=events.append)
    return res, events


def test_assembly_removes_markers_and_padding(tiny_models):
    c = parse_contract(GOOD)
    res, _ = _plan(tiny_models, c)
    assert "# unit" not in res.program and "<|endoftext|>" not in res.program and "<|mask|>" not in res.program
    assert res.units[0].startswith("def parse(")
    assert res.program.startswith("def parse(")
    assert res.units[1].startswith('if __name__ == "__main__":\n    ')  # every unit gets a stub (issue 41)


def test_the_one_piece_fallback_gets_the_script_stub_too(tiny_models):
    from codila_cli.contract import single_unit

    res, _ = _plan(tiny_models, single_unit(16))
    assert res.units[0].startswith('if __name__ == "__main__":\n    ') and res.program == res.units[0]


def test_single_commit_one_token_per_active_canvas(tiny_models):
    _, events = _plan(tiny_models, parse_contract(GOOD))
    assert events and all(len(e.positions) == 1 for e in events)
    by_step: dict[int, set[int]] = {}
    for e in events:
        by_step.setdefault(e.step, set()).add(e.row)
    assert by_step[0] == {1, 2}  # both canvases advance in the first iteration


def test_threshold_commit_commits_everything_above_gamma(tiny_models):
    _, low = _plan(tiny_models, parse_contract(GOOD), commit=1e-9)
    assert low[0].positions and len(low[0].positions) > 1  # γ tiny: every masked slot at once
    res, _ = _plan(tiny_models, parse_contract(GOOD), commit=1e-9)
    assert res.iterations == 1


def test_isolated_attention_really_isolates(tiny_models):
    dlm = tiny_models.dlm
    c = parse_contract(GOOD)
    captured = {}
    orig = dlm.logits

    def spy(x, **kw):
        captured.setdefault("x", x.clone())
        captured.setdefault("kw", kw)
        return orig(x, **kw)

    dlm.logits = spy
    try:
        _plan(tiny_models, c, attention="isolated", max_iterations=1)
    finally:
        dlm.logits = orig
    x, kw = captured["x"], captured["kw"]
    pair = kw["pair_mask"]
    # the second canvas starts where the first canvas's rows stop attending
    shared = int(pair.all(dim=0).long().cumprod(0).sum())  # prompt + contract: seen by every row
    last_keys = pair[-1].nonzero().flatten()
    boundary = int(last_keys[last_keys >= shared][0])  # first key of the last canvas
    y = x.clone()
    y[0, boundary - 2] = 7 if int(y[0, boundary - 2]) != 7 else 8  # change a token of canvas 1
    a = dlm.logits(x, **kw)[0, boundary + 4 :]
    b = dlm.logits(y, **kw)[0, boundary + 4 :]
    assert torch.allclose(a, b, atol=1e-5)  # canvas 2 cannot see it
    coupled = dlm.logits(x)[0, boundary + 4 :]
    coupled_changed = dlm.logits(y)[0, boundary + 4 :]
    assert not torch.allclose(coupled, coupled_changed, atol=1e-5)  # with coupled attention it can


def test_misbound_and_overrun_on_hand_made_canvases():
    c = parse_contract("@unit 1 role=function budget=8 def=a use=\n@unit 2 role=function budget=8 def=b use=a\n"
                       "@unit 3 role=function budget=8 def=c use=\n@end\n")
    units = ["def a():\n    return 1\n", "def c():\n    pass\n", "def c():\n    pass\ndef b():\n    pass\n"]
    mis, over = misbound_overrun(c, units)
    assert mis == pytest.approx(1 / 3)  # unit 2 starts with entry 3's definition; unit 3 starts with its own
    assert over == 0  # unit 3 also defines b, but b belongs to an earlier entry: not an overrun
    units = ["def a():\n    return 1\ndef b():\n    pass\n", "def b():\n    pass\n", "def c():\n    pass\n"]
    mis, over = misbound_overrun(c, units)
    assert mis == 0 and over == pytest.approx(1 / 3)
    assert all_defined(c, "".join(units)) and not all_defined(c, units[0])


def test_plan_command_json(tiny, tmp_path):
    f = tmp_path / "c.txt"
    f.write_text(GOOD)
    r = CliRunner().invoke(app, ["plan", "--dlm", str(tiny["dlm"]), "--contract", str(f), "--json", "--seed", "0",
                                 "--commit", "0.5", "count words"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["command"] == "plan" and doc["contract"] == GOOD and len(doc["units"]) == 2
    for key in ("iterations", "latency_seconds", "misbound", "overrun", "all_defined"):
        assert key in doc["metrics"]


def test_plan_model_contract_falls_back_never_crashes(tiny):
    r = CliRunner().invoke(app, ["plan", "--dlm", str(tiny["dlm"]), "--seed", "1", "--max-units", "2",
                                 "--show-contract", "write a parser"])
    assert r.exit_code == 0, r.stderr
    assert "@end" in r.stderr


def test_defines_bind_one_unit_per_name_and_the_model_writes_the_rest(tiny):
    """--defines a,b: entry k defines name k (its role, budget and uses are the model's, and its role is
    never "no unit"); the other entry slots are empty; each unit starts with its name's stub."""
    r = CliRunner().invoke(app, ["plan", "--dlm", str(tiny["dlm"]), "--defines", "alpha, beta", "--max-units", "3",
                                 "--json", "--seed", "0", "--pad-scale", "0.5", "two helpers"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    entries = parse_contract(doc["contract"]).entries
    assert [e.defs for e in entries] == [("alpha",), ("beta",)]
    assert all(e.role in ("function", "class", "method", "helper", "main") for e in entries)
    assert doc["contract_source"] == "model" and len(doc["units"]) == 2
    for unit, name in zip(doc["units"], ("alpha", "beta")):
        first = unit["code"].lstrip().split("\n")[0]
        assert first.startswith((f"def {name}(", f"class {name}")), first
    assert doc["settings"]["defines"] == ["alpha", "beta"]


@pytest.mark.parametrize("flags,message", [
    (["--defines", "a b"], "not a Python identifier"), (["--defines", "a,a"], "listed twice"),
    (["--defines", "a,b,c", "--max-units", "2"], "raise max-units"), (["--defines", "class"], "not a Python identifier"),
    (["--defines", "n" * 65], "longer than 64"),
    (["--defines", "a", "--contract", "c.txt"], "both set the units")])
def test_defines_bad_input_is_a_usage_error(tiny, tmp_path, monkeypatch, flags, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.txt").write_text(GOOD)
    r = CliRunner().invoke(app, ["plan", "--dlm", str(tiny["dlm"]), *flags, "x"])
    assert r.exit_code == 2 and r.stderr.startswith("Error:") and message in r.stderr, r.stderr
    hint = r.stderr.splitlines()[1]
    assert hint.startswith("Hint: ") and "codila gen" not in hint  # the hint is about plan, not another command


@pytest.mark.parametrize("flags", [["--commit", "abc"], ["--commit", "1.5"], ["--attention", "x"],
                                   ["--contract-schedule", "nope"], ["--pad-scale", "0"], ["--max-units", "0"]])
def test_plan_bad_flags(tiny, flags):
    """Exit 2 with an Error: line; a choice outside the table's (--attention, --contract-schedule) is the
    parser's refusal, which `codila` itself prints as its first line
    (tests/test_cli.py::test_console_parse_errors_get_one_error_line_and_a_hint)."""
    r = CliRunner().invoke(app, ["plan", "--dlm", str(tiny["dlm"]), *flags, "x"])
    assert r.exit_code == 2
    assert r.stderr.startswith("Error:") or f"Error: Invalid value for '{flags[0]}'" in r.stderr


def test_bad_contract_file_is_usage_error(tiny, tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("@unit 1 role=boss budget=1 def= use=\n@end\n")
    r = CliRunner().invoke(app, ["plan", "--dlm", str(tiny["dlm"]), "--contract", str(f), "x"])
    assert r.exit_code == 2 and r.stdout == ""
    err, hint = r.stderr.splitlines()
    assert err.startswith(f"Error: {f}: contract line 1: role 'boss'") and hint.startswith("Hint: one line per unit")
    r = CliRunner().invoke(app, ["plan", "--dlm", str(tiny["dlm"]), "--contract", str(tmp_path / "nope.txt"), "x"])
    assert r.exit_code == 2
    assert r.stderr.splitlines()[0] == f"Error: --contract {tmp_path / 'nope.txt'}: no such file"


def test_plan_training_examples_use_the_decoding_layout(tiny_models):
    from codila_cli.train.plan_data import build_examples, plan_prompt

    module = ('"""Tiny word tools."""\n\n\ndef split(s):\n    return s.split()\n\n\n'
              'def count(s):\n    return len(split(s))\n\n\nclass Box:\n    pass\n')
    dlm = tiny_models.dlm
    cfg = PlanConfig(def_slots=8, use_slots=8)
    ex = build_examples([module], tokenizer=dlm.tokenizer, specials=dlm.specials, vocab_rows=dlm.vocab_rows,
                        config=cfg, seq_len=2000)
    assert ex, "no example built"
    text = dlm.tokenizer.decode(ex[0].ids)
    assert "# contract" in text and "# unit 1" in text and "def split(" in text
    prompt = plan_prompt("Tiny word tools.", ["split", "count"])  # the prompt names the units to define
    assert prompt == "Tiny word tools.\n# defines: split, count" and plan_prompt("Tiny word tools.") == "Tiny word tools."
    assert text.startswith(dlm.tokenizer.decode([dlm.specials.bos]) + prompt + "\n# contract")
    tpl = ContractTemplate(dlm.tokenizer, dlm.specials, cfg, dlm.vocab_rows)
    head = len(dlm.tokenizer.encode(prompt)) + 1 + len(dlm.tokenizer.encode("\n# contract\n"))
    ids, slots = tpl.layout()
    contract, _ = tpl.read(ex[0].ids[head : head + len(ids)], slots)
    assert [e.defs for e in contract.entries][:2] == [("split",), ("count",)]
    assert contract.entries[1].uses == ("split",)
    assert all(ex[0].ids[p] != dlm.specials.mask for p in ex[0].maskable)


@pytest.mark.parametrize("floor", [0, 6])
def test_no_unit_ends_before_min_unit_tokens(tiny_models, floor):
    eos = tiny_models.dlm.specials.eos
    _, events = _plan(tiny_models, parse_contract(GOOD), min_unit_tokens=floor, commit=1e-9)
    final = {}
    for e in events:
        final[e.row] = e.canvas
    assert set(final) == {1, 2}
    for canvas in final.values():
        assert eos not in canvas[:floor]


def test_contract_repairs_keywords_and_drops_pure_redefinitions(tiny_models):
    from codila_cli.decoding.sddc import _unkeyword

    assert _unkeyword("is,parse,class,match") == "is_,parse,class_,match"
    dlm = tiny_models.dlm
    tpl = ContractTemplate(dlm.tokenizer, dlm.specials, PlanConfig(max_units=3), dlm.vocab_rows)
    c = Contract((Entry(1, "function", 32, ("parse",)), Entry(2, "function", 32, ("parse",)),
                  Entry(3, "main", 32, (), ("parse",))))
    ids, slots = tpl.layout(tpl.values_of(c))
    back, warnings = tpl.read(ids, slots)
    assert [e.defs for e in back.entries] == [("parse",), ()]
    assert [e.index for e in back.entries] == [1, 2]
    assert warnings == ["unit 2 of the plan was left out: parse is already written by an earlier unit"]


@pytest.mark.skipif(not __import__("codila_cli.models.registry", fromlist=["bundled_available"]).bundled_available(
    "bundled-plan"), reason="bundled weights not installed")
def test_the_documented_prompt_form_names_the_units():
    """docs/plan.md's prompt form (`# defines: a, b`) is read as --defines: the program defines those names
    in that order (issue 41), and the report says what pyflakes finds in it."""
    import json

    from typer.testing import CliRunner

    from codila_cli.cli import app
    from codila_cli.contract import prompt_defines

    assert prompt_defines("Tiny tools.\n# defines: split_words, count_words\n") == "split_words, count_words"
    assert prompt_defines("no names here") is None
    r = CliRunner().invoke(app, ["plan", "Tiny word tools.\n# defines: split_words, count_words", "--seed", "0",
                                 "--json", "-q"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    text = doc["text"]
    assert "def split_words(" in text and "def count_words(" in text
    assert text.index("def split_words(") < text.index("def count_words(")
    assert "warnings" in doc["syntax"]
