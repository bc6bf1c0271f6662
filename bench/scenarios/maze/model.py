"""A small LLaMA (transformers' LlamaForCausalLM) built from a config; nothing is downloaded.

Sizes are named presets so that the CLI, the checkpoint and the report agree on what was
trained. The model is random-initialised from `torch.manual_seed` and trained from scratch.
"""
from __future__ import annotations

import inspect

import torch

from . import mazes

# name -> (hidden, layers, heads, intermediate). Parameter counts are for a 5x5 vocab.
PRESETS = {
    "tiny": (64, 2, 4, 256),      # ~0.1 M: for tests
    "small": (128, 4, 4, 512),    # ~0.8 M
    "base": (192, 6, 6, 768),     # ~2.7 M
}


def llama_config(rows: int, cols: int, preset: str = "small"):
    from transformers import LlamaConfig

    hidden, layers, heads, inter = PRESETS[preset]
    return LlamaConfig(
        vocab_size=mazes.vocab_size(rows, cols),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max(64, mazes.max_sequence_length(rows, cols, "walk")),
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        pad_token_id=mazes.PAD,
        bos_token_id=mazes.BOS,
        eos_token_id=mazes.PATH_END,
        use_cache=False,
    )


def build(rows: int, cols: int, preset: str = "small", seed: int = 0):
    from transformers import LlamaForCausalLM

    cfg = llama_config(rows, cols, preset)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    return model


def n_params(model) -> int:
    # tied embeddings count once
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def path_loss(model, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Causal LM loss on the labelled (path) positions only.

    `labels` is `input_ids` with every non-path position set to -100. Sequences are
    right-padded, so padding never sits before a real token and needs no attention mask.
    """
    logits = model(input_ids=input_ids).logits[:, :-1, :]
    tgt = labels[:, 1:]
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(), tgt.reshape(-1), ignore_index=-100)


def _cache_kwarg(model) -> str:
    """transformers 5.x renamed `past_key_values` to `cache`; accept both."""
    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@torch.no_grad()
def greedy_paths(model, prompts: torch.Tensor, max_new: int) -> list[list[int]]:
    """Greedy decoding from equal-length prompts, with the KV cache; returns new tokens."""
    model.eval()
    out = model(input_ids=prompts, use_cache=True)
    past = _cache_of(out)
    nxt = out.logits[:, -1, :].argmax(-1, keepdim=True)
    gen = [nxt]
    done = nxt.squeeze(1) == mazes.PATH_END
    for _ in range(max_new - 1):
        if bool(done.all()):
            break
        out = model(input_ids=nxt, use_cache=True, **{_cache_kwarg(model): past})
        past = _cache_of(out)
        nxt = out.logits[:, -1, :].argmax(-1, keepdim=True)
        gen.append(nxt)
        done |= nxt.squeeze(1) == mazes.PATH_END
    return torch.cat(gen, dim=1).tolist()


def evaluate(model, tasks: list[mazes.Maze], fmt: str = mazes.DEFAULT_FORMAT) -> dict:
    """Exact-match accuracy: the decoded path must be valid and the shortest path.

    Also reports `valid_rate` (valid walks start->goal through open passages, detours
    allowed) and, for the "walk" format, `walk_valid_rate` for the chain of thought.
    """
    was_training = model.training
    rows, cols = tasks[0].rows, tasks[0].cols
    prompts = torch.tensor([mazes.prompt_tokens(t, fmt) for t in tasks], dtype=torch.long)
    gens = greedy_paths(model, prompts, max_new=mazes.max_answer_length(rows, cols, fmt))
    exact = valid = walk_ok = 0
    reasons: dict[str, int] = {}
    for task, gen in zip(tasks, gens):
        path, walk = mazes.decode_answer(gen, fmt)
        why = mazes.check_path(task, path)
        reasons[why] = reasons.get(why, 0) + 1
        if why == "ok":
            valid += 1
            exact += path == mazes.shortest_path(task)
        if walk is not None:
            walk_ok += mazes.check_path(task, walk) == "ok"
    if was_training:
        model.train()
    res = {"accuracy": exact / len(tasks), "valid_rate": valid / len(tasks),
           "n": len(tasks), "failures": {k: v for k, v in reasons.items() if k != "ok"}}
    if fmt == "walk":
        res["walk_valid_rate"] = walk_ok / len(tasks)
    return res
