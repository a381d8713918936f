"""Request metrics of `ensemble serve` in Prometheus' text format, named as TF Serving's.

`GET /monitoring/prometheus/metrics` answers with (names and labels as TF Serving's monitoring,
so its dashboards work):

- `:tensorflow:serving:request_count{entrypoint="REST",model_name,status}`: requests by outcome,
  the gRPC code of each HTTP status the server answers (`STATUS`): 200 `OK`, 400
  `INVALID_ARGUMENT`, 404 `NOT_FOUND`, 413 `RESOURCE_EXHAUSTED` (a body beyond
  `--max-request-bytes`, as gRPC's message size limit), 499 `CANCELLED` (the client
  disconnected before its body was read; nothing is sent), 500 `INTERNAL`, 503 `UNAVAILABLE`
  (any other status would be `UNKNOWN`);
- `:tensorflow:serving:request_latency{API,entrypoint="REST",model_name}`: a histogram of the
  whole request time in microseconds (buckets 10 * 1.8^k us, k = 0..32, as TF Serving's);
- `:tensorflow:serving:batching_session:processed_batch_size`: a histogram of the rows per model
  call (batches formed by dynamic batching).

Hand-written (a few lines of text) rather than a prometheus_client dependency.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

LATENCY_BUCKETS_US = [10 * 1.8 ** k for k in range(33)]
BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
STATUS = {200: "OK", 400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 413: "RESOURCE_EXHAUSTED",
          499: "CANCELLED", 500: "INTERNAL", 503: "UNAVAILABLE"}
PREFIX = ":tensorflow:serving:"


class _Histogram:
    def __init__(self, bounds: list[float]):
        self.bounds, self.counts, self.sum, self.n = bounds, [0] * len(bounds), 0.0, 0

    def add(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.bounds):
            self.counts[i] += 1
        self.sum += value
        self.n += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out, total = [], 0
        sep = "," if labels else ""
        for bound, c in zip(self.bounds, self.counts):
            total += c
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound:g}"}} {total}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.n}')
        tail = f"{{{labels}}}" if labels else ""
        out.append(f"{name}_sum{tail} {self.sum:g}")
        out.append(f"{name}_count{tail} {self.n}")
        return out


class Metrics:
    """Thread-safe counters and histograms of one server."""

    def __init__(self):
        self._lock = threading.Lock()
        self._count: dict[tuple, int] = defaultdict(int)
        self._latency: dict[tuple, _Histogram] = {}
        self._batches = _Histogram(BATCH_BUCKETS)

    def request(self, model: str, api: str, http_status: int, seconds: float) -> None:
        """Count one request of `api` (`predict`, `GetModelStatus`, `GetModelMetadata`)
        with its HTTP status and its duration in seconds."""
        status = STATUS.get(http_status, "UNKNOWN")
        with self._lock:
            self._count[(model, status)] += 1
            h = self._latency.setdefault((model, api), _Histogram(LATENCY_BUCKETS_US))
            h.add(seconds * 1e6)

    def batch(self, rows: int) -> None:
        """Count one model call of `rows` rows."""
        with self._lock:
            self._batches.add(rows)

    def render(self) -> str:
        """Every metric in Prometheus' text exposition format (version 0.0.4)."""
        with self._lock:
            lines = [f"# TYPE {PREFIX}request_count counter"]
            for (model, status), n in sorted(self._count.items()):
                lines.append(f'{PREFIX}request_count{{entrypoint="REST",model_name="{model}",'
                             f'status="{status}"}} {n}')
            lines.append(f"# TYPE {PREFIX}request_latency histogram")
            for (model, api), h in sorted(self._latency.items()):
                lines += h.lines(f"{PREFIX}request_latency",
                                 f'API="{api}",entrypoint="REST",model_name="{model}"')
            name = f"{PREFIX}batching_session:processed_batch_size"
            lines.append(f"# TYPE {name} histogram")
            lines += self._batches.lines(name, "")
        return "\n".join(lines) + "\n"
