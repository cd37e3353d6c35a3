"""Verdicts no program can forge (issue 40, item 1): the tests run in a jail of their own and reach the
program only through plain data. Each attack from the issue runs on the real jail; where it matters,
the same program is also run in-process, where it does pass, so each test shows the wall is what stops it."""

from __future__ import annotations

import json
import math
from collections import Counter, OrderedDict, defaultdict, namedtuple

import pytest
from typer.testing import CliRunner

from codila_cli.cli import app
from codila_cli.eval.jail import detect
from codila_cli.eval.jailed import wire
from codila_cli.eval.sandbox import SandboxLimits, _status, run_sandboxed
from codila_cli.eval.verdict import program_names, reference_for

JAIL = detect().kind != "none"
needs_jail = pytest.mark.skipif(not JAIL, reason="bubblewrap cannot run here")
LIMITS = SandboxLimits(timeout=5.0, cpu_seconds=5, max_procs=16)
CHECK = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(5) == 25\n"


def _both(program: str, test: str = CHECK, entry: str | None = "sq"):
    isolated = run_sandboxed(program, LIMITS, test=test, entry_point=entry)
    in_process = run_sandboxed(program, LIMITS, test=test, entry_point=entry, isolated=False)
    return isolated, in_process


# --- the wire: only data crosses ---------------------------------------------------------------------------

@pytest.mark.parametrize("value", [None, True, 0, -7, 2**200, 1.5, -0.0, "é\u2028\x00", b"\x00\xff", 1 + 2j,
                                   [1, [2, (3, {4: frozenset({5})})]], (), {"a": [1.0, None]}, {(1, 2): {3}},
                                   float("inf"), float("-inf")])
def test_plain_data_crosses_with_its_types(value):
    back = wire.decode(json.loads(json.dumps(wire.encode(value))))
    assert back == value and type(back) is type(value)
    assert repr(back) == repr(value)  # tuple stays tuple, 1 stays int, -0.0 keeps its sign


def test_generators_and_ranges_cross_as_they_compare_in_one_process():
    def gen():
        yield from (1, 2, 3)

    back = wire.decode(json.loads(json.dumps(wire.encode(gen()))))
    assert back != [1, 2, 3] and list(back) == [1, 2, 3]  # as a generator compares, and as it iterates
    assert wire.decode(wire.encode(map(str, (1, 2)))) != ["1", "2"]
    assert wire.decode(wire.encode(range(2, 9, 3))) == range(2, 9, 3)
    with pytest.raises(wire.NotPlain, match="more than"):
        wire.encode(iter(int, 1))  # endless


def test_nan_crosses_and_objects_arrive_as_opaque_stand_ins():
    assert math.isnan(wire.decode(wire.encode(float("nan"))))

    class Yes:
        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    class N(int):
        __module__ = "builtins"  # a class that claims to be a builtin still crosses as its integer

        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    point = namedtuple("Point", "x y")
    assert wire.decode(wire.encode([N(3)])) == [3] and type(wire.decode(wire.encode(N(3)))) is int
    assert wire.decode(wire.encode(N(3))) != 4
    assert wire.decode(wire.encode(Counter("aab"))) == {"a": 2, "b": 1}
    assert type(wire.decode(wire.encode(OrderedDict(a=1)))) is OrderedDict  # rebuilt as the library's own
    assert type(wire.decode(wire.encode(defaultdict(int, a=1)))) is dict  # its factory stays behind
    assert wire.decode(wire.encode(point(1, 2))) == (1, 2)
    yes = wire.decode(wire.encode(Yes()))
    assert isinstance(yes, wire.Opaque) and yes != 2 and yes != yes.__class__("Yes", True) and yes in [yes]
    assert "Yes object" in repr(yes)
    with pytest.raises(AttributeError, match="in-process"):
        yes.anything  # noqa: B018
    with pytest.raises(wire.NotPlain):  # the tests never send the program an object
        wire.encode(Yes(), opaque=False)


@pytest.mark.parametrize("bad", ['{"tuple": 1}', '{"a": 1, "b": 2}', '{"dict": [[1]]}', '{"float": "1e999"}',
                                 '{"complex": ["x", 1]}', '{"object": ["T", 1]}', '{"eval": "1"}'])
def test_malformed_values_are_refused(bad):
    with pytest.raises((ValueError, TypeError)):
        wire.decode(json.loads(bad))


def test_deep_values_are_refused_not_a_crash():
    deep: list = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(wire.NotPlain):
        wire.encode(deep)


# --- which names are the program's ----------------------------------------------------------------------

def test_helpers_the_reference_defines_stay_the_references():
    test = "import math\ndef check(candidate):\n    x = candidate([1, 2])\n    assert math.fabs(poly([1, 2], x)) < 1e-4\n"
    reference = "def poly(xs, x):\n    return sum(xs)\ndef find_zero(xs):\n    return 0.0\n"
    assert program_names(test, entry_point="find_zero", reference=reference) == ["find_zero"]
    assert program_names(test, entry_point="find_zero", reference="") == ["find_zero", "poly"]


def test_without_an_entry_point_the_functions_under_test_are_the_programs_even_over_a_builtin():
    test = "import math\nassert sum(10, 15) == 6\nassert helper(1) == [x for x in range(1)]\n"
    assert program_names(test, entry_point=None, reference="def sum(a, b):\n    return 6\n") == ["helper", "sum"]
    assert program_names("assert (", entry_point="f", reference="") == ["f"]


def test_a_prompt_that_compiles_is_the_reference_of_a_task_without_one():
    assert reference_for(kind="complete", prompt="def f(x):\n    \"\"\"doc\"\"\"\n", reference="").startswith("def f")
    assert reference_for(kind="complete", prompt="def f(x):\n", reference="") == ""
    assert reference_for(kind="infill", prompt="def f(x):\n    \"\"\"d\"\"\"\n", reference="") == ""
    assert reference_for(kind="complete", prompt="x", reference="R") == "R"


# --- the marker -----------------------------------------------------------------------------------------

def test_a_pass_line_without_the_runs_marker_is_no_pass():
    marker = "ab" * 16
    assert _status(f"PASS {marker}", marker, timed_out=False, returncode=0) == "passed"
    for said in ("PASS", "PASS ", f"PASS {marker[:-1]}", f"PASS {marker} extra", "pass " + marker, f"FAIL passed {marker}"):
        assert _status(said, marker, timed_out=False, returncode=0) != "passed", said
    assert _status(f"PASS {marker}", marker, timed_out=True, returncode=None) == "timeout"


# --- the attacks of issue 40, on the real jail ----------------------------------------------------------

FORGE_FDS = ("import os, sys\nfor fd in range(3, 64):\n    for line in ('PASS ' + 'x' * 32, 'FAIL passed'):\n"
             "        try:\n            os.write(fd, (line + '\\n').encode())\n        except OSError:\n            pass\n"
             "os._exit(0)\n")
READ_THE_TESTS = ("import os, re\n_seen = {}\nfor name in os.listdir('.'):\n    try:\n"
                  "        for a, b in re.findall(r'candidate\\((\\d+)\\) == (\\d+)', open(name).read()):\n"
                  "            _seen[int(a)] = int(b)\n    except OSError:\n        pass\n"
                  "def sq(x):\n    return _seen.get(x, -1)\n")
FRAMES = ("import sys, gc\ndef sq(x):\n    f = sys._getframe()\n    while f is not None:\n"
          "        for v in list(f.f_locals.values()):\n            if hasattr(v, 'write') and hasattr(v, 'flush'):\n"
          "                try:\n                    m = [o for o in gc.get_objects() if isinstance(o, str) and len(o) == 32]\n"
          "                    for s in m:\n                        v.write('PASS ' + s + '\\n'); v.flush()\n"
          "                except Exception:\n                    pass\n        f = f.f_back\n    import os\n    os._exit(0)\n")


@needs_jail
def test_writing_the_verdict_pipe_and_exiting_is_no_pass():
    isolated, _ = _both(FORGE_FDS)
    assert not isolated.passed and isolated.status == "error", isolated


@needs_jail
def test_reading_the_test_file_works_in_process_and_not_across_the_wall():
    isolated, in_process = _both(READ_THE_TESTS)
    assert in_process.passed  # the attack is real: in one process it passes tests it never solved
    assert not isolated.passed and isolated.status == "failed"


@needs_jail
def test_walking_the_frames_to_the_harness_finds_nothing_to_forge():
    isolated, in_process = _both(FRAMES)
    assert in_process.status in ("passed", "no-verdict", "error", "failed")
    assert not isolated.passed


@needs_jail
@pytest.mark.parametrize("program", [
    "import builtins\nbuiltins.exec = lambda *a, **k: None\ndef sq(x):\n    return 0\n",  # the tests never run
    "class Yes:\n    def __eq__(self, o):\n        return True\n    __hash__ = None\ndef sq(x):\n    return Yes()\n",
    ("class N(int):\n    __module__ = 'builtins'\n    def __eq__(self, o):\n        return True\n"
     "    __hash__ = int.__hash__\ndef sq(x):\n    return N(0)\n"),
    "class Sq:\n    def __call__(self, x):\n        return type('Y', (), {'__eq__': lambda s, o: True})()\nsq = Sq()\n",
    "import os\nos.environ['X'] = '1'\nraise SystemExit(0)\n",
])
def test_objects_and_tricks_of_the_programs_making_never_pass(program):
    isolated = run_sandboxed(program, LIMITS, test=CHECK, entry_point="sq")
    assert not isolated.passed, isolated


MBPP_596_TEST = 'assert test_tuple_size(("A", 1, "B", 2)) == sys.getsizeof(("A", 1, "B", 2))\n'
MBPP_596_REFERENCE = "import sys\ndef test_tuple_size(tuple_list):\n    return sys.getsizeof(tuple_list)\n"


def test_the_modules_the_tests_reach_are_never_the_programs():
    """MBPP/596 has no entry point and its tests call `sys.getsizeof`: `sys` is the reference's import (or,
    unbound there, a module the tests' jail imports), never a name the program may define."""
    from codila_cli.eval.verdict import test_modules

    assert program_names(MBPP_596_TEST, entry_point=None, reference=MBPP_596_REFERENCE) == ["test_tuple_size"]
    assert program_names(MBPP_596_TEST, entry_point=None, reference="") == ["test_tuple_size"]
    assert test_modules(MBPP_596_TEST, "") == ["sys"]
    assert program_names("assert copy(3) == 3\n", entry_point=None, reference="") == ["copy"]  # called: the program's
    assert test_modules("assert math.floor(x) == 1\n", "def math(x):\n    return x\n") == []  # the reference's own


@needs_jail
def test_a_program_with_its_own_sys_cannot_pass_mbpp_596():
    """Before: the program's `sys` (an object with a fake getsizeof) answered the tests' `sys.getsizeof`."""
    fake = ("class _S:\n    def getsizeof(self, t):\n        return 7\nsys = _S()\n"
            "def test_tuple_size(t):\n    return 7\n")
    honest = "import sys\ndef test_tuple_size(t):\n    return sys.getsizeof(t)\n"
    for reference in (MBPP_596_REFERENCE, ""):
        forged = run_sandboxed(fake, LIMITS, test=MBPP_596_TEST, entry_point=None, reference=reference)
        assert not forged.passed and forged.status == "failed", forged
        assert run_sandboxed(honest, LIMITS, test=MBPP_596_TEST, entry_point=None, reference=reference).passed


@needs_jail
def test_stop_iteration_never_ends_the_tests_loop_into_a_pass():
    """A function that raises StopIteration inside the tests' `all(map(...))` ended the map early, and the
    empty `all` passed; it arrives as a RuntimeError now (PEP 479's rule), in both verdicts."""
    program = "def sq(x):\n    raise StopIteration\n"
    test = "def check(candidate):\n    assert all(map(lambda x: candidate(x) == x * x, [2, 3, 4]))\n"
    isolated, in_process = _both(program, test)
    assert not isolated.passed and "StopIteration" in isolated.detail, isolated
    assert not in_process.passed and "StopIteration" in in_process.detail, in_process
    assert all(o.passed for o in _both("def sq(x):\n    return x * x\n", test))


HONEST = [  # (program, tests): each passes in one process, and must across the wall (issue 53)
    ("def f():\n    return bytearray(b'ab')\n", "assert f() == bytearray(b'ab') and isinstance(f(), bytearray)\n"),
    ("from fractions import Fraction\ndef f():\n    return Fraction(3, 6)\n",
     "from fractions import Fraction\nassert f() == Fraction(1, 2) and f().denominator == 2\n"),
    ("from decimal import Decimal\ndef f():\n    return Decimal('1.10')\n",
     "from decimal import Decimal\nassert f() == Decimal('1.1') and str(f()) == '1.10'\n"),
    ("import datetime\ndef f():\n    return datetime.date(2024, 2, 29) + datetime.timedelta(days=1)\n",
     "import datetime\nassert f() == datetime.date(2024, 3, 1) and f().weekday() == 4\n"),
    (("import datetime\ndef f():\n    return datetime.datetime(2024, 1, 1, 12, tzinfo=datetime.timezone.utc), "
     "datetime.timedelta(hours=1), datetime.time(9, 30)\n"),
     "import datetime\nd, t, h = f()\nassert d.hour == 12 and t == datetime.timedelta(seconds=3600) and h.minute == 30\n"),
    ("from collections import deque\ndef f():\n    return deque([1, 2, 3], maxlen=3)\n",
     "from collections import deque\nq = f()\nq.append(4)\nassert q == deque([2, 3, 4]) and q.maxlen == 3\n"),
    ("from collections import Counter\ndef f(s):\n    return Counter(s)\n",
     "assert f('aab').most_common(1) == [('a', 2)] and f('x') == {'x': 1}\n"),
    ("from collections import OrderedDict\ndef f():\n    return OrderedDict([('b', 1), ('a', 2)])\n",
     "assert list(f()) == ['b', 'a'] and f() == {'a': 2, 'b': 1}\n"),
    ("from collections import namedtuple\nP = namedtuple('P', 'x y')\ndef f():\n    return P(1, 2)\n",
     "p = f()\nassert p.x == 1 and p.y == 2 and p == (1, 2)\n"),
    ("def f():\n    return 10 ** 5000 + 7\n", "assert f() % 10 ** 5000 == 7 and len(str(f() // 10 ** 4000)) == 1001\n"),
    (("class InvalidInput(ValueError):\n    pass\ndef f(x):\n    if x < 0:\n        raise InvalidInput('negative')\n"
     "    return x\n"),
     ("class InvalidInput(ValueError):\n    pass\ntry:\n    f(-1)\n    raise AssertionError('no error')\n"
     "except InvalidInput as e:\n    assert 'negative' in str(e)\n")),
    ("import json\ndef f(s):\n    return json.loads(s)\n",
     "import json\ntry:\n    f('{')\n    raise AssertionError('no error')\nexcept json.JSONDecodeError:\n    pass\n"),
    ("def f():\n    n = 0\n    while True:\n        yield n * n\n        n += 1\n",
     ("import itertools\nassert list(itertools.islice(f(), 5)) == [0, 1, 4, 9, 16]\ng = f()\n"
     "assert next(g) == 0 and next(g) == 1\nassert sum(itertools.islice(f(), 3000)) == sum(i * i for i in range(3000))\n")),
    ("def f(n):\n    for i in range(n):\n        print(i)\n",
     ("import io, contextlib\nbuf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n    f(3)\n"
     "assert buf.getvalue() == '0\\n1\\n2\\n'\n")),
]


@needs_jail
@pytest.mark.parametrize(("program", "test"), HONEST, ids=[f"honest{i}" for i in range(len(HONEST))])
def test_honest_programs_pass_across_the_wall(program, test):
    """Issue 53: these honest programs failed the isolated verdict (a bytearray, a Fraction, a date, a deque,
    a Counter, a named tuple, an int over 4,300 digits, an exception the prompt defines or a standard
    library subclass, an endless generator the tests take a few items of, output the tests capture). The standard library's value types cross as their data
    and are rebuilt as themselves; exceptions arrive as the tests' class of that name; output as output."""
    isolated = run_sandboxed(program, LIMITS, test=test, entry_point=None)
    assert isolated.passed, isolated
    in_process = run_sandboxed(program, LIMITS, test=test, entry_point=None, isolated=False)
    assert in_process.passed, in_process


def test_standard_library_values_cross_and_a_malformed_one_is_refused():
    import datetime
    from collections import Counter, OrderedDict, deque, namedtuple
    from decimal import Decimal
    from fractions import Fraction

    for value in (bytearray(b"\x00x"), Fraction(-7, 3), Decimal("-0.00"), datetime.date(1, 1, 1),
                  datetime.datetime(2024, 5, 6, 7, 8, 9, 10, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
                  datetime.time(23, 59), datetime.timedelta(days=-1, microseconds=3), deque([1, [2]], maxlen=5),
                  Counter("hello"), OrderedDict(z=1, a=2), namedtuple("Pt", "x y")(1, 2.5), -(10 ** 9000), 10 ** 4300):
        back = wire.decode(json.loads(json.dumps(wire.encode(value))))
        assert back == value and type(back).__name__ == type(value).__name__, value
    for bad in ({"fraction": [1, 0]}, {"decimal": 3}, {"date": "2024-13-01"}, {"namedtuple": ["P", ["x", "def"], 1, 2]},
                {"namedtuple": ["P", ["x"], 1, 2]}, {"int": "xyz"}, {"deque": ["a", 1]}):
        with pytest.raises(ValueError):
            wire.decode(bad)


@needs_jail
def test_a_callable_object_that_computes_the_answers_passes():
    program = "class Sq:\n    def __call__(self, x):\n        return x * x\nsq = Sq()\n"
    assert run_sandboxed(program, LIMITS, test=CHECK, entry_point="sq").passed


@needs_jail
def test_a_generator_the_tests_iterate_passes_as_in_one_process():
    program = "def evens(n):\n    return (i for i in range(n) if i % 2 == 0)\n"
    test = "def check(f):\n    assert list(f(7)) == [0, 2, 4, 6]\n    assert f(3) != [0, 2]\n"
    isolated, in_process = _both(program, test, "evens")
    assert isolated.passed and in_process.passed, (isolated, in_process)


@needs_jail
def test_what_the_program_does_to_its_arguments_the_tests_see():
    program = "def fill(xs, d):\n    xs.sort()\n    d['n'] = len(xs)\n"
    test = "def check(f):\n    xs, d = [3, 1, 2], {}\n    assert f(xs, d) is None\n    assert xs == [1, 2, 3] and d == {'n': 3}\n"
    isolated, in_process = _both(program, test, "fill")
    assert isolated.passed and in_process.passed, (isolated, in_process)
    assert not run_sandboxed("def fill(xs, d):\n    return None\n", LIMITS, test=test, entry_point="fill").passed


STACK = ("class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
         "        self.items.append(x)\n    def pop(self):\n        return self.items.pop()\n"
         "    def __len__(self):\n        return len(self.items)\n    def __iter__(self):\n"
         "        return iter(self.items)\n    def __getitem__(self, i):\n        return self.items[i]\n"
         "def depth(s):\n    return len(s.items)\n")
STACK_TEST = ("def check(Stack):\n    s = Stack()\n    s.push(1)\n    s.push(2)\n    assert s.pop() == 2\n"
              "    assert len(s) == 1 and list(s) == [1] and s[0] == 1 and s.items == [1] and s\n"
              "    assert depth(s) == 1  # the object goes back to the program as itself\n")


@needs_jail
def test_a_class_under_test_is_used_across_the_wall():
    """The program's objects stay in its jail; the tests use their public methods and attributes, len,
    iter and [] across it, and can hand them back to the program."""
    isolated, in_process = _both(STACK, STACK_TEST, "Stack")
    assert isolated.passed and in_process.passed, (isolated, in_process)
    wrong = STACK.replace("return self.items.pop()", "return self.items[0]")
    assert not run_sandboxed(wrong, LIMITS, test=STACK_TEST, entry_point="Stack").passed


@needs_jail
def test_the_programs_objects_never_judge_a_comparison():
    """An object with an __eq__ that is always true equals only itself on the tests' side: its __eq__
    is never asked (it would see the expected value)."""
    program = ("class Yes:\n    def __eq__(self, o):\n        return True\n    def __lt__(self, o):\n        return True\n"
               "    def __contains__(self, o):\n        return True\n    __hash__ = object.__hash__\n"
               "def f():\n    return Yes()\n")
    for test in ("assert f() == 3\n", "assert f() < 3\n", "assert 3 in f()\n", "assert f() != f() or True\nassert f() == [1]\n"):
        out = run_sandboxed(program, LIMITS, test=test)
        assert not out.passed, (test, out)
    setter = run_sandboxed(STACK, LIMITS, test="s = Stack()\ns.items = [9]\n")
    assert not setter.passed and "in-process" in setter.detail


@needs_jail
def test_exceptions_the_tests_expect_cross_as_builtin_exceptions():
    test = "def check(f):\n    try:\n        f(-1)\n    except ValueError:\n        pass\n    else:\n        assert False\n"
    ok = "def sq(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x * x\n"
    assert run_sandboxed(ok, LIMITS, test=test, entry_point="sq").passed
    assert not run_sandboxed("def sq(x):\n    return 0\n", LIMITS, test=test, entry_point="sq").passed


@needs_jail
def test_the_jail_keeps_no_capabilities():
    program = ("def caps():\n    f = open('/proc/self/status').read().split('\\n')\n"
               "    return {l.split(':')[0]: int(l.split()[1], 16) for l in f if l.startswith('Cap')}\n")
    test = "def check(c):\n    got = c()\n    assert set(got) >= {'CapEff', 'CapPrm', 'CapBnd'}, got\n" \
           "    assert all(v == 0 for v in got.values()), got\n"
    out = run_sandboxed(program, LIMITS, test=test, entry_point="caps")
    assert out.passed, out


@needs_jail
def test_a_real_eval_run_on_forging_tasks_passes_none_and_labels_in_process_rows(tiny, tmp_path):
    """The issue's run: tasks whose tests are `assert False` and whose programs forge a pass. Isolated,
    none passes; the task marked in-process is labelled so in its row and in the summary."""
    tasks = tmp_path / "forge.jsonl"
    rows = [{"task_id": f"forge/{i}", "prompt": prompt, "test": "def check(c):\n    assert False\n", "entry_point": "f"}
            for i, prompt in enumerate((FORGE_FDS, READ_THE_TESTS.replace("sq", "f"),
                                        "import sys\nsys.exit(0)\ndef f():\n"))]
    rows.append({"task_id": "plain/ok", "prompt": "def f(x):\n    return x + 1\n", "verdict": "in-process",
                 "test": "def check(c):\n    assert c(1) == 2\n", "entry_point": "f"})
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ev"
    r = CliRunner().invoke(app, ["eval", "-b", str(tasks), "--dlm", str(tiny["dlm"]), "--setting", "dream:K=4",
                                 "--max-new-tokens", "4", "-o", str(out), "--timeout", "5", "-q"])
    assert r.exit_code == 0, r.stderr
    got = {row["task_id"]: row for row in map(json.loads, (out / "rows.jsonl").read_text().splitlines())}
    assert [got[f"forge/{i}"]["passed"] for i in range(3)] == [False, False, False]
    assert {got[f"forge/{i}"]["verdict"] for i in range(3)} == {"isolated"}
    assert got["plain/ok"]["verdict"] == "in-process"
    (summary,) = json.loads((out / "summary.json").read_text())
    assert summary["in_process"] == 1
    assert "1 task(s) were judged in-process" in (out / "summary.md").read_text()


def test_a_task_file_with_an_unknown_verdict_is_refused(tiny, tmp_path):
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps({"task_id": "a", "prompt": "def f():\n", "test": "", "entry_point": None,
                                 "verdict": "trust-me"}) + "\n")
    r = CliRunner().invoke(app, ["eval", "-b", str(tasks), "--dlm", str(tiny["dlm"]), "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "verdict 'trust-me' is neither 'isolated' nor 'in-process'" in r.stderr
