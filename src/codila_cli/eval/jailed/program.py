"""The program's side of an isolated verdict (eval/verdict.py), run in the program's own jail.

``python -I program.py REQUESTS_FD REPLIES_FD``: runs ``body.py`` (the model's program, without any
test), says ``["loaded"]`` (or ``["raise", type, message]`` if it raised), then answers the tests' jail
line by line:

* ``["get", name]`` → ``["callable"]`` | ``["value", data]`` | ``["module", name]``;
* ``["call", name, args, kwargs]`` → ``["ok", data, arguments after the call, what it printed]`` |
  ``["raise", type, message, its classes as "module:qualname", most derived first]`` | ``["refused", why]``;
* on an object of the program's (it crossed as ``{"object": [type, truth, handle]}`` and stays here):
  ``["attr", handle, name]`` (a public attribute: a value, or ``["callable"]``), ``["method", handle,
  name, args, kwargs]`` (a public method's call, answered as ``call``) and ``["op", handle, op, args]``
  for ``len``, ``iter``, ``getitem``, ``str``, ``repr``, ``bool``: operations whose operands are the
  tests' inputs. Comparisons (``==``, ``<``, ``in``) are never asked: they would hand the program the
  expected value and let it answer "equal".

Nothing here is trusted: the program may replace any of it, and can still only send data (wire.py) to
a process it cannot see, signal or write to, which holds the tests and decides.
"""

import contextlib
import io
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wire

MAX_OBJECTS = 100_000
PRINT_CAP = 2**20  # characters a call's output may send to the tests
OPS = {"len": len, "iter": lambda o: iter(o), "getitem": lambda o, k: o[k], "str": str, "repr": repr, "bool": bool}


def main():
    requests = os.fdopen(int(sys.argv[1]), "rb")
    replies = os.fdopen(int(sys.argv[2]), "wb")
    sys.stdin = open(os.devnull)
    objects, handles = {}, {}  # handle -> object (kept alive, so ids are never reused); id(object) -> handle

    def refer(obj):
        if id(obj) not in handles:
            if len(objects) >= MAX_OBJECTS:
                raise wire.NotPlain(f"the program made more than {MAX_OBJECTS} objects for the tests")
            handles[id(obj)] = len(objects) + 1
            objects[len(objects) + 1] = obj
        return {"object": [type(obj).__name__, wire.truth_of(obj), handles[id(obj)]]}

    def resolve(tag, body):
        if tag == "handle" and body in objects:
            return objects[body]
        raise ValueError("the tests named an object the program never sent")

    def send(message):
        replies.write(wire.dumps(message))
        replies.flush()

    def failure(exc):
        lineage = [f"{c.__module__}:{c.__qualname__}" for c in type(exc).__mro__[:-2]]  # without BaseException, object
        return ["raise", type(exc).__name__, str(exc)[:300], lineage[:16]]

    def public(obj, name):
        if type(name) is not str or name.startswith("_"):
            raise AttributeError(f"the tests may use public attributes only, not {str(name)[:40]!r}")
        return getattr(obj, name)

    def answer_call(fn, args, kwargs):
        printed = io.StringIO()  # what the call prints goes to the tests' stdout (tests may capture it)
        with contextlib.redirect_stdout(printed):
            out = fn(*args, **kwargs)
        try:  # the arguments as the call left them: the tests see a list sorted in place
            after = wire.encode([args, kwargs], refer=refer)
        except BaseException:  # noqa: BLE001 - an argument the tests cannot be shown: its change stays here
            after = None
        return ["ok", wire.encode(out, refer=refer), after, printed.getvalue()[:PRINT_CAP]]

    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        with open("body.py", encoding="utf-8") as fh:
            exec(compile(fh.read(), "program.py", "exec"), ns)
    except BaseException as exc:  # noqa: BLE001 - SystemExit at the top level is no answer either
        send(failure(exc))
        os._exit(1)
    send(["loaded"])
    for line in requests:
        try:
            message = wire.loads(line)
            kind = message[0]
            if kind in ("get", "call") and message[1] not in ns:
                send(["raise", "NameError", f"the program does not define {message[1]!r}"])
                continue
            if kind == "get":
                target = ns[message[1]]
                if isinstance(target, type(os)):  # a module the program imported: the tests import their own
                    send(["module", target.__name__])
                else:
                    send(["callable"] if callable(target) else ["value", wire.encode(target, refer=refer)])
                continue
            obj = resolve("handle", message[1]) if kind in ("attr", "method", "op") else None
            if kind == "attr":
                value = public(obj, message[2])
                send(["callable"] if callable(value) else ["value", wire.encode(value, refer=refer)])
                continue
            if kind == "op" and message[2] == "next":  # the next chunk of an iterator that crossed lazily
                if type(obj) is not wire.LazyIterator:
                    raise TypeError(f"'{type(obj).__name__}' object is not an iterator")
                send(["ok", obj.chunk(lambda v: wire.encode(v, refer=refer)), None])
                continue
            if kind == "op":
                if message[2] not in OPS:
                    raise ValueError(f"the tests may not ask for {str(message[2])[:20]!r} of an object")
                args = wire.decode(message[3], resolve=resolve)
                send(["ok", wire.encode(OPS[message[2]](obj, *args), refer=refer), None])
                continue
            fn = ns[message[1]] if kind == "call" else public(obj, message[2])
            args, kwargs = (wire.decode(message[i], resolve=resolve) for i in ((2, 3) if kind == "call" else (3, 4)))
            send(answer_call(fn, args, kwargs))
        except wire.NotPlain as exc:
            send(["refused", str(exc)])
        except BaseException as exc:  # noqa: BLE001
            send(failure(exc))
    os._exit(0)


main()
