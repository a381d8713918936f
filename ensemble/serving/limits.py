"""Limits of the server against hostile or careless requests: body size, rows, JSON nesting,
non-finite numbers, large requests run off the event loop and split into batches.

- Body size: `read_body` answers 413 from the `Content-Length` header before reading, and
  stops reading a chunked body as soon as it passes the limit (`--max-request-bytes`).
- Rows: `check_rows` answers 400 for a request of more rows than `--max-request-rows`, after
  the JSON is parsed and before any array is built.
- Framing (RFC 9112 section 6): `framing_error` finds a request with both `Content-Length`
  and `Transfer-Encoding`, a coding other than `chunked`, or differing lengths; the server
  answers 400 and closes the connection (`refuse_and_close`), so nothing smuggled behind the
  request is read. A malformed chunk is refused by the HTTP parser (h11) the same way.
- Nesting: `parse` answers 400 for JSON nested deeper than `JSON_DEPTH_MAX` (Python's parser
  would raise `RecursionError` a little deeper; that is caught too).
- Non-finite numbers: `Infinity` and `-Infinity` tokens, and a number beyond the input's dtype
  (it overflows to one), are refused by `codec._array`, naming the input; `null` and `NaN` are
  a missing value, as in a table `predict` reads: the export of a run that imputes fills it,
  any other export refuses it naming the column (`ensemble.data.export_graph`).
- Fairness: bodies above `OFF_LOOP_BYTES` are parsed and decoded in a worker thread, and a
  request of more rows than the batch size is cut into batches submitted one after another
  (`run_split`), so requests that arrive meanwhile join the queue between its batches instead
  of waiting for all of it (TF Serving's batching splits large tasks the same way,
  `enable_large_batch_splitting`).

No TensorFlow here.
"""

from __future__ import annotations

import asyncio
import json
import math

import numpy as np

from ensemble.serving.codec import BadRequest

JSON_DEPTH_MAX = 32  # nesting of a request body (TF Serving's inputs are a few levels deep)
OFF_LOOP_BYTES = 64 * 1024  # parse bodies above this size in a worker thread


class TooLarge(BadRequest):
    """A request body beyond the size limit (HTTP 413)."""


async def read_body(request, max_bytes: int) -> bytes:
    """The request body, at most `max_bytes`.

    Raises:
        TooLarge: the declared (`Content-Length`) or received size exceeds `max_bytes`.
        BadRequest: a malformed `Content-Length`.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise BadRequest(f"malformed Content-Length: {declared[:40]!r}")
        if int(declared) > max_bytes:
            raise TooLarge(f"request body of {int(declared)} bytes exceeds the server's "
                           f"--max-request-bytes {max_bytes}")
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise TooLarge(f"request body exceeds the server's --max-request-bytes {max_bytes}")
        parts.append(chunk)
    return b"".join(parts)


def _infinity(token: str) -> float:
    """`Infinity`, `-Infinity` as infinities (the codec refuses them, naming the input);
    `NaN` as NaN, a missing value (the export fills or refuses it)."""
    if token == "NaN":
        return math.nan
    return -math.inf if token.startswith("-") else math.inf


def depth(value, limit: int = JSON_DEPTH_MAX) -> int:
    """The nesting depth of a parsed JSON value (a scalar: 0), walked without recursion.

    Raises:
        BadRequest: deeper than `limit`.
    """
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if items is None:
            continue
        if d > limit:
            raise BadRequest(f"request JSON is nested deeper than {limit} levels")
        deepest = max(deepest, d)
        stack.extend((u, d + 1) for u in items if isinstance(u, (list, dict)))
    return deepest


def parse(body: bytes) -> dict:
    """The request body as a JSON object, its nesting checked (`depth`).

    Raises:
        BadRequest: malformed JSON, not an object, or nested too deep.
    """
    try:
        req = json.loads(body, parse_constant=_infinity)
    except RecursionError:
        raise BadRequest(f"request JSON is nested deeper than {JSON_DEPTH_MAX} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"malformed JSON request body: {exc}") from None
    depth(req)
    if not isinstance(req, dict):
        raise BadRequest(f"expected a JSON object with `instances` or `inputs`; received "
                         f"a JSON {type(req).__name__}")
    return req


def check_rows(req: dict, max_rows: int) -> None:
    """Refuse a request of more than `max_rows` rows (`instances`, or the longest columnar
    input), before any array is built.

    Raises:
        BadRequest: too many rows (names the count and `--max-request-rows`).
    """
    if isinstance(req.get("instances"), list):
        rows = len(req["instances"])
    else:
        value = req.get("inputs")
        values = value.values() if isinstance(value, dict) else [value]
        rows = max((len(v) for v in values if isinstance(v, list)), default=0)
    if rows > max_rows:
        raise BadRequest(f"request of {rows} rows exceeds the server's --max-request-rows "
                         f"{max_rows}; send it in parts")


async def off_loop(size: int, fn, *args):
    """`fn(*args)`, in a worker thread when the request is large (`size` > `OFF_LOOP_BYTES`
    bytes), so that the event loop keeps answering other clients."""
    if size > OFF_LOOP_BYTES:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


async def run_split(submit, inputs: dict, batch_rows: int, batchable: bool) -> dict:
    """Run a request through `submit(inputs) -> concurrent.futures.Future` of its outputs; a
    batchable request of more than `batch_rows` rows goes as consecutive parts of at most
    `batch_rows` rows, each submitted when the one before is done (other requests queue
    between them), and the outputs are concatenated in row order.

    Args:
        inputs: `{name: array}`, batch first.
    """
    rows = next(iter(inputs.values())).shape[0] if inputs else 0
    if not batchable or rows <= batch_rows or batch_rows < 1:
        return await asyncio.wrap_future(submit(inputs))
    parts = []
    for lo in range(0, rows, batch_rows):
        part = {n: a[lo:lo + batch_rows] for n, a in inputs.items()}
        parts.append(await asyncio.wrap_future(submit(part)))
    return {n: np.concatenate([p[n] for p in parts]) for n in parts[0]}


def framing_error(headers: list[tuple[bytes, bytes]]) -> str | None:
    """What is wrong with a request's message framing (RFC 9112 section 6), or None:
    `Transfer-Encoding` together with `Content-Length` (section 6.3: "ought to be handled as
    an error"; a request smuggled behind it must not be read), a transfer coding other than
    `chunked` alone, or several `Content-Length` values that differ."""
    names = [(k.lower(), v) for k, v in headers]
    lengths = {v.strip() for k, v in names if k == b"content-length"}
    codings = [v for k, v in names if k == b"transfer-encoding"]
    if codings and lengths:
        return "both Transfer-Encoding and Content-Length in one request (RFC 9112 6.3)"
    if codings and b",".join(codings).strip().lower() != b"chunked":
        return f"unsupported Transfer-Encoding {b','.join(codings)[:40]!r}; expected chunked"
    if len(lengths) > 1:
        return "several different Content-Length values in one request"
    return None


async def refuse_and_close(send, message: str) -> None:
    """Answer 400 with TF Serving's error body and `Connection: close` (uvicorn then closes
    the connection, dropping anything pipelined behind the request)."""
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
