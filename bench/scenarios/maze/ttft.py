"""Cold start: load a maze checkpoint in a fresh process and time the first generated token.

    python -m bench.scenarios.maze.ttft CKPT_DIR [--maze 0] [--threads 1]

CKPT_DIR holds config.json + model.safetensors (as written by bench.scenarios.maze.train; the
harness points it at a mount). Prints one JSON object:

    import_s   importing torch + transformers (not I/O on CKPT_DIR; reported apart)
    load_s     reading config + safetensors into a LlamaForCausalLM (the I/O-bound part)
    first_token_s  the prompt forward pass of one eval maze and its argmax
    ttft_s     load_s + first_token_s
    total_s    process start (this module's import) to first token

Nothing is fetched from a hub: HF_HUB_OFFLINE is set and local_files_only=True.
"""
from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


def run(ckpt_dir: str, maze_index: int = 0, threads: int = 1) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    ti = time.perf_counter()
    import torch
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from . import mazes
    import_s = time.perf_counter() - ti
    hf_logging.disable_progress_bar()
    torch.set_num_threads(threads)

    tl = time.perf_counter()
    model = LlamaForCausalLM.from_pretrained(ckpt_dir, local_files_only=True,
                                             torch_dtype=torch.float32)
    model.eval()
    load_s = time.perf_counter() - tl

    cfg = model.config
    rows, cols = getattr(cfg, "maze_rows", 5), getattr(cfg, "maze_cols", 5)
    task = mazes.eval_set(rows, cols, getattr(cfg, "maze_eval_seed", 1_000_003))[maze_index]
    fmt = getattr(cfg, "maze_answer_format", "path")
    prompt = torch.tensor([mazes.prompt_tokens(task, fmt)], dtype=torch.long)
    tf = time.perf_counter()
    with torch.no_grad():
        tok = int(model(input_ids=prompt).logits[0, -1].argmax())
    first_token_s = time.perf_counter() - tf
    t_end = time.perf_counter()
    size = sum(os.path.getsize(os.path.join(ckpt_dir, f)) for f in os.listdir(ckpt_dir)
               if os.path.isfile(os.path.join(ckpt_dir, f)))
    return {"ckpt_dir": ckpt_dir, "ckpt_bytes": size, "import_s": import_s, "load_s": load_s,
            "first_token_s": first_token_s, "ttft_s": load_s + first_token_s,
            "total_s": t_end - T0, "maze": maze_index, "first_token": tok,
            "first_token_correct": tok == mazes.cell_token(task.start)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scenarios.maze.ttft", description=__doc__.split("\n")[0])
    p.add_argument("ckpt_dir")
    p.add_argument("--maze", type=int, default=0, help="which of the 64 eval mazes to prompt with")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    if not os.path.isfile(os.path.join(a.ckpt_dir, "config.json")):
        print(f"bench.scenarios.maze.ttft: no config.json in {a.ckpt_dir}", file=sys.stderr)
        return 1
    print(json.dumps(run(a.ckpt_dir, a.maze, a.threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
