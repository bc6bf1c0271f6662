import ast
import io
import pathlib
from contextlib import redirect_stdout

from predictors import evaluate
from predictors.events import write_jsonl
from predictors.tracegen import family_spec, generate

PKG = pathlib.Path(__file__).resolve().parents[2] / "predictors"


def test_predictors_never_import_the_daemon_or_fuse():
    for f in PKG.glob("*.py"):
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] not in {"neuralcache", "trio", "pyfuse3", "torch"}, f


def test_evaluate_runs_on_a_jsonl_trace(tmp_path):
    tr = generate(family_spec("sequential", n_files=60, epochs=2))
    path = tmp_path / "t.jsonl"
    write_jsonl(tr.events, str(path))
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert evaluate.main(["--no-generated", "--trace", str(path)]) == 0
    out = buf.getvalue()
    assert "| ensemble        | epoch |" in out and str(path) in out


def test_evaluate_rejects_a_malformed_trace(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"t": 1}\n')
    assert evaluate.main(["--no-generated", "--trace", str(path)]) == 1
    assert "line 1" in capsys.readouterr().err
