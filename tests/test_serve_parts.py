"""The blocks of `ensemble serve` without HTTP: the REST codec over signatures that are not
the classification export (images, named string and float inputs, regression outputs), the
dynamic batcher, version folders (complete or not, a broken newer one), and the CLI's refusals.
"""

from __future__ import annotations

import base64
import re
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, run_cli
from ensemble.serving.batching import Batcher, Closed
from ensemble.serving.codec import (BadRequest, SignatureInfo, TensorInfo, decode_inputs,
                                    encode_outputs)
from ensemble.serving.limits import parse

F32, STR = np.dtype(np.float32), np.dtype(object)
IMAGE = SignatureInfo({"image": TensorInfo(F32, (None, 4, 4, 1))},
                      {"mean": TensorInfo(F32, (None,)), "std": TensorInfo(F32, (None,))})
NAMED = SignatureInfo({"city": TensorInfo(STR, (None,)), "area": TensorInfo(F32, (None,))},
                      {"mean": TensorInfo(F32, (None,))})


def test_codec_images_and_named_inputs_both_formats():
    img = np.arange(2 * 16, dtype=np.float32).reshape(2, 4, 4, 1)
    x, rows = decode_inputs({"instances": img.tolist()}, IMAGE)
    assert rows and x["image"].shape == (2, 4, 4, 1) and np.array_equal(x["image"], img)
    x, rows = decode_inputs({"inputs": {"image": img.tolist()}}, IMAGE)
    assert not rows and np.array_equal(x["image"], img)
    req = {"instances": [{"city": "Zürich", "area": 3.5},
                         {"city": {"b64": base64.b64encode(b"\xff").decode()}, "area": 1}]}
    x, _ = decode_inputs(req, NAMED)
    assert x["city"].tolist() == ["Zürich".encode(), b"\xff"] and x["area"].dtype == F32
    x, _ = decode_inputs({"inputs": {"city": ["a"], "area": [2.0]}}, NAMED)
    assert x["city"].tolist() == [b"a"]
    # a null float value is a missing value: NaN, which an imputing export fills
    x, _ = decode_inputs({"instances": [{"city": "a", "area": None}, {"city": "b",
                                                                      "area": 2}]}, NAMED)
    assert np.isnan(x["area"][0]) and x["area"][1] == 2.0 and x["area"].dtype == F32


@pytest.mark.parametrize("req, sig, words", [
    ({"instances": [[[[0]] * 4] * 4, [[[0]] * 4] * 3]}, IMAGE, "ragged"),
    ({"instances": [[[0] * 4] * 4]}, IMAGE, "shape [-1, 4, 4, 1]"),  # no channel dimension
    ({"instances": [{"city": "a"}]}, NAMED, "missing: area"),
    ({"instances": [{"city": "a", "area": 1, "x": 2}]}, NAMED, "unknown: x"),
    ({"instances": [{"city": 3, "area": 1}]}, NAMED, "expected a string"),
    ({"instances": [{"city": "a", "area": "big"}]}, NAMED, "received strings"),
    ({"instances": [{"city": "a", "area": True}]}, NAMED, "received booleans"),
    ({"inputs": {"city": ["a", "b"], "area": [1.0]}}, NAMED, "different batch sizes"),
    ({"inputs": [1.0]}, NAMED, "several inputs"),
    ({}, NAMED, "neither"),
    ({"instances": []}, NAMED, "non-empty"),
])
def test_codec_refuses(req, sig, words):
    with pytest.raises(BadRequest, match=words.replace("[", r"\[").replace("]", r"\]")):
        decode_inputs(req, sig)


def test_codec_outputs_and_json():
    out = {"mean": np.array([1.5, 2.0], np.float32), "std": np.array([0.5, 0.25], np.float32)}
    assert encode_outputs(out, True) == {"predictions": [{"mean": 1.5, "std": 0.5},
                                                         {"mean": 2.0, "std": 0.25}]}
    assert encode_outputs(out, False) == {"outputs": {"mean": [1.5, 2.0], "std": [0.5, 0.25]}}
    assert encode_outputs({"y": np.array([3, 4])}, True) == {"predictions": [3, 4]}
    labels = {"labels": np.array([b"d1", b"\xff"], dtype=object)}
    assert encode_outputs(labels, False) == {"outputs": ["d1", {"b64": "/w=="}]}
    with pytest.raises(BadRequest, match="columnar"):
        encode_outputs({"a": np.zeros(2), "b": np.zeros(3)}, True)
    assert np.isnan(parse(b'{"instances": [[NaN]]}')["instances"][0][0])  # the server's parser
    for bad in (b"[1]", b"{", b"\xff"):
        with pytest.raises(BadRequest):
            parse(bad)


class Blocked:
    """A replica that doubles its input, blocked on its first call until released; records
    the rows of every call; fails on a negative value."""

    def __init__(self):
        self.release, self.started, self.calls = threading.Event(), threading.Event(), []

    def __call__(self, signature, inputs):
        self.started.set()
        self.release.wait(10)
        x = inputs["x"]
        if (x < 0).any():
            raise ValueError("negative")
        self.calls.append(len(x))
        return {"y": x * 2}


@pytest.mark.parametrize("max_batch, calls", [(64, [1, 5]), (3, [1, 3, 2]), (1, [1] * 6)])
def test_batcher_merges_queued_requests_and_splits_answers(max_batch, calls):
    run = Blocked()
    b = Batcher([run], max_batch_size=max_batch)
    first = b.submit("s", {"x": np.array([[0.0]])})
    assert run.started.wait(10)  # the only replica is busy: the next requests queue
    futs = [b.submit("s", {"x": np.array([[float(i)]])}) for i in range(1, 6)]
    run.release.set()
    assert [f.result(10)["y"].tolist() for f in futs] == [[[2.0 * i]] for i in range(1, 6)]
    assert first.result(10)["y"].tolist() == [[0.0]]
    b.close()
    assert run.calls == calls


def test_batcher_timeout_merges_and_a_bad_request_fails_alone():
    run = Blocked()
    run.release.set()
    b = Batcher([run], max_batch_size=64, batch_timeout=0.5)
    futs = [b.submit("s", {"x": np.array([[v]])}) for v in (1.0, -1.0, 2.0)]
    assert futs[0].result(10)["y"].tolist() == [[2.0]] and futs[2].result(10)["y"].tolist() \
        == [[4.0]]
    with pytest.raises(ValueError, match="negative"):
        futs[1].result(10)
    assert run.calls == [1, 1]  # the merged call failed; then each request alone
    other = b.submit("t", {"x": np.array([[1.0, 2.0]])})  # another shape: its own batch
    assert other.result(10)["y"].shape == (1, 2)
    b.close()
    with pytest.raises(Closed):
        b.submit("s", {"x": np.array([[1.0]])})


def _save_regression(path: Path, scale: float):
    """A SavedModel with an image input and a named string input; outputs mean, std."""
    import tensorflow as tf

    mod = tf.Module()
    mod.w = tf.Variable(scale)

    @tf.function(input_signature=[tf.TensorSpec([None, 4, 4, 1], tf.float32, name="image"),
                                  tf.TensorSpec([None], tf.string, name="city")])
    def serve(image, city):
        s = tf.reduce_sum(image, axis=[1, 2, 3]) * mod.w
        return {"mean": s + tf.cast(tf.strings.length(city), tf.float32),
                "std": tf.ones_like(s)}

    tf.saved_model.save(mod, str(path), signatures={"serving_default": serve})


def test_model_manager_serves_a_generic_signature_and_keeps_it_over_a_broken_one(tmp_path):
    from ensemble.serving.servables import ModelManager, NotFound, Watch, fingerprint

    _save_regression(tmp_path / "1", 2.0)
    assert fingerprint(tmp_path / "1") is not None
    (tmp_path / "2" / "variables").mkdir(parents=True)  # half-written: no saved_model.pb
    assert fingerprint(tmp_path / "2") is None
    lines = []
    mgr = ModelManager(tmp_path, "m", ["/device:CPU:0", "/device:CPU:1"],
                       watch=Watch(poll=0.1, settle=0.0), log=lines.append)
    mgr.start()
    try:
        served = mgr.get()
        sig = served.signatures["serving_default"]
        assert set(sig.inputs) == {"image", "city"} and set(sig.outputs) == {"mean", "std"}
        x, rows = decode_inputs({"instances": [{"image": np.ones((4, 4, 1)).tolist(),
                                                "city": "abc"}] * 3}, sig)
        out = encode_outputs(mgr.submit(None, "serving_default", x).result(10), rows)
        assert out == {"predictions": [{"mean": 35.0, "std": 1.0}] * 3}
        (tmp_path / "3").mkdir()
        (tmp_path / "3" / "saved_model.pb").write_bytes(b"broken")
        mgr.scan()
        assert mgr.status(3)[0]["state"] == "END" and "failed to load" in lines[-1]
        assert mgr.get().version == 1 and mgr.status(1)[0]["state"] == "AVAILABLE"
        with pytest.raises(NotFound):
            mgr.get(3)
        with pytest.raises(NotFound):
            mgr.submit(None, "nope", x)
    finally:
        mgr.stop()


def test_cli_refusals(tmp_path, capsys, monkeypatch):
    assert run_cli("serve", "--model", tmp_path / "missing") == 2
    assert "Expected --model" in capsys.readouterr().err
    assert run_cli("serve", "--model", tmp_path, "--replicas", "0") == 2
    assert "'0'" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # the `serve` extra not installed
    assert run_cli("serve", "--model", tmp_path) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    # the README installs from a checkout, and the distribution is on no package index yet:
    # the checkout's command comes first, the index's one as the alternative
    assert 'pip install ".[serve]" in a checkout' in err and '"ensemble-replication[serve]"' in err


def test_every_status_the_server_answers_has_its_metrics_label():
    """Each HTTP status `ensemble serve` answers (`_error(...)` calls, 200, the 499 of a client
    gone) is a named status in the metrics, none falls back to `UNKNOWN`."""
    from ensemble.serving.prometheus import STATUS, Metrics
    from pipelines import serve

    source = (ROOT / "pipelines" / "serve.py").read_text()
    answered = {int(c) for c in re.findall(r"_error\((\d{3})", source)}
    answered |= {200, serve.CLIENT_CLOSED}
    assert answered >= {400, 404, 413, 500, 503} and answered <= set(STATUS)
    metrics = Metrics()
    for code in (413, 499):
        metrics.request("m", "predict", code, 0.001)
    text = metrics.render()
    assert 'status="RESOURCE_EXHAUSTED"} 1' in text and 'status="CANCELLED"} 1' in text
    assert "INTERNAL" not in text


def test_a_number_for_a_text_input_names_the_input():
    """A served categorical column is text: a JSON number for it is refused naming the input
    (a request has many), not just the value."""
    req = {"inputs": {"city": [1935, 1936], "area": [1.0, 2.0]}}
    with pytest.raises(BadRequest, match=r"^input `city`: expected a string \(or "
                                         r"\{\"b64\": ...\}\); received 1935$"):
        decode_inputs(req, NAMED)
