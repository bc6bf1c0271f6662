"""A few training steps from a local temp dir: finishes, is deterministic, saves a checkpoint."""
import json
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from bench.scenarios.maze import data, mazes, training  # noqa: E402
from bench.scenarios.maze import model as M  # noqa: E402

STEPS = 6


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    d = tmp_path_factory.mktemp("mazedata")
    data.write_dataset(d, seed=0, rows=4, cols=4, n_train=256, shard_size=64)
    return d


def _run(root, out, layout):
    return training.train(root, layout=layout, steps=STEPS, batch_size=8, workers=2, out=out,
                          seed=1, preset="tiny", threads=1, window=3)


@pytest.mark.parametrize("layout", ["files", "shards"])
def test_tiny_training_is_deterministic(root, tmp_path, layout):
    a = _run(root, tmp_path / "a", layout)
    b = _run(root, tmp_path / "b", layout)
    assert len(a["loss_curve"]) == STEPS
    assert a["loss_curve"] == b["loss_curve"]
    assert a["bytes_digest"] == b["bytes_digest"] and a["bytes_read"] == b["bytes_read"] > 0
    assert a["samples"] == STEPS * 8
    assert [w["first_step"] for w in a["windows"]] == [1, 4]
    assert 0.0 <= a["accuracy_before"] <= 1.0 and 0.0 <= a["accuracy_after"] <= 1.0
    ck = tmp_path / "a" / "checkpoint"
    assert (ck / "model.safetensors").is_file() and (ck / "config.json").is_file()
    saved = json.loads((tmp_path / "a" / "result.json").read_text())
    assert saved["loss_curve"] == a["loss_curve"]
    if layout == "files":
        pytest.ttft_ckpt = ck  # reused by the cold-start test below


def test_other_seed_other_curve(root, tmp_path):
    a = training.train(root, steps=3, batch_size=8, workers=0, seed=1, preset="tiny", threads=1)
    b = training.train(root, steps=3, batch_size=8, workers=0, seed=2, preset="tiny", threads=1)
    assert a["loss_curve"] != b["loss_curve"]
    assert a["bytes_digest"] != b["bytes_digest"]  # another sampler order


def test_planned_batches_cover_each_epoch_once():
    bs = training.planned_batches(10, steps=5, batch_size=4, seed=0)
    flat = [i for b in bs for i in b]
    assert len(bs) == 5 and all(len(b) == 4 for b in bs)
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))


class _Oracle(torch.nn.Module):
    """Stands in for the LLaMA: emits the reference answer, keeps the sequence as its cache."""

    def __init__(self, rows, cols, fmt, wrong=False):
        super().__init__()
        self.rows, self.cols, self.fmt, self.wrong = rows, cols, fmt, wrong

    def forward(self, input_ids, use_cache=False, past_key_values=None, **kw):
        seq = input_ids if past_key_values is None else torch.cat([past_key_values, input_ids], 1)
        plen = mazes.prompt_length(self.rows, self.cols)
        out = []
        for row in seq.tolist():
            maze, _ = mazes.from_tokens(row[:plen] + [mazes.PATH_END], self.rows, self.cols)
            full = mazes.to_tokens(maze, self.fmt)
            if self.wrong:  # answer a different (wrong) goal's path
                maze = mazes.Maze(maze.rows, maze.cols, maze.edges, maze.start,
                                  (maze.goal + 1) % (self.rows * self.cols) or 1)
                full = full[:plen] + mazes.answer_tokens(maze, self.fmt) if maze.goal != maze.start else full
            nxt = full[len(row)] if len(row) < len(full) else mazes.PATH_END
            out.append(torch.nn.functional.one_hot(torch.tensor(nxt), mazes.vocab_size(self.rows, self.cols)))
        logits = torch.stack(out).float()[:, None, :].expand(-1, input_ids.shape[1], -1)
        return type("Out", (), {"logits": logits, "past_key_values": seq})()


@pytest.mark.parametrize("fmt", mazes.FORMATS)
def test_evaluate_scores_oracle_one_and_wrong_answers_zero(fmt):
    tasks = mazes.eval_set(3, 3)[:12]
    res = M.evaluate(_Oracle(3, 3, fmt), tasks, fmt)
    assert res["accuracy"] == 1.0 and res["valid_rate"] == 1.0 and res["failures"] == {}
    bad = M.evaluate(_Oracle(3, 3, fmt, wrong=True), tasks, fmt)
    assert bad["accuracy"] == 0.0


def test_untrained_model_scores_zero_and_eval_runs():
    net = M.build(4, 4, "tiny", seed=0)
    res = M.evaluate(net, mazes.eval_set(4, 4)[:16], "walk")
    assert res["n"] == 16 and res["accuracy"] == 0.0
    assert sum(res["failures"].values()) == 16


def test_ttft_loads_checkpoint(root, tmp_path, capsys):
    from bench.scenarios.maze import ttft

    ck = getattr(pytest, "ttft_ckpt", None)
    if ck is None:
        training.train(root, steps=1, batch_size=4, workers=0, out=tmp_path, preset="tiny", threads=1)
        ck = tmp_path / "checkpoint"
    assert ttft.main([str(ck), "--threads", "1"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["load_s"] > 0 and res["ttft_s"] >= res["load_s"]
    assert res["ckpt_bytes"] > 0
    assert ttft.main([str(tmp_path / "nowhere")]) == 1
