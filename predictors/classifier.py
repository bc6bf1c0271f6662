"""Plain-Python inference for the shipped pattern classifier (predictors/model.json).

The model is a small random forest trained by ``python -m predictors.train`` and
exported as arrays (no pickle: nothing depends on the scikit-learn version at run time).
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from .features import FEATURES

MODEL_PATH = Path(__file__).with_name("model.json")
MODEL_VERSION = 1


class PatternClassifier:
    def __init__(self, doc: dict):
        if doc.get("version") != MODEL_VERSION:
            raise ValueError(f"model version {doc.get('version')!r}, expected {MODEL_VERSION}")
        if list(doc["features"]) != list(FEATURES):
            raise ValueError("model was trained on a different feature set; retrain it")
        self.classes: list[str] = list(doc["classes"])
        self.trees = [(t["left"], t["right"], t["feature"], t["threshold"], t["value"])
                      for t in doc["trees"]]

    @classmethod
    def load(cls, path: str | Path = MODEL_PATH) -> "PatternClassifier":
        with open(path, encoding="utf-8") as f:
            return cls(json.load(f))

    def proba(self, x: list[float]) -> list[float]:
        acc = [0.0] * len(self.classes)
        for left, right, feat, thr, value in self.trees:
            node = 0
            while left[node] >= 0:
                node = left[node] if x[feat[node]] <= thr[node] else right[node]
            for i, v in enumerate(value[node]):
                acc[i] += v
        n = len(self.trees)
        return [a / n for a in acc]

    def classify(self, x: list[float]) -> tuple[str, float]:
        p = self.proba(x)
        best = max(range(len(p)), key=p.__getitem__)
        return self.classes[best], p[best]


@lru_cache(maxsize=1)
def default_classifier() -> PatternClassifier:
    return PatternClassifier.load(MODEL_PATH)
