"""NeuralCache predictors: access events in, ranked predictions out (pure Python + numpy;
scikit-learn only for training). Never imports neuralcache, trio or pyfuse3."""
from .base import Catalog, Prediction, Predictor
from .ensemble import EnsemblePredictor, make_default_predictor
from .epoch import EpochTracker
from .epochset import EpochSetPredictor
from .events import Event, dumps, parse_line, read_jsonl, write_jsonl
from .hints import HintPredictor, parse_hints, validate_hints
from .seqread import SeqReadPredictor
from .stride import StridePredictor
from .successor import SuccessorPredictor

__all__ = [
    "Catalog", "Prediction", "Predictor", "EnsemblePredictor", "make_default_predictor",
    "EpochTracker", "EpochSetPredictor", "Event", "dumps", "parse_line", "read_jsonl",
    "write_jsonl", "HintPredictor", "parse_hints", "validate_hints", "SeqReadPredictor",
    "StridePredictor", "SuccessorPredictor",
]
