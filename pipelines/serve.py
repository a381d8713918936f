"""`ensemble serve`: an export folder online with TF Serving's REST API (Starlette + uvicorn).

Routes (`tensorflow_serving/g3doc/api_rest.md`; NAME is `--name`, `/versions/N` optional):

    GET  /v1/models/NAME[/versions/N]            model_version_status
    GET  /v1/models/NAME[/versions/N]/metadata   the signatures (SignatureDefMap as JSON)
    POST /v1/models/NAME[/versions/N]:predict    {"signature_name", "instances" | "inputs"}
    GET  /monitoring/prometheus/metrics          request counts, latency, batch sizes

Errors are `{"error": "..."}`: 400 for a bad request (non-finite numbers, JSON nested too
deep, more rows than `--max-request-rows`), 413 for a body beyond `--max-request-bytes`
(refused from its `Content-Length`, before reading), 404 for an unknown model, version or
signature, 503 while no version is loaded (the status route too: readiness), 500 otherwise.
A client that disconnects before its body is read is no error of the server: nothing is sent,
no traceback, and it is counted and access-logged as 499 (nginx's "client closed request";
`CANCELLED` in the metrics).
Large requests are parsed off the event loop and run in parts of the batch size
(`ensemble.serving.limits`). SIGTERM and Ctrl-C first drain: for at least `DRAIN_SECONDS`,
and on Linux until the listen backlog is empty and no open connection has unread bytes
(`TCP_INFO`, `FIONREAD`), the server keeps accepting and reading, so the requests already
sent are taken in; then it stops accepting connections, lets in-flight requests finish (at
most `GRACE_SECONDS` in all), and the process exits 0. Starlette and uvicorn are the optional extra
`serve`, imported only here.
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import sys
import time
from pathlib import Path

from ensemble.core.errors import UsageError
from ensemble.serving import codec, graph_errors, limits
from ensemble.serving.servables import NotFound, NotReady
from pipelines.serve_setup import (  # noqa: F401 (`serve.require_extra`)
    check_model_folder, check_replicas, has_version, require_extra, serving_devices)

GRACE_SECONDS = 10
CLIENT_CLOSED = 499  # nginx's "client closed request": counted and access-logged, never sent
DRAIN_SECONDS = 0.2  # SIGTERM: keep reading what was already sent, then stop accepting
ROUTE = re.compile(r"^(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?"
                   r"(?:(?P<metadata>/metadata)|:(?P<verb>[a-zA-Z]+))?$")


def log(message: str) -> None:
    """One line on stderr."""
    print(f"serve: {message}", file=sys.stderr, flush=True)


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port` (port 0: any free one). Made with protocol
    IPPROTO_TCP, not 0 as `socket.create_server` makes it: asyncio sets TCP_NODELAY only on
    sockets that say they are TCP, and without it every answer (headers, then body) waits
    ~40 ms for the client's delayed ACK (Nagle's algorithm)."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                      proto=socket.IPPROTO_TCP)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def _error(status: int, message: str):
    from starlette.responses import Response

    from ensemble.serving.codec import dumps

    return Response(dumps({"error": message}), status, media_type="application/json")


def build_app(manager, metrics, verbose: bool = False, max_bytes: int | None = None,
              max_rows: int | None = None, split_rows: int = 64):
    """The Starlette application over a started `ModelManager` and a `Metrics`.

    Args:
        max_bytes, max_rows: request limits (`--max-request-bytes`, `--max-request-rows`;
            None: `bounds` defaults).
        split_rows: a request of more rows runs in parts of this many
            (`limits.run_split`).
    """
    import tensorflow as tf
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect
    from starlette.routing import Route

    from ensemble.config import bounds

    api = _Routes(manager, metrics, max_bytes or bounds.REQUEST_BYTES_DEFAULT,
                  max_rows or bounds.REQUEST_ROWS_DEFAULT, split_rows)
    routes = [Route("/v1/models/{rest:path}", api.get_model, methods=["GET"]),
              Route("/v1/models/{rest:path}", api.post_model, methods=["POST"]),
              Route("/monitoring/prometheus/metrics", api.prometheus, methods=["GET"])]
    handlers = {cls: api.on_error for cls in (codec.BadRequest, NotFound, NotReady,
                                              tf.errors.InvalidArgumentError,
                                              ClientDisconnect, Exception)}
    app = Starlette(routes=routes, exception_handlers=handlers)
    return _Observed(app, manager.name, metrics, verbose)


class _Routes:
    """The REST API's handlers (the routes of the module docstring) over a `ModelManager`:
    `max_bytes` and `max_rows` are the request limits, `split_rows` the part size."""

    def __init__(self, manager, metrics, max_bytes: int, max_rows: int, split_rows: int):
        self.manager, self.metrics = manager, metrics
        self.max_bytes, self.max_rows, self.split_rows = max_bytes, max_rows, split_rows

    def _parse(self, body: bytes) -> dict:
        req = limits.parse(body)
        limits.check_rows(req, self.max_rows)
        return req

    def _target(self, request):
        m = ROUTE.match(request.path_params["rest"])
        if m is None or m["name"] != self.manager.name:
            name = m["name"] if m else request.path_params["rest"]
            raise NotFound(f"model {name!r} not found; this server serves "
                           f"{self.manager.name!r}")
        return m, (int(m["version"]) if m["version"] else None)

    async def get_model(self, request):
        from starlette.responses import Response

        request.state.api = "GetModelStatus"
        m, version = self._target(request)
        if m["verb"]:
            raise NotFound(f"GET {request.url.path}: use POST for :{m['verb']}")
        if m["metadata"]:
            request.state.api = "GetModelMetadata"
            servable = self.manager.get(version)
            return Response(codec.dumps({
                "model_spec": {"name": self.manager.name, "signature_name": "",
                               "version": str(servable.version)},
                "metadata": {"signature_def": {"signature_def": servable.defs}}}),
                media_type="application/json")
        status = self.manager.status(version)
        if version is None and not any(s["state"] == "AVAILABLE" for s in status):
            self.manager.get()  # NotReady: 503 until a version is loaded (readiness)
        return Response(codec.dumps({"model_version_status": status}),
                        media_type="application/json")

    async def post_model(self, request):
        from starlette.responses import Response

        request.state.api = "predict"
        m, version = self._target(request)
        if m["verb"] != "predict":
            raise NotFound(f"POST {request.url.path}: this server answers :predict only")
        body = await limits.read_body(request, self.max_bytes)  # 413 before reading, if declared
        req = await limits.off_loop(len(body), self._parse, body)
        name = codec.signature_name(req)
        sig = self.manager.get(version).signatures.get(name)
        if sig is None:  # checked again, atomically, on submit
            raise NotFound(f"signature {name!r} not found; signatures: "
                           + ", ".join(self.manager.get(version).signatures))
        inputs, row_format = await limits.off_loop(len(body), codec.decode_inputs, req, sig)
        outputs = await limits.run_split(lambda part: self.manager.submit(version, name, part),
                                         inputs, self.split_rows, sig.batchable)
        content = await limits.off_loop(len(body), lambda: codec.dumps(
            codec.encode_outputs(outputs, row_format)))
        return Response(content, media_type="application/json")

    async def prometheus(self, request):
        from starlette.responses import PlainTextResponse

        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def on_error(self, request, exc):
        import tensorflow as tf
        from starlette.requests import ClientDisconnect
        from starlette.responses import Response

        if isinstance(exc, ClientDisconnect):  # gone before its body was read: uvicorn
            return Response(status_code=CLIENT_CLOSED)  # drops the answer, metrics count it
        if isinstance(exc, limits.TooLarge):
            return _error(413, str(exc))
        if isinstance(exc, codec.BadRequest):
            return _error(400, str(exc))
        if isinstance(exc, NotFound):
            return _error(404, str(exc))
        if isinstance(exc, NotReady):
            return _error(503, str(exc))
        if isinstance(exc, tf.errors.InvalidArgumentError):
            return _error(400, graph_errors.client_message(exc.message))
        log(f"internal error on {request.method} {request.url.path}: {exc!r}")
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")


class _Observed:
    """ASGI middleware: request count and latency metrics, and the access log line."""

    def __init__(self, app, model: str, metrics, verbose: bool):
        self.app, self.model, self.metrics, self.verbose = app, model, metrics, verbose

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        bad = limits.framing_error(scope.get("headers") or [])
        if bad is not None:  # RFC 9112 section 6.3: an error, and the connection is closed
            return await limits.refuse_and_close(send, bad)
        start, status = time.perf_counter(), [500]
        scope.setdefault("state", {})

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - start
            api = scope["state"].get("api")
            if api:
                self.metrics.request(self.model, api, status[0], seconds)
            if self.verbose:
                client = scope.get("client") or ("-", 0)
                print(f'{client[0]} "{scope["method"]} {scope["path"]}" {status[0]} '
                      f'{seconds * 1e3:.1f} ms', file=sys.stderr, flush=True)


def run(args) -> int:
    """`ensemble serve` with parsed `args`; returns 0 after a clean stop."""
    require_extra()
    base = Path(args.model)
    check_model_folder(base, args.model)
    name = args.name or base.resolve().name
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise UsageError(f"Expected --name to be letters, digits, '.', '_' or '-'. "
                         f"Received: {name!r}")
    check_replicas(args.replicas)
    if args.devices:
        from ensemble.replication import devices

        devices.parse(args.devices)
    if args.port > 65535:
        raise UsageError(f"Expected --port to be in 0..65535. Received: {args.port}")
    if not args.batch_timeout_ms >= 0:
        raise UsageError(f"Expected --batch-timeout-ms to be >= 0. "
                         f"Received: {args.batch_timeout_ms:g}")
    try:
        sock = listen(args.host, args.port)
    except OSError as exc:
        raise UsageError(f"Cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
                         ) from None
    try:
        return _serve(args, base, name, sock)
    finally:
        sock.close()


def _serve(args, base: Path, name: str, sock: socket.socket) -> int:
    import uvicorn

    from ensemble.serving.prometheus import Metrics
    from ensemble.serving.servables import Batching, ModelManager

    devices = serving_devices(args.devices, args.replicas)
    metrics = Metrics()
    manager = ModelManager(base, name, devices, Batching(
        args.max_batch_size, args.batch_timeout_ms / 1000, metrics.batch), log=log)
    if not has_version(base):
        log(f"no version in {base} yet; waiting for one (status answers 503 until then)")
    manager.start()
    host, port = sock.getsockname()[:2]
    app = build_app(manager, metrics, args.verbose, args.max_request_bytes,
                    args.max_request_rows, max(args.max_batch_size, 64))
    config = uvicorn.Config(app, log_config=None,
                            log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=GRACE_SECONDS)
    server = _server_class()(config)
    batching = (f"batching up to {args.max_batch_size} rows, {args.batch_timeout_ms:g} ms"
                if args.max_batch_size > 1 else "no batching")
    log(f"serving {name} from {base} at http://{host}:{port}/v1/models/{name} "
        f"({len(devices)} replica(s) on {', '.join(sorted(set(devices)))}; {batching})")
    try:
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        manager.stop()
    log(f"stopped {name}")
    return 0


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server with our signal handling: the first SIGTERM/SIGINT drains (the
        requests already sent are read and answered: see the module docstring), then stops
        accepting; a second one forces the exit; neither is re-raised after (uvicorn would
        re-raise it, turning a clean stop into status 143)."""

        from contextlib import contextmanager

        draining: float | None = None  # monotonic time of the first signal

        async def on_tick(self, counter: int) -> bool:  # every 0.1 s
            if self.draining is not None and not self.should_exit:
                waited = time.monotonic() - self.draining
                if waited >= GRACE_SECONDS / 2 or (waited >= DRAIN_SECONDS
                                                   and not _unread(self)):
                    self.should_exit = True
            return await super().on_tick(counter)

        @contextmanager
        def capture_signals(self):
            def stop(signum, frame):
                if self.draining is not None:  # a second signal: no more waiting
                    self.force_exit = self.should_exit = True
                self.draining = self.draining or time.monotonic()

            old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in old.items():
                    signal.signal(s, h)

    return Server


def _unread(server) -> bool:
    """Whether requests were sent that `server` (our uvicorn Server) has not read yet:
    connections in the listen backlog (Linux `TCP_INFO` of the listening socket: `tcpi_unacked`
    is its accept queue) or unread bytes on an idle connection (`FIONREAD`)."""
    import fcntl
    import struct
    import termios

    try:
        for listener in server.servers:
            for sock in listener.sockets:
                info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
                if struct.unpack_from("I", info, 24)[0]:
                    return True
        for conn in list(server.server_state.connections):
            cycle = getattr(conn, "cycle", None)
            if cycle is not None and not cycle.response_complete:
                continue  # in flight: shutdown waits for it
            sock = conn.transport.get_extra_info("socket")
            if sock is not None and struct.unpack("i", fcntl.ioctl(
                    sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]:
                return True
    except (OSError, AttributeError, ValueError):  # not Linux: the fixed wait only
        return False
    return False
