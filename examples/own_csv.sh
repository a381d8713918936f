#!/usr/bin/env bash
# Your own CSV, classification, from the command line: train, look at the table, predict new rows.
# Sizes: MEMBERS (4), EPOCHS (30), WORKDIR (a new temporary folder). CI runs it with small ones.
set -euo pipefail
MEMBERS=${MEMBERS:-4} EPOCHS=${EPOCHS:-30}
WORKDIR=${WORKDIR:-$(mktemp -d)}
cd "$WORKDIR"

# A CSV as you might have one: scikit-learn's wine data with a label column of strings,
# an id column (not a feature: --drop it) and 20 rows held back as "new" rows without labels.
python - <<'PY'
import pandas as pd
from sklearn.datasets import load_wine
d = load_wine(as_frame=True)
df = d.frame.rename(columns={"target": "cultivar"})
df["cultivar"] = df["cultivar"].map({0: "barolo", 1: "grignolino", 2: "barbera"})
df.insert(0, "bottle_id", range(1000, 1000 + len(df)))
df = df.sample(frac=1, random_state=0)
df.iloc[20:].to_csv("wine.csv", index=False)
df.iloc[:20].drop(columns="cultivar").to_csv("new_wine.csv", index=False)
PY

# Train: the target column, the id left out, a small ensemble. Prints the evaluation table.
ensemble train --data wine.csv --target cultivar --drop bottle_id \
    --members "$MEMBERS" --epochs "$EPOCHS" --run-dir runs/wine --quiet

# Predict the new rows: one row per input, bottle_id carried through, p_<class> columns.
ensemble predict --run runs/wine --data new_wine.csv --out predictions.csv --quiet
head -3 predictions.csv
