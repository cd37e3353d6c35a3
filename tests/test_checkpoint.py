"""Checkpoints that carry their checksum (train/checkpoint.py, issue 40 item 4)."""

from __future__ import annotations

import signal

import pytest
import torch

from codila_cli.errors import UsageError
from codila_cli.train.checkpoint import deferred_interrupt, digest, load_checkpoint, save_checkpoint


def _state():
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "opt": opt.state_dict(), "step": 7}


def test_a_checkpoint_round_trips_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "ckpt.pt"
    state = _state()
    save_checkpoint(state, path)
    back = load_checkpoint(path)
    assert back["step"] == 7 and all(torch.equal(back["model"][k], state["model"][k]) for k in state["model"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def test_the_digest_sees_every_number_dtype_and_shape():
    base = digest({"w": torch.zeros(2, 2), "step": 1})
    assert digest({"w": torch.zeros(2, 2), "step": 1}) == base
    for other in ({"w": torch.zeros(4), "step": 1}, {"w": torch.zeros(2, 2, dtype=torch.float64), "step": 1},
                  {"w": torch.tensor([[0.0, 0.0], [0.0, 1e-30]]), "step": 1}, {"w": torch.zeros(2, 2), "step": 2},
                  {"w": torch.zeros(2, 2, dtype=torch.bfloat16), "step": 1}):
        assert digest(other) != base, other


@pytest.mark.parametrize("damage", ["truncate", "edit", "empty", "junk"])
def test_a_damaged_checkpoint_is_refused_with_its_name(tmp_path, damage):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(_state(), path)
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-200])
    elif damage == "edit":
        state = torch.load(path, weights_only=True)
        state["step"] = 8
        torch.save(state, path)
    else:
        path.write_bytes(b"" if damage == "empty" else b"not a checkpoint" * 10)
    with pytest.raises(UsageError) as info:
        load_checkpoint(path)
    assert str(path) in info.value.message and f"delete {path}" in info.value.hint


def test_a_checkpoint_without_its_checksum_is_refused(tmp_path):
    """Issue 53: a checkpoint whose digest was removed was trained on (as one from before digests), so
    removing the key let any change through. It is refused, naming the file."""
    path = tmp_path / "old.pt"
    torch.save(_state(), path)
    with pytest.raises(UsageError, match="no checksum"):
        load_checkpoint(path)
    save_checkpoint(_state(), path)
    stripped = torch.load(path, weights_only=True)
    del stripped["sha256"]
    stripped["step"] = 9  # a change the digest would have caught
    torch.save(stripped, path)
    with pytest.raises(UsageError, match="no checksum"):
        load_checkpoint(path)


def test_ctrl_c_waits_for_the_end_of_the_update():
    done = []
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's foreground job has it
    try:
        with pytest.raises(KeyboardInterrupt), deferred_interrupt():
            signal.raise_signal(signal.SIGINT)
            done.append("the update finished")
        assert done == ["the update finished"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_an_ignored_ctrl_c_stays_ignored_through_an_update():
    """As a script's background job (`codila train align … &`) SIGINT is ignored: an update must not turn a stray
    one into a KeyboardInterrupt that stops the run (it did: the update installed its own handler)."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with deferred_interrupt():
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    except KeyboardInterrupt:  # a failure of this test, not an interrupt of the test run
        pytest.fail("an ignored SIGINT stopped the update with KeyboardInterrupt")
    finally:
        signal.signal(signal.SIGINT, before)
