"""The client process of between-graph replication: `python -m ensemble.replication.client
--request JSON` (a `protocol.ClientRequest`; `ensemble client --run RUN --member I` is the same
client started by hand).

A launcher (`ensemble.runs.between`) starts one client per queue of members; the client trains
(or predicts) them one after another (`client_work`), sends its progress as
`protocol` messages on stderr and, at exit, its `protocol.Report` (when it was ready, its work
seconds, peak memory, each member's steady-state training rate). Both halves of the protocol
live in this package; the client imports nothing from `ensemble.runs` or `pipelines` (an
import-linter contract in pyproject.toml).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # the process: before NumPy and TensorFlow load
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from ensemble.core import resources

    resources.bound_threads()  # OpenBLAS starts its threads when NumPy loads

import time  # noqa: E402
from pathlib import Path  # noqa: E402

from ensemble.core.errors import UsageError  # noqa: E402
from ensemble.replication import processes, protocol  # noqa: E402
from ensemble.replication.protocol import ClientRequest  # noqa: E402

PREDICT_ONLY = {"out": "out", "devices": "device", "cluster": "cluster",  # field -> the flag
                "batch_size": "batch-size", "target": "target"}  # of `ensemble client`


def check(request: ClientRequest) -> ClientRequest:
    """`request`, checked before TensorFlow loads.

    Raises:
        UsageError: a prediction option without `predict`, `predict` without `out`, or
            `devices` not one per member (names the flag of `ensemble client`).
    """
    if request.predict is None:
        for field, flag in PREDICT_ONLY.items():
            if getattr(request, field):
                raise UsageError(f"client: --{flag} applies with --predict only")
        return request
    if not request.out:
        raise UsageError("client: --predict needs --out FILE.parquet (or a folder)")
    if request.devices is not None and len(request.devices) != len(request.members):
        raise UsageError(f"client: --device names {len(request.devices)} devices for "
                         f"{len(request.members)} members; expected one per member")
    return request


def serve(request: ClientRequest) -> dict:
    """Do what `request` asks (train its members, or predict with them) in this process.

    Returns:
        The client's report payload: `members`, `ready_unix` (TensorFlow loaded),
        `work_seconds`, `peak_rss_bytes`, `tensorflow_build`, `steady` (training: member
        -> [rows, seconds] of its steady-state training calls) and `spans` (member -> when
        those calls ran, `steady.SteadyState.spans`).

    Raises:
        UsageError: a bad request, run or input; interrupt.Interrupted: SIGINT/SIGTERM (its
            `resume` is the command that continues).
    """
    from ensemble.core.tfimport import import_tensorflow_quietly
    from ensemble.replication.devices import build_info, peak_rss_bytes

    check(request)
    import_tensorflow_quietly()
    ready, start = time.time(), time.perf_counter()
    steady = _predict(request) if request.predict else _train(request)
    return {"members": request.members, "ready_unix": ready,
            "steady": {str(i): [st.rows, st.seconds] for i, st in steady.items()},
            "spans": {str(i): st.spans for i, st in steady.items() if st.spans},
            "work_seconds": time.perf_counter() - start, "peak_rss_bytes": peak_rss_bytes(),
            "tensorflow_build": build_info()}


def _predict(request: ClientRequest) -> dict:
    from ensemble.replication.client_work import predict_client
    from ensemble.replication.cluster import load_spec

    predict_client(request, load_spec(request.cluster))
    return {}


def _train(request: ClientRequest) -> dict:
    """Train the request's members; returns member -> its `steady.SteadyState`."""
    from ensemble.core import interrupt
    from ensemble.core.manifest import Manifest
    from ensemble.replication import progress
    from ensemble.replication.client_work import run_client
    from ensemble.replication.steady import SteadyState

    manifest = Manifest.load(Path(request.run))
    steady: dict = {}

    def callbacks(index: int) -> list:
        steady[index] = SteadyState(manifest.config["training"]["batch_size"],
                                    manifest.dataset.rows["train"])
        shown = {"report": [progress.ReportProgress([index])],
                 "log": [progress.LogProgress(sys.stdout, prefix=f"member {index}: ")]}
        return [*shown.get(request.progress, []), steady[index]]

    def done(index: int, seconds: float) -> None:
        if request.progress == "report":  # the launcher records the member as completed
            protocol.send(protocol.MemberDone(index, seconds))
        elif request.progress == "log":
            print(f"member {index}: trained in {seconds:.2f} s", flush=True)

    try:
        run_client(Path(request.run), request.members, threads=request.threads,
                   callbacks=callbacks, on_member_done=done)
    except interrupt.Interrupted as exc:
        if request.progress == "report" and getattr(exc, "member", None) is not None:
            protocol.send(protocol.Interrupted(exc.member, exc.epoch, exc.epochs))
        exc.resume = (f"ensemble client --run {request.run} --member "
                      f"{','.join(map(str, request.members))}")
        raise
    return steady


def main(argv: list[str] | None = None) -> int:
    """The client process: `--request JSON` (`ClientRequest.argv`); returns the exit status
    (`processes.entry`)."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m {protocol.CLIENT_MODULE}",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--request", required=True,
                        help="the client request as JSON (protocol.ClientRequest)")
    args = parser.parse_args(argv)

    def body() -> dict:
        from ensemble.core import resources

        resources.check("client", True)
        try:
            request = ClientRequest.from_json(args.request)
        except ValueError as exc:
            raise UsageError(f"client: {exc}") from None
        return serve(request)

    return processes.entry(body)


if __name__ == "__main__":
    from ensemble.core.tfimport import own_process

    own_process()  # the client's process: TensorFlow's objects frozen once imported
    status = main()
    from ensemble.core.memory import skip_final_collection

    skip_final_collection()
    sys.exit(status)
