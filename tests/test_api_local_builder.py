"""`ensemble.train(..., model=fn)` with a builder function of the notebook or script itself (a
process-local `<local>:` builder): the run it writes is used in that process (`predict`)."""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_iris

import ensemble


def test_a_run_of_a_local_builder_predicts_in_its_process(tmp_path):
    import keras

    def tiny(input_shape, n_outputs, *, seed, width=4):
        inputs = keras.Input(input_shape)
        hidden = keras.layers.Dense(width, activation="relu")(inputs)
        return keras.Model(inputs, keras.layers.Dense(n_outputs)(hidden))

    frame = load_iris(as_frame=True).frame
    frame.to_csv(tmp_path / "iris.csv", index=False)
    run = ensemble.train({"data": {"source": str(tmp_path / "iris.csv"), "target": "target"},
                          "members": {"count": 2}, "training": {"epochs": 1},
                          "placement": {"devices": "cpu:2"}}, model=tiny,
                         run_dir=tmp_path / "run")
    assert run.config.model.builder.startswith("<local>:")
    out = run.predict(frame.drop(columns="target").head(4))
    proba = out[[f"p_{c}" for c in run.classes]].to_numpy()
    assert out.shape[0] == 4 and np.allclose(proba.sum(axis=1), 1, atol=1e-5)
