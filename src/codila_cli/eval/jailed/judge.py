"""The tests' side of an isolated verdict (eval/verdict.py), run in a jail of its own.

``python -I judge.py VERDICT_FD REQUESTS_FD REPLIES_FD ENTRY NAMES MODULES``: reads a per-run marker
from stdin, runs ``reference.py`` when there is one (the task's trusted code: a reference solution or the
prompt, for helpers the tests use such as HumanEval's ``poly``), imports each of MODULES the reference
left unbound (standard-library modules the tests use), binds each of NAMES (comma-separated:
the entry point and the other names the tests take from the program) to the program's value or to a
stand-in that calls it in the program's jail, runs ``test.py`` and ``check(ENTRY)``, and writes
``PASS <marker>`` to the verdict descriptor only after they returned; otherwise ``FAIL failed …``
(an assertion), ``FAIL error …`` (another exception) or ``FAIL ended …`` (the program's process ended
or broke the protocol). Results arrive as plain data (wire.py), so no object of the program's making
reaches an ``==`` here. An exception the program raises arrives as the tests' class of its name (one
the prompt defines) or its first standard-library class; a ``StopIteration`` as a RuntimeError (as PEP
479 does for generators): raised inside the tests' ``map`` or ``all`` it would end their loop early, a
pass. What a call prints arrives on the tests' stdout (tests that capture it see it).
"""

CONTROL_FLOW = (StopIteration, StopAsyncIteration)  # never raised into the tests as themselves

import builtins
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wire
from decide import decide

LINE_CAP = 16 * 2**20


class Ended(Exception):
    """The program's process ended, or answered with something that is not the protocol."""


def main():
    marker = sys.stdin.readline().strip()
    sys.stdin = open(os.devnull)
    verdict = os.fdopen(int(sys.argv[1]), "w")
    requests = os.fdopen(int(sys.argv[2]), "wb")
    replies = os.fdopen(int(sys.argv[3]), "rb")
    entry = sys.argv[4]
    names = [n for n in sys.argv[5].split(",") if n]
    modules = [n for n in sys.argv[6].split(",") if n] if len(sys.argv) > 6 else []

    def ask(message):
        try:
            requests.write(wire.dumps(message))
            requests.flush()
        except (BrokenPipeError, OSError):
            raise Ended("the program's process ended before it answered") from None
        line = replies.readline(LINE_CAP + 1)
        if not line:
            raise Ended("the program's process ended before it answered")
        if len(line) > LINE_CAP:
            raise AssertionError(f"the program's answer is over {LINE_CAP} bytes")
        try:
            return wire.loads(line)
        except ValueError:
            raise Ended("the program's process broke the protocol") from None

    remotes = {}  # handle -> the one stand-in of that object of the program's

    def resolve(tag, body):
        if tag != "object":
            raise ValueError("the program sent a handle of the tests'")
        type_name, truth, handle = body
        if handle not in remotes:
            remotes[handle] = Remote(handle, type_name, truth)
        return remotes[handle]

    def refer(value):
        return {"handle": value._handle} if type(value) is Remote else None

    def data(value, what):
        try:
            return wire.encode(value, opaque=False, refer=refer)
        except wire.NotPlain as exc:
            raise TypeError(f"the tests pass {what} something that cannot cross to the program: {exc}") from None

    def answer(reply, what):
        kind = reply[0]
        if kind == "ok" and len(reply) in (2, 3, 4):
            if len(reply) == 4 and type(reply[3]) is str and reply[3]:
                sys.stdout.write(reply[3])  # what the call printed, where the tests' own prints go
            try:
                return wire.decode(reply[1], resolve=resolve)
            except (ValueError, TypeError) as exc:
                raise Ended(f"the program's process sent a malformed value ({exc})") from None
        if kind == "refused":
            raise AssertionError(f"{str(reply[1])[:300] if len(reply) > 1 else what} (only data reaches the tests)")
        if kind == "raise" and len(reply) in (3, 4):
            lineage = reply[3] if len(reply) == 4 and type(reply[3]) is list else [f"builtins:{reply[1]}"]
            raise raised_here(str(reply[1]), str(reply[2]), lineage)
        raise Ended("the program's process broke the protocol")

    def raised_here(name, message, lineage):
        """The exception the program raised, as the tests' own class: one the tests or the reference define
        under its name (an exception the prompt defines), else the first of its classes the standard
        library has among the modules imported here (json.JSONDecodeError, then ValueError), built with the message; never a control-flow
        exception (StopIteration arrives as a RuntimeError); a RuntimeError naming it where none fits."""
        fallback = RuntimeError(f"the program raised {name}: {message}")
        for entry in lineage[:16]:
            module, _, qualname = str(entry).partition(":")
            cls = None
            if module == "__main__":
                cls = ns.get(qualname)
            elif module == "builtins":
                cls = getattr(builtins, qualname, None)
            elif module.split(".")[0] in sys.stdlib_module_names and "." not in qualname:
                cls = getattr(sys.modules.get(module), qualname, None)  # a module the tests' side imported
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                continue
            if issubclass(cls, CONTROL_FLOW):
                return fallback
            try:
                return cls(message)
            except Exception:  # noqa: BLE001 - a class that wants other arguments (JSONDecodeError's three)
                try:
                    return cls.__new__(cls, message)  # the instance without its __init__: args = (message,)
                except Exception:  # noqa: BLE001, S112
                    continue
        return fallback

    def write_back(given, after):
        """What the call did to its arguments, done to the tests' own: a list sorted in place, a dict
        filled (the top-level containers keep their identity; what is inside them is the program's copy)."""
        args, kwargs = after
        for old, new in zip(given, [*args, *kwargs.values()]):
            if type(old) is list and type(new) is list:
                old[:] = new
            elif type(old) in (dict, set) and type(new) is type(old):
                old.clear()
                old.update(new)

    def calling(head, what):
        """A stand-in that sends ``head + [args, kwargs]`` and gives the answer (and the arguments' fate)."""
        def call(*args, **kwargs):
            reply = ask([*head, data(list(args), what), data(kwargs, what)])
            out = answer(reply, what)
            if len(reply) >= 3 and reply[2] is not None:
                write_back((*args, *kwargs.values()), answer(["ok", reply[2]], what))
            return out

        return call

    def stand_in(name):
        call = calling(["call", name], name)
        call.__name__ = call.__qualname__ = name
        return call

    class Remote:
        """An object of the program's, left in the program's jail. Its public attributes and methods
        and ``len``, ``iter``, ``[]``, ``str``, ``repr``, ``bool`` are asked for across the wall; it equals
        only itself (a comparison would hand the program the expected value)."""

        __slots__ = ("_buffer", "_done", "_handle", "_type_name")  # underscored: never the program's attributes

        def __init__(self, handle, type_name, truth):
            object.__setattr__(self, "_handle", handle)
            object.__setattr__(self, "_type_name", type_name)
            object.__setattr__(self, "_buffer", [])
            object.__setattr__(self, "_done", False)

        def __getattr__(self, name):
            if name.startswith("_"):
                raise AttributeError(name)
            what = f"{self._type_name}.{name}"
            reply = ask(["attr", self._handle, name])
            if reply[0] == "callable":
                return calling(["method", self._handle, name], what)
            return answer(["ok", reply[1]] if reply[0] == "value" and len(reply) == 2 else reply, what)

        def __setattr__(self, name, value):
            raise AttributeError("the tests cannot set attributes of the program's objects across the wall; "
                                 'such a task needs "verdict": "in-process"')

        def _op(self, op, *args):
            return answer(ask(["op", self._handle, op, data(list(args), op)]), op)

        def __len__(self):
            return self._op("len")

        def __iter__(self):
            if self._type_name == "LazyIterator":  # an iterator that crosses as the tests take it
                return self
            return iter(self._op("iter"))

        def __next__(self):
            if not self._buffer and not self._done:
                done, items = self._op("next")
                object.__setattr__(self, "_done", bool(done))
                self._buffer.extend(items)
            if not self._buffer:
                raise StopIteration
            return self._buffer.pop(0)

        def __getitem__(self, key):
            return self._op("getitem", key)

        def __str__(self):
            return self._op("str")

        def __repr__(self):
            return self._op("repr")

        def __bool__(self):
            return self._op("bool")

    ns = {"__name__": "__main__", "__builtins__": builtins}

    def run():
        if os.path.exists("reference.py"):
            with open("reference.py", encoding="utf-8") as fh:
                exec(compile(fh.read(), "reference.py", "exec"), ns)
        for name in modules:
            if name not in ns:
                ns[name] = importlib.import_module(name)
        first = replies.readline(LINE_CAP + 1)
        if not first:
            raise Ended("the program's process ended before it loaded")
        first = wire.loads(first)
        if first[0] != "loaded":
            answer(first, "the program")
        for name in names:
            reply = ask(["get", name])
            if reply[0] == "raise" and reply[1:2] == ["NameError"] and name != entry:
                ns.pop(name, None)  # the tests meet the missing name only if they use it
                continue
            if reply[0] == "module" and reply[1:] == [name]:  # `import math` in the program: the tests' own math
                ns[name] = importlib.import_module(name)
                continue
            ns[name] = stand_in(name) if reply[0] == "callable" else answer(
                ["ok", reply[1]] if reply[0] == "value" and len(reply) == 2 else reply, name)
        with open("test.py", encoding="utf-8") as fh:
            exec(compile(fh.read(), "test.py", "exec"), ns)
        if entry:
            ns["check"](ns[entry])

    decide(verdict, marker, run, ended=Ended)


main()
