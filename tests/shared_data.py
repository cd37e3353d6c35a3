"""Where the tests find ../shared (the project's shared data: benchmark files and parity goldens), which a
fresh clone does not have. ``CODILA_TEST_SHARED`` points elsewhere; ``.ci/run`` sets it to a missing
directory once, so that every test that needs the data is shown to skip, with a reason, without it."""

from __future__ import annotations

import os
from pathlib import Path

SHARED = Path(os.environ.get("CODILA_TEST_SHARED") or Path(__file__).resolve().parents[2] / "shared")
DATA = SHARED / "data"
PARITY = SHARED / "parity"
