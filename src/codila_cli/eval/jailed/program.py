"""The program's side of an isolated verdict (eval/verdict.py), run in the program's own jail.

``python -I program.py REQUESTS_FD REPLIES_FD``: runs ``body.py`` (the model's program, without any
test), says ``["loaded"]`` (or ``["raise", type, message]`` if it raised), then answers the tests' jail
line by line: ``["get", name]`` → ``["callable"]`` | ``["value", data]`` | ``["module", name]``; ``["call", name, args, kwargs]``
→ ``["ok", data, arguments after the call]`` | ``["raise", type, message]`` | ``["refused", why]`` (the
result is not plain data).
Nothing here is trusted: the program may replace any of it, and can still only send plain data
(wire.py) to a process it cannot see, signal or write to, which holds the tests and decides.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wire


def main():
    requests = os.fdopen(int(sys.argv[1]), "rb")
    replies = os.fdopen(int(sys.argv[2]), "wb")
    sys.stdin = open(os.devnull)

    def send(message):
        replies.write(wire.dumps(message))
        replies.flush()

    def failure(exc):
        return ["raise", type(exc).__name__, str(exc)[:300]]

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
            name = message[1]
            if name not in ns:
                send(["raise", "NameError", f"the program does not define {name!r}"])
                continue
            target = ns[name]
            if message[0] == "get":
                if isinstance(target, type(os)):  # a module the program imported: the tests import their own
                    send(["module", target.__name__])
                else:
                    send(["callable"] if callable(target) else ["value", wire.encode(target)])
                continue
            args = wire.decode(message[2])
            kwargs = wire.decode(message[3])
            out = target(*args, **kwargs)
        except wire.NotPlain as exc:
            send(["refused", str(exc)])
            continue
        except BaseException as exc:  # noqa: BLE001
            send(failure(exc))
            continue
        try:
            data = wire.encode(out)
        except wire.NotPlain as exc:
            send(["refused", f"{name} returned {str(exc).removesuffix(' is not plain data')}, which is not plain data"])
            continue
        except BaseException as exc:  # noqa: BLE001
            send(failure(exc))
            continue
        try:  # the arguments as the call left them: the tests see a list sorted in place
            after = wire.encode([args, kwargs])
        except BaseException:  # noqa: BLE001 - an argument now holds an object: its change stays here
            after = None
        send(["ok", data, after])
    os._exit(0)


main()
