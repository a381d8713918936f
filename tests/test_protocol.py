"""The between-graph protocol: every message survives its stderr line, other lines are not
messages, and the report file round-trips."""
import json
import os

import pytest
from conftest import ROOT

from ensemble.replication import protocol as P

MESSAGES = [
    P.Resume(3, 2, 10),
    P.Steps([0, 4], 1, 10, 7, 20, [0.5, 0.25], 1.5),
    P.Epoch(10, {"member": 2, "epoch": 0, "loss": 0.7, "val_loss": 0.9, "val_accuracy": 0.8,
                 "seconds": 0.3}),
    P.MemberDone(5, 12.25),
    P.Interrupted(1, 4, 10),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.kind)
def test_every_message_round_trips_through_its_line(message):
    line = P.encode(message)
    assert line.startswith(P.PREFIX) and "\n" not in line
    assert P.decode(line) == message


def test_a_message_after_another_writers_partial_line_is_read():
    """The start of a C++ log line, written in parts, left before a message's one write."""
    line = "W0000 00:00:1 local_rendezvous.cc:405] " + P.encode(MESSAGES[2])
    assert P.decode(line) == MESSAGES[2]


def test_an_epoch_line_is_the_history_record_with_its_kind_and_epochs():
    body = json.loads(P.encode(MESSAGES[2])[len(P.PREFIX):])
    assert body == {"kind": "epoch", "epochs": 10, **MESSAGES[2].record}


@pytest.mark.parametrize("line", ["member 1: epoch 1/2", P.PREFIX + "{not json",
                                  P.PREFIX + '{"kind": "unknown"}',
                                  P.PREFIX + '{"kind": "resume", "member": 1}',
                                  P.PREFIX + '["kind"]', ""])
def test_other_lines_are_not_messages(line):
    assert P.decode(line) is None


def test_the_report_file_round_trips(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    assert P.read_report(path) is None
    monkeypatch.setenv(P.REPORT_ENV, str(path))
    out = P.Report({"members": [1], "work_seconds": 2.5}).write(["tensorflow"])
    assert P.read_report(path) == out == {"members": [1], "work_seconds": 2.5,
                                          "loaded": ["tensorflow"]}


def test_messages_survive_other_writers_on_the_same_stderr():
    """A client's stderr also carries TensorFlow's C++ log lines (their own `write(2, ...)`)
    and other threads' output: each message must reach the launcher whole, so it is written
    in one call (`print` wrote the text and its newline in two, and a line landing between
    them made the message unreadable: a lost progress line in CI)."""
    import subprocess
    import sys

    child = """
import os, sys, threading
from ensemble.replication import protocol
stop = False
def noise():
    while not stop:
        os.write(2, b"W0000 local_rendezvous.cc:405] End of sequence\\n")
t = threading.Thread(target=noise); t.start()
for i in range(3000):
    protocol.send(protocol.Epoch(2, {"member": i, "epoch": 0, "loss": 0.5}))
stop = True; t.join()
"""
    res = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT),
                                           "PYTHONUNBUFFERED": "1"})  # as many containers set
    assert res.returncode == 0, res.stderr[-2000:]
    got = [m.record["member"] for m in map(P.decode, res.stderr.splitlines())
           if m is not None]
    assert got == list(range(3000))


def test_the_launcher_keeps_another_writers_text_before_a_message():
    from ensemble.runs.between import _Listener

    listener = _Listener(None, verbosity=0)
    assert listener("W0000 local_rendezvous.cc:405] " + P.encode(P.MemberDone(5, 1.5))) \
        == "W0000 local_rendezvous.cc:405] "  # kept as the client's output
    assert listener(P.encode(P.MemberDone(6, 2.5))) is True  # a whole message: consumed
    assert listener("member 1: a line of the client's own") is False
    assert listener.done == {5: 1.5, 6: 2.5}
