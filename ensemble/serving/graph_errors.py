"""What `ensemble serve` answers when the model's graph refuses a request (HTTP 400).

An export refuses bad input values inside its graph (`ensemble.data.export_graph`): the signature
fails with TensorFlow's `InvalidArgumentError`, whose message wraps the refusal
("assertion failed: [input `bp`: a missing value ...]") in graph details (node names, the
traced function's name). The client gets the refusal alone; any other graph error gets its
message on one line, cut to `LIMIT` characters. No TensorFlow import here.
"""

from __future__ import annotations

import re

LIMIT = 500
_ASSERTION = re.compile(r"assertion failed: \[(.*?)\](?:\s*\[\[|\s*$)", re.S)


def client_message(message: str) -> str:
    """The text for the client of a graph error `message` (`InvalidArgumentError.message`):
    the failed assertions' own messages (`; `-joined), else the message on one line, at most
    `LIMIT` characters."""
    found = [" ".join(m.split()) for m in _ASSERTION.findall(message or "")]
    text = "; ".join(dict.fromkeys(found)) if found else " ".join(str(message).split())
    return text[:LIMIT]
