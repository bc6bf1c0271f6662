"""Perfect mazes on small grids: generation, shortest paths, token serialization, checking.

A maze is a spanning tree of the ``rows x cols`` grid graph (a *perfect* maze: every cell
reachable, exactly one simple path between any two cells), drawn by a randomized
depth-first search (the "recursive backtracker": long winding corridors, as in the
maze-dataset literature). A *task* is a maze plus a start and a goal cell; its answer is
the shortest (and, in a tree, the only simple) path, found by BFS.

Token sequence of one task (one token per cell, so attention can find a cell by content)::

    BOS ADJ_START  a b ;  a b ;  ...  ADJ_END  ORIGIN s  TARGET g  PATH_START p0 p1 ... pk PATH_END

The edge list holds every open passage once (``a < b``), in an order shuffled from the
task's own seed. For a perfect maze there are ``rows*cols - 1`` edges, so the prompt
(everything up to and including PATH_START) has a fixed length for a given grid and a
batch of prompts needs no padding. The loss is taken on ``p0 .. pk PATH_END`` only.

Every random choice comes from ``random.Random(<str>)``, which CPython seeds through
SHA-512, so the same seed gives the same mazes on every machine and Python 3 version.
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

# ---- vocabulary -----------------------------------------------------------------------
PAD = 0
BOS = 1
ADJ_START = 2
ADJ_END = 3
EDGE_SEP = 4
ORIGIN = 5
TARGET = 6
PATH_START = 7
PATH_END = 8
WALK_START = 9
WALK_END = 10
N_SPECIAL = 16  # cell tokens start here; 11..15 are reserved for later format versions
SPECIAL_NAMES = {PAD: "<pad>", BOS: "<bos>", ADJ_START: "<adj>", ADJ_END: "</adj>",
                 EDGE_SEP: ";", ORIGIN: "<origin>", TARGET: "<target>",
                 PATH_START: "<path>", PATH_END: "</path>",
                 WALK_START: "<walk>", WALK_END: "</walk>"}

# Answer formats. "path": the prompt ends with <path> and the answer is the path.
# "walk": the prompt ends with <walk>; the answer is a right-hand wall-follower walk from
# start to goal (a chain of thought whose every step is a local decision), then
# </walk> <path> and the shortest path, which is the walk with its loops erased.
FORMATS = ("path", "walk")

# Splits get disjoint seed namespaces; eval tasks are also checked against training.
TRAIN = "train"
EVAL = "eval"


def vocab_size(rows: int, cols: int) -> int:
    return N_SPECIAL + rows * cols


def cell_token(cell: int) -> int:
    return N_SPECIAL + cell


def token_cell(tok: int) -> int:
    return tok - N_SPECIAL


def prompt_length(rows: int, cols: int) -> int:
    """BOS ADJ_START 3*(edges) ADJ_END ORIGIN s TARGET g (PATH_START|WALK_START)."""
    return 2 + 3 * (rows * cols - 1) + 1 + 4 + 1


@dataclass(frozen=True)
class Maze:
    rows: int
    cols: int
    edges: tuple[tuple[int, int], ...]  # open passages (a, b), a < b, in serialization order
    start: int
    goal: int

    @property
    def n_cells(self) -> int:
        return self.rows * self.cols

    def key(self) -> tuple:
        """Identity of the task, independent of edge order (for disjointness checks)."""
        return (self.rows, self.cols, tuple(sorted(self.edges)), self.start, self.goal)

    def adjacency(self) -> list[set[int]]:
        adj: list[set[int]] = [set() for _ in range(self.n_cells)]
        for a, b in self.edges:
            adj[a].add(b)
            adj[b].add(a)
        return adj


def grid_neighbours(cell: int, rows: int, cols: int) -> list[int]:
    r, c = divmod(cell, cols)
    out = []
    if r > 0:
        out.append(cell - cols)
    if r < rows - 1:
        out.append(cell + cols)
    if c > 0:
        out.append(cell - 1)
    if c < cols - 1:
        out.append(cell + 1)
    return out


def generate(rows: int, cols: int, rng: random.Random) -> Maze:
    """Randomized DFS spanning tree, random distinct start/goal, shuffled edge order."""
    n = rows * cols
    seen = [False] * n
    first = rng.randrange(n)
    seen[first] = True
    stack = [first]
    edges: list[tuple[int, int]] = []
    while stack:
        cur = stack[-1]
        options = [x for x in grid_neighbours(cur, rows, cols) if not seen[x]]
        if not options:
            stack.pop()
            continue
        nxt = options[rng.randrange(len(options))]
        seen[nxt] = True
        edges.append((min(cur, nxt), max(cur, nxt)))
        stack.append(nxt)
    rng.shuffle(edges)
    start = rng.randrange(n)
    goal = rng.randrange(n - 1)
    if goal >= start:
        goal += 1
    return Maze(rows, cols, tuple(edges), start, goal)


def task_rng(seed: int, split: str, index: int) -> random.Random:
    return random.Random(f"neuralcache-maze:{seed}:{split}:{index}")


def make_task(seed: int, split: str, index: int, rows: int, cols: int) -> Maze:
    return generate(rows, cols, task_rng(seed, split, index))


def eval_set(rows: int, cols: int, seed: int = 1_000_003, n: int = 64) -> list[Maze]:
    """The fixed evaluation tasks: their own seed *and* their own split namespace."""
    return [make_task(seed, EVAL, i, rows, cols) for i in range(n)]


def shortest_path(maze: Maze) -> list[int]:
    adj = maze.adjacency()
    prev = {maze.start: -1}
    q = deque([maze.start])
    while q:
        cur = q.popleft()
        if cur == maze.goal:
            break
        for nxt in sorted(adj[cur]):
            if nxt not in prev:
                prev[nxt] = cur
                q.append(nxt)
    if maze.goal not in prev:
        raise ValueError("goal unreachable")
    path = [maze.goal]
    while path[-1] != maze.start:
        path.append(prev[path[-1]])
    return path[::-1]


def is_perfect(maze: Maze) -> bool:
    """Edges are grid-adjacent, no duplicates, n-1 of them, and they connect every cell."""
    n = maze.n_cells
    if len(set(maze.edges)) != len(maze.edges) or len(maze.edges) != n - 1:
        return False
    for a, b in maze.edges:
        if not (0 <= a < b < n) or b not in grid_neighbours(a, maze.rows, maze.cols):
            return False
    adj = maze.adjacency()
    seen = {0}
    q = deque([0])
    while q:
        for nxt in adj[q.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                q.append(nxt)
    return len(seen) == n  # connected with n-1 edges => a tree


def check_path(maze: Maze, path: list[int]) -> str:
    """'ok' for a valid walk start->goal through open passages, else the reason it fails.

    A valid walk may still take detours; `is_solution` additionally demands the
    shortest path (in a perfect maze: the only simple path).
    """
    if not path:
        return "empty"
    if any(not (0 <= c < maze.n_cells) for c in path):
        return "not a cell"
    if path[0] != maze.start:
        return "does not begin at start"
    adj = maze.adjacency()
    for a, b in zip(path, path[1:]):
        if b not in grid_neighbours(a, maze.rows, maze.cols):
            return "jump"
        if b not in adj[a]:
            return "crosses a wall"
    if path[-1] != maze.goal:
        return "does not reach goal"
    return "ok"


def is_solution(maze: Maze, path: list[int]) -> bool:
    return check_path(maze, path) == "ok" and path == shortest_path(maze)


# ---- the wall follower (the "walk" chain of thought) ----------------------------------
_HEADINGS = 4  # 0 north, 1 east, 2 south, 3 west (clockwise)


def _step(cell: int, d: int, rows: int, cols: int) -> int | None:
    r, c = divmod(cell, cols)
    r, c = (r - 1, c) if d == 0 else (r, c + 1) if d == 1 else (r + 1, c) if d == 2 else (r, c - 1)
    return r * cols + c if 0 <= r < rows and 0 <= c < cols else None


def wall_follower(maze: Maze) -> list[int]:
    """Right-hand rule from start (initial heading north) until the goal.

    Each move depends only on the current cell's open sides and the heading (the previous
    move), so a transformer can learn it locally; in a perfect maze it reaches the goal in
    at most 2*(cells-1) moves.
    """
    adj = maze.adjacency()
    cur, heading, walk = maze.start, 0, [maze.start]
    while cur != maze.goal:
        for d in ((heading + 1) % 4, heading, (heading + 3) % 4, (heading + 2) % 4):
            nxt = _step(cur, d, maze.rows, maze.cols)
            if nxt is not None and nxt in adj[cur]:
                cur, heading = nxt, d
                walk.append(cur)
                break
        if len(walk) > 2 * maze.n_cells:
            raise ValueError("wall follower did not reach the goal (not a perfect maze?)")
    return walk


def erase_loops(walk: list[int]) -> list[int]:
    """Path from a walk: from each cell jump to what follows its *last* visit.

    That is a pointer chase a transformer can do in one attention hop per token. For a walk
    in a tree ending at the goal it yields the unique simple path.
    """
    if not walk:
        return []
    last = {c: i for i, c in enumerate(walk)}
    path = [walk[0]]
    while last[path[-1]] + 1 < len(walk):
        path.append(walk[last[path[-1]] + 1])
        if len(path) > len(walk):
            break
    return path


# ---- tokens ---------------------------------------------------------------------------
DEFAULT_FORMAT = "walk"


def prompt_tokens(maze: Maze, fmt: str = DEFAULT_FORMAT) -> list[int]:
    toks = [BOS, ADJ_START]
    for a, b in maze.edges:
        toks += [cell_token(a), cell_token(b), EDGE_SEP]
    toks += [ADJ_END, ORIGIN, cell_token(maze.start), TARGET, cell_token(maze.goal)]
    toks.append(WALK_START if fmt == "walk" else PATH_START)
    return toks


def answer_tokens(maze: Maze, fmt: str = DEFAULT_FORMAT) -> list[int]:
    path = [cell_token(c) for c in shortest_path(maze)] + [PATH_END]
    if fmt == "path":
        return path
    if fmt == "walk":
        return [cell_token(c) for c in wall_follower(maze)] + [WALK_END, PATH_START] + path
    raise ValueError(f"unknown format {fmt!r}")


def to_tokens(maze: Maze, fmt: str = DEFAULT_FORMAT) -> list[int]:
    return prompt_tokens(maze, fmt) + answer_tokens(maze, fmt)


def max_answer_length(rows: int, cols: int, fmt: str = DEFAULT_FORMAT) -> int:
    n = rows * cols
    return n + 1 if fmt == "path" else (2 * (n - 1) + 1) + 2 + n + 1


def max_sequence_length(rows: int, cols: int, fmt: str = DEFAULT_FORMAT) -> int:
    return prompt_length(rows, cols) + max_answer_length(rows, cols, fmt)


def format_of(prompt: list[int]) -> str:
    return "walk" if prompt[-1] == WALK_START else "path"


def _cells(toks: list[int], stop: int) -> list[int]:
    out = []
    for tok in toks:
        if tok == stop:
            break
        out.append(token_cell(tok) if tok >= N_SPECIAL else -1)
    return out


def decode_answer(generated: list[int], fmt: str = DEFAULT_FORMAT) -> tuple[list[int], list[int] | None]:
    """Model output after the prompt -> (path, walk or None). Specials inside -> -1."""
    if fmt == "path":
        return _cells(generated, PATH_END), None
    walk = _cells(generated, WALK_END)
    rest = generated[len(walk):]
    if rest[:2] != [WALK_END, PATH_START]:
        return [], walk
    return _cells(rest[2:], PATH_END), walk


def decode_path(generated: list[int], fmt: str = "path") -> list[int]:
    return decode_answer(generated, fmt)[0]


def from_tokens(tokens: list[int], rows: int, cols: int) -> tuple[Maze, list[int]]:
    """Parse a full sequence back into (maze, path); raises ValueError when malformed."""
    t = list(tokens)
    if t[:2] != [BOS, ADJ_START]:
        raise ValueError("bad header")
    i = 2
    edges = []
    while t[i] != ADJ_END:
        a, b, sep = t[i:i + 3]
        if sep != EDGE_SEP:
            raise ValueError("bad edge")
        edges.append((token_cell(a), token_cell(b)))
        i += 3
    i += 1
    if t[i] != ORIGIN or t[i + 2] != TARGET or t[i + 4] not in (PATH_START, WALK_START):
        raise ValueError("bad origin/target")
    maze = Maze(rows, cols, tuple(edges), token_cell(t[i + 1]), token_cell(t[i + 3]))
    fmt = "walk" if t[i + 4] == WALK_START else "path"
    return maze, decode_answer(t[i + 5:], fmt)[0]


def render(maze: Maze, path: list[int] | None = None) -> str:
    """ASCII picture, for debugging and the README."""
    adj = maze.adjacency()
    on = set(path or [])
    lines = ["+" + "---+" * maze.cols]
    for r in range(maze.rows):
        row, below = "|", "+"
        for c in range(maze.cols):
            cell = r * maze.cols + c
            mark = "S" if cell == maze.start else "G" if cell == maze.goal else "*" if cell in on else " "
            row += f" {mark} " + (" " if cell + 1 in adj[cell] and c < maze.cols - 1 else "|")
            below += ("   " if cell + maze.cols in adj[cell] else "---") + "+"
        lines += [row, below]
    return "\n".join(lines)
