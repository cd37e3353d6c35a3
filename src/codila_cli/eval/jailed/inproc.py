"""The in-process verdict (``"verdict": "in-process"`` tasks, and programs that carry their own asserts).

``python -I inproc.py VERDICT_FD [ENTRY]``: reads a per-run marker from stdin before any program code
runs, executes ``body.py`` and then ``test.py`` (and ``check(ENTRY)``) in one namespace, and writes
``PASS <marker>`` to the verdict descriptor only after they returned. The functions the program defines
may not return objects of classes it defines. This is weaker than the isolated verdict (verdict.py):
the tests run in the program's own process, so a program that finds the marker or the descriptor can
forge a pass. codila labels such rows ``verdict: in-process`` and counts them in the summary.
"""

import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decide import decide


def _stdlib_class(cls):
    """A class the program imported from the standard library (its values compare as the library's)."""
    module = getattr(cls, "__module__", "")
    return (module.split(".")[0] in sys.stdlib_module_names and module != "__main__"
            and getattr(sys.modules.get(module), cls.__qualname__, None) is cls)


def _named_tuple(cls):
    """A class collections.namedtuple made: a tuple with its fields and none of its own comparisons."""
    own = vars(cls)
    return (cls.__bases__ == (tuple,) and type(own.get("_fields")) is tuple
            and not own.keys() & {"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__iter__",
                                  "__len__", "__getitem__", "__contains__", "__bool__", "__class__"})


def _harness():
    marker = sys.stdin.readline().strip()
    sys.stdin = open(os.devnull)
    verdict = os.fdopen(int(sys.argv[1]), "w")
    entry = sys.argv[2] if len(sys.argv) > 2 else ""
    with open("body.py", encoding="utf-8") as fh:
        body = fh.read()
    with open("test.py", encoding="utf-8") as fh:
        test = fh.read()
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    mine = set()

    def plain(value, depth=0):
        t = type(value)
        if _named_tuple(t):  # the program's named tuple compares as a tuple: its items are what count
            t = tuple
        elif t.__module__ == "__main__" or t in mine:
            raise AssertionError(f"the completion returned a {t.__name__} it defines itself")
        if depth < 4 and t in (list, tuple, set, frozenset):
            for v in value:
                plain(v, depth + 1)
        elif depth < 4 and t is dict:
            for k, v in value.items():
                plain(k, depth + 1)
                plain(v, depth + 1)

    def guard(fn):
        def guarded(*a, **k):
            try:
                out = fn(*a, **k)
            except (StopIteration, StopAsyncIteration) as exc:  # would end the tests' map() early: a pass
                raise RuntimeError(f"the completion raised {type(exc).__name__}") from None
            plain(out)
            return out

        guarded.__name__, guarded.__doc__, guarded.__wrapped__ = fn.__name__, fn.__doc__, fn
        return guarded

    def run():
        exec(compile(body, "program.py", "exec"), ns)
        mine.update(v for v in ns.values() if isinstance(v, type) and not _stdlib_class(v))
        for name, v in list(ns.items()):
            if isinstance(v, types.FunctionType):
                ns[name] = guard(v)
        exec(compile(test, "test.py", "exec"), ns)
        if entry:
            ns["check"](ns[entry])

    decide(verdict, marker, run)


_harness()
