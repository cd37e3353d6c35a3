"""Thread counts per thread, the thread-count check, and a lone request taking every core
(engine/threads.py, decoding/batch.py's ``wide`` steps; issue 52)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import torch

from codila_cli.decoding.batch import RowDLM, StepBatcher, run_batched
from codila_cli.engine.threads import thread_invariant, use_threads


class _Out:
    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits


class _ThreadCounting(torch.nn.Module):
    """A "model" whose logits are the thread count it ran on: its bits depend on the count."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(8, 4)

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.emb

    def forward(self, input_ids: torch.Tensor) -> _Out:
        return _Out(torch.full((1, input_ids.shape[1], 8), float(torch.get_num_threads())))


def test_the_check_fails_a_model_whose_bits_depend_on_the_thread_count_and_leaves_narrow():
    assert thread_invariant([_ThreadCounting()], narrow=1, wide=2) is False
    assert torch.get_num_threads() == 1  # left on the narrow count
    assert thread_invariant([_ThreadCounting()], narrow=2, wide=2) is True  # nothing to compare


def test_a_worker_threads_count_is_its_own():
    """torch's count is partly per thread: a worker that sets its own runs on it, and the caller's
    stays what it was."""
    use_threads(1)
    seen = []
    t = threading.Thread(target=lambda: (use_threads(2), seen.append(torch.get_num_threads())))
    t.start()
    t.join()
    assert seen == [2] and torch.get_num_threads() == 1
    torch.set_num_threads(3)  # set behind use_threads' back: the next call still applies its own
    use_threads(1)
    assert torch.get_num_threads() == 1


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch is not built with MKL here")
def test_the_bundled_pair_is_thread_invariant_under_mkls_strict_mode(tmp_path):
    """The server's setting (MKL_CBWR=AUTO,STRICT, set before any GEMM): the bundled models' forwards give
    the same bits on 1 and 2 threads, so a server lets a lone request take both cores. (Without it this
    2-core AMD CPU's fp32 GEMM rounds a 5-token row otherwise on 2 threads than on 1.)"""
    code = ("import json, os\n"
            "from codila_cli.engine.threads import reproducible_gemm, thread_invariant\n"
            "os.environ.pop('MKL_CBWR', None); reproducible_gemm()\n"
            "from codila_cli.engine.models import load_models\n"
            "m = load_models(dlm='bundled-dlm', ar='bundled-ar', device='cpu', dtype='float32')\n"
            "print(json.dumps([os.environ['MKL_CBWR'], thread_invariant([m.dlm.model, m.ar.model], narrow=1, wide=2)]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(out.stdout.splitlines()[-1]) == ["AUTO,STRICT", True]


def _record_steps(monkeypatch) -> list[tuple[int, int]]:
    """(rows decoding, torch threads the leading thread ran it on), per step."""
    seen: list[tuple[int, int]] = []
    real = StepBatcher._step

    def step(self, reqs):
        seen.append((len(self._active), torch.get_num_threads()))
        return real(self, reqs)

    monkeypatch.setattr(StepBatcher, "_step", step)
    return seen


@pytest.mark.parametrize("wide", [True, False])
def test_a_lone_row_takes_every_thread_only_when_wide(tiny_models, monkeypatch, wide):
    """Two lanes on 2 threads: while both lanes have rows each step runs on 1 thread; a row left alone
    runs on 2 where the batcher was told its forwards are thread-invariant, else on 1."""
    seen = _record_steps(monkeypatch)
    batcher = StepBatcher(lanes=2, threads=2, wide=wide, gather_s=0.05)
    x = torch.full((1, 12), tiny_models.dlm.specials.mask, dtype=torch.long)

    both_done = threading.Barrier(2, timeout=60)

    def row(i: int, dlm: RowDLM, b: StepBatcher, rid: int) -> list[torch.Tensor]:
        out = [dlm.logits(x) for _ in range(3)]
        both_done.wait()  # the first six steps ran with both rows decoding
        if i == 1:  # outlive row 0: the last steps are this row's alone
            while b.active > 1:
                threading.Event().wait(0.01)
            out += [dlm.logits(x) for _ in range(2)]
        return out

    out, _ = run_batched(tiny_models.dlm, 2, row, batcher=batcher)
    together = {n for active, n in seen if active == 2}
    alone = [n for active, n in seen if active == 1]
    assert together == {1} and alone == ([2, 2] if wide else [1, 1])
    assert batcher.wide_steps == (2 if wide else 0) and len(out[0]) == 3 and len(out[1]) == 5
    with pytest.raises(ValueError, match="threads"):
        StepBatcher(threads=0)


def test_a_thread_count_over_the_free_cores_is_warned_with_its_cost(monkeypatch):
    """Issue 63: --threads 2 on a busy 2-core machine ran 10x slower than --threads 1 with no word, and
    --threads 64 on 2 cores was taken silently. Both now warn, saying what it costs and what fits."""
    from typer.testing import CliRunner

    from codila_cli.cli import app
    from codila_cli.engine import threads

    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "others_running", lambda: 1)  # one other task keeps a core busy
    run = lambda *a: CliRunner().invoke(app, ["gen", "--max-new-tokens", "4", "--seed", "0", *a, "def f():"])
    busy = run("--threads", "2")
    assert busy.exit_code == 0 and "Warning: --threads 2 with 1 other task(s) running on 2 core(s), 1 free now" in busy.stderr
    assert "--threads 1 or 0 (auto)" in busy.stderr
    assert "Warning: --threads" not in run("--threads", "1").stderr
    assert "Warning: --threads 64 is more than the 2 core(s)" in run("--threads", "64").stderr
    assert "Warning: --threads" not in run("--threads", "2", "-q").stderr
