"""Maze generation, BFS, the path checker and token round trips (no torch needed)."""
import random

import pytest

from bench.scenarios.maze import mazes


@pytest.mark.parametrize("rows,cols", [(2, 2), (3, 5), (4, 4), (5, 5), (6, 6)])
def test_generated_mazes_are_perfect(rows, cols):
    for i in range(50):
        m = mazes.make_task(7, mazes.TRAIN, i, rows, cols)
        assert mazes.is_perfect(m)
        assert len(m.edges) == rows * cols - 1
        assert m.start != m.goal


def test_is_perfect_rejects_cycle_and_disconnection():
    m = mazes.make_task(0, mazes.TRAIN, 0, 4, 4)
    edge_set = set(m.edges)
    extra = next((a, a + 1) for a in range(16) if a % 4 != 3 and (a, a + 1) not in edge_set)
    assert not mazes.is_perfect(mazes.Maze(4, 4, m.edges + (extra,), m.start, m.goal))
    assert not mazes.is_perfect(mazes.Maze(4, 4, m.edges[:-1], m.start, m.goal))
    assert not mazes.is_perfect(mazes.Maze(4, 4, m.edges[:-1] + ((0, 5),), m.start, m.goal))


def test_bfs_path_is_valid_simple_and_unique():
    for i in range(100):
        m = mazes.make_task(3, mazes.TRAIN, i, 5, 5)
        p = mazes.shortest_path(m)
        assert mazes.check_path(m, p) == "ok"
        assert len(set(p)) == len(p)
        assert mazes.is_solution(m, p)


def test_checker_rejects_invalid_paths():
    rng = random.Random(1)
    for i in range(60):
        m = mazes.make_task(5, mazes.TRAIN, i, 5, 5)
        p = mazes.shortest_path(m)
        adj = m.adjacency()
        assert mazes.check_path(m, []) == "empty"
        assert mazes.check_path(m, p[1:] if len(p) > 1 else [m.goal]) != "ok"
        assert mazes.check_path(m, p[:-1]) == "does not reach goal"
        # through a wall: a grid neighbour that is not connected
        cur = p[0]
        walled = [x for x in mazes.grid_neighbours(cur, 5, 5) if x not in adj[cur]]
        if walled:
            assert mazes.check_path(m, [cur, walled[0]] + p[1:]) == "crosses a wall"
        far = [x for x in range(25) if x not in mazes.grid_neighbours(cur, 5, 5) and x != cur]
        assert mazes.check_path(m, [cur, rng.choice(far)] + p[1:]) == "jump"
        assert mazes.check_path(m, [cur, 99]) == "not a cell"
        # a detour is a valid walk but not the solution
        if len(p) >= 2:
            detour = [p[0], p[1], p[0]] + p[1:]
            assert mazes.check_path(m, detour) == "ok"
            assert not mazes.is_solution(m, detour)


@pytest.mark.parametrize("fmt", mazes.FORMATS)
def test_tokens_round_trip_and_fixed_prompt_length(fmt):
    for i in range(30):
        m = mazes.make_task(0, mazes.TRAIN, i, 5, 5)
        toks = mazes.to_tokens(m, fmt)
        prompt = mazes.prompt_tokens(m, fmt)
        assert len(prompt) == mazes.prompt_length(5, 5)
        assert mazes.format_of(prompt) == fmt
        assert len(toks) <= mazes.max_sequence_length(5, 5, fmt)
        assert max(toks) < mazes.vocab_size(5, 5)
        back, path = mazes.from_tokens(toks, 5, 5)
        assert back == m
        assert path == mazes.shortest_path(m)
        path2, walk = mazes.decode_answer(toks[len(prompt):], fmt)
        assert path2 == path
        if fmt == "walk":
            assert walk == mazes.wall_follower(m)


def test_wall_follower_reaches_goal_and_erases_to_the_shortest_path():
    for size in (3, 4, 5, 6):
        for i in range(100):
            m = mazes.make_task(11, mazes.TRAIN, i, size, size)
            walk = mazes.wall_follower(m)
            assert mazes.check_path(m, walk) == "ok"
            assert len(walk) <= 2 * (size * size - 1) + 1
            assert mazes.erase_loops(walk) == mazes.shortest_path(m)


def test_decode_answer_tolerates_garbage():
    assert mazes.decode_answer([], "walk") == ([], [])
    assert mazes.decode_answer([mazes.PATH_END], "path") == ([], None)
    p, w = mazes.decode_answer([20, 21, mazes.EDGE_SEP, mazes.WALK_END, mazes.PATH_START, 20, 21], "walk")
    assert w == [4, 5, -1] and p == [4, 5]


def test_same_seed_same_maze_other_seed_other_maze():
    a = [mazes.make_task(1, mazes.TRAIN, i, 5, 5) for i in range(20)]
    b = [mazes.make_task(1, mazes.TRAIN, i, 5, 5) for i in range(20)]
    c = [mazes.make_task(2, mazes.TRAIN, i, 5, 5) for i in range(20)]
    assert a == b
    assert a != c


def test_eval_set_fixed_and_64():
    e1, e2 = mazes.eval_set(5, 5), mazes.eval_set(5, 5)
    assert len(e1) == 64 and e1 == e2
    assert len({m.key() for m in e1}) == 64


def test_render_shows_start_goal():
    m = mazes.make_task(0, mazes.TRAIN, 0, 3, 3)
    pic = mazes.render(m, mazes.shortest_path(m))
    assert pic.count("S") == 1 and pic.count("G") == 1
