"""Train the pattern classifier from generated traces and write predictors/model.json.

    python -m predictors.train [--seeds 12] [--out predictors/model.json]

Deterministic: the traces, the sample selection and the forest are all seeded, and the
JSON is written with sorted keys and fixed rounding, so a rebuild gives the same bytes
(on the same numpy/scikit-learn versions).
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from .classifier import MODEL_PATH, MODEL_VERSION
from .features import FEATURES, WINDOW, PatternFeatures
from .tracegen import CLASSES, FAMILIES, generate, random_spec

# Traces per family: 24 x 6 families gives ~13k windows over varied sizes, worker counts,
# batch sizes and world sizes; training takes ~5 s on one core.
DEFAULT_SEEDS = 24
# One feature vector every 8 opens: consecutive windows overlap by 56/64 anyway.
SAMPLE_EVERY = 8
# Skip the first window of a trace: the features are not defined until WINDOW opens.
WARMUP_OPENS = WINDOW
# Forest shape: 10 trees of depth <= 8 -> model.json of ~100 KB, inference ~20 us.
N_TREES = 10
MAX_DEPTH = 8
MIN_SAMPLES_LEAF = 4
TRAIN_SEED = 0
# Leaf probabilities are rounded so the JSON is compact and stable.
PROB_DIGITS = 6


def trace_samples(trace) -> tuple[list[list[float]], list[str]]:
    pf = PatternFeatures(trace.catalog)
    xs, ys, opens = [], [], 0
    for ev, label in zip(trace.events, trace.labels):
        pf.observe(ev)
        if ev.op == "open":
            opens += 1
            if opens >= WARMUP_OPENS and opens % SAMPLE_EVERY == 0:
                xs.append(pf.vector())
                ys.append(label)
    return xs, ys


def dataset(seeds: int, seed_base: int = 0) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for fi, fam in enumerate(FAMILIES):
        rng = np.random.default_rng([seed_base, fi])
        for _ in range(seeds):
            x, y = trace_samples(generate(random_spec(fam, rng)))
            xs += x
            ys += y
    return np.array(xs, dtype=float), np.array(ys)


def fit(x: np.ndarray, y: np.ndarray):
    from sklearn.ensemble import RandomForestClassifier
    clf = RandomForestClassifier(n_estimators=N_TREES, max_depth=MAX_DEPTH,
                                 min_samples_leaf=MIN_SAMPLES_LEAF, random_state=TRAIN_SEED,
                                 n_jobs=1)
    clf.fit(x, y)
    return clf


def export(clf) -> dict:
    classes = [str(c) for c in clf.classes_]
    order = [classes.index(c) for c in CLASSES if c in classes]
    trees = []
    for est in clf.estimators_:
        t = est.tree_
        value = t.value[:, 0, :]
        value = value / np.maximum(value.sum(axis=1, keepdims=True), 1e-12)
        trees.append({
            "left": t.children_left.tolist(), "right": t.children_right.tolist(),
            "feature": [int(f) if f >= 0 else 0 for f in t.feature],
            "threshold": [round(float(v), 9) for v in t.threshold],
            "value": [[round(float(v[i]), PROB_DIGITS) for i in order] for v in value],
        })
    return {"version": MODEL_VERSION, "features": list(FEATURES),
            "classes": [classes[i] for i in order], "trees": trees}


def train(seeds: int = DEFAULT_SEEDS, seed_base: int = 0) -> dict:
    x, y = dataset(seeds, seed_base)
    return export(fit(x, y))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m predictors.train", description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help="traces per family")
    ap.add_argument("--out", default=str(MODEL_PATH))
    a = ap.parse_args(argv)
    doc = train(a.seeds)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, sort_keys=True, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {a.out}: {len(doc['trees'])} trees, classes {doc['classes']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
