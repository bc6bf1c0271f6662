"""The scenario registry: name -> function(ctx) -> list of result rows.

A row is a dict with at least ``scenario``, ``system``, ``phase`` and either ``value`` +
``unit`` (+ ``seconds``, ``bytes``) or ``error``; ``Ctx.run_systems`` and ``Ctx.measure``
fill in the rest (link bytes, hit rate, prefetch precision).  Each scenario is a module
of this package with ``scenario(ctx)`` (multinode and maze: a package with scenario.py);
to add one, write it and ``register("name", module.scenario)`` below -- see README.md.
"""
from __future__ import annotations

from typing import Callable

from bench.scenarios import (bigfile, checkpoint, fio, overflow, samples, shards, train,
                             train_files)
from bench.scenarios.multinode import scenario as multinode
from bench.scenarios.namespace import scenario as namespace
from bench.systems import peers
from bench.systems.registry import PEER_SYSTEMS

SCENARIOS: dict[str, Callable] = {}
# What "--scenario all" runs: the built-in scenarios (their sizes fit the --quick and
# full time budgets); registered extras such as maze run when named.
DEFAULT: list[str] = []
# The scenarios whose workload hands its read order to the mount when the system asks
# for it (``m.info["hints"]``, the neuralcache-hints system).  Elsewhere that system
# would be the same as neuralcache, so it does not run there.
HINTED: list[str] = []
HINTS_SYSTEM = "neuralcache-hints"
# name -> fn() -> None, or one line saying what to install (asked before a run starts).
REQUIRES: dict[str, Callable[[], str | None]] = {}


def register(name: str, fn: Callable, default: bool = False, hints: bool = False,
             requires: Callable[[], str | None] | None = None) -> Callable:
    SCENARIOS[name] = fn
    if default and name not in DEFAULT:
        DEFAULT.append(name)
    if hints and name not in HINTED:
        HINTED.append(name)
    if requires is not None:
        REQUIRES[name] = requires
    return fn


def missing_requirements(names: list[str]) -> str | None:
    """The first scenario requirement that this machine lacks, as one line; else None."""
    for name in names:
        msg = REQUIRES[name]() if name in REQUIRES else None
        if msg:
            return msg
    return None


def systems_for(name: str, systems: list[str]) -> list[str]:
    """The systems scenario ``name`` runs: ``systems`` without neuralcache-hints unless the
    scenario publishes hints, and without the peers (client systems) that have no
    version of its workload (bench/systems/peers.py: ``scenarios_of``)."""
    out = list(systems) if name in HINTED else [s for s in systems if s != HINTS_SYSTEM]
    return [s for s in out if s not in PEER_SYSTEMS or name in peers.scenarios_of(s)]


def peers_note(names: list[str], systems: list[str]) -> str | None:
    """The one note for a run with peers: which scenarios each peer has no version of."""
    skipped = []
    for s in systems:
        if s in PEER_SYSTEMS and "-tuned" not in s:
            out = [n for n in names if n not in peers.scenarios_of(s)]
            if out:
                skipped.append(f"{s} (+ -tuned) in {', '.join(out)}")
    if not skipped:
        return None
    return ("peers run only in the scenarios they have a workload for; skipped: "
            + "; ".join(skipped))


def hints_note(names: list[str], systems: list[str]) -> str | None:
    """The one note for a run whose user named neuralcache-hints: where it was skipped."""
    skipped = [n for n in names if HINTS_SYSTEM in systems and n not in HINTED]
    if not skipped:
        return None
    return (f"{HINTS_SYSTEM} skipped in {', '.join(skipped)}: only {', '.join(HINTED)} "
            "publish hints; elsewhere it would equal neuralcache")


# The built-in scenarios, one module each (in this order in "all" and in `list`).
register("shards", shards.scenario, default=True, hints=True)
register("samples", samples.scenario, default=True, hints=True)
register("train", train.scenario, default=True)
register("bigfile", bigfile.scenario, default=True)
register("overflow", overflow.scenario, default=True)
register("fio", fio.scenario, default=True)
register("train-files", train_files.scenario, default=True, hints=True)
register("checkpoint", checkpoint.scenario)    # long: not in "all"
register("multinode", multinode.scenario)
register("namespace", namespace.scenario)   # long (fills a bucket once): not in "all"


def _maybe_register_maze() -> None:
    """bench/scenarios/maze/scenario.py exposing ``scenario(ctx)`` becomes the ``maze`` scenario.

    A module that exists but fails to import still registers, as a scenario that
    raises the import error -- the run shows an error row instead of a missing scenario.
    """
    try:
        import bench.scenarios.maze.scenario as mod
    except ModuleNotFoundError as exc:
        if exc.name in ("bench.scenarios.maze", "bench.scenarios.maze.scenario"):
            return
        err = exc
    except Exception as exc:  # a broken module must not break the other scenarios
        err = exc
    else:
        fn = getattr(mod, "scenario", None)
        if callable(fn):
            register("maze", fn, requires=getattr(mod, "requirements", None))
        return

    def broken(ctx):
        raise RuntimeError(f"bench.scenarios.maze.scenario failed to import: {err!r}")
    broken.__doc__ = "maze (import failed)"
    register("maze", broken)


_maybe_register_maze()
