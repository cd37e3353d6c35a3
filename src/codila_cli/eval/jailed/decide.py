"""The last word of a judging process (judge.py, inproc.py), run inside a jail: run the tests and write
the verdict to the verdict descriptor: ``PASS <marker>`` only after they returned, else ``FAIL <kind>
<exception>: <message>`` (``failed`` for an assertion, ``ended`` for the ``ended`` exceptions, ``error``
for anything else, ``SystemExit`` included); then end the process at once (no ``atexit`` hook runs)."""

import os


def decide(verdict, marker, run, ended=()):
    try:
        run()
    except ended as exc:
        kind, failure = "ended", exc
    except AssertionError as exc:
        kind, failure = "failed", exc
    except BaseException as exc:  # noqa: BLE001
        kind, failure = "error", exc
    else:
        verdict.write(f"PASS {marker}\n")
        verdict.flush()
        os._exit(0)
    verdict.write(f"FAIL {kind} {type(failure).__name__}: {str(failure)[:300]}\n")
    verdict.flush()
    os._exit(1)
