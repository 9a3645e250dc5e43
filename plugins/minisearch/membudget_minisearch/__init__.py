"""membudget-minisearch: near-optimal static placement with a proof (or a stated gap).

Registers the allocator ``minisearch``: best-fit's placement (``membudget-bestfit``) as
the incumbent, then an exact search over the canonical solution space of MiniMalloc
(Moffitt, ASPLOS 2023): blocks placed in order of offset, each at the lowest offset its
placed, time-overlapping neighbours allow, pruned by the max-live (section) bound, dead
ends and symmetry, with the threshold raised as the search proves bounds (iterative
deepening). The search loop is a Numba kernel (``_search._run``) beside a plain-Python
reference (``_search.search_reference``) that visits the same nodes.

The placement says whether its arena is proved optimal (``Placement.optimal``) and the
lower bound it was compared with (``Placement.lower_bound_bytes``).
"""

from __future__ import annotations

from typing import Sequence, Union

from harness.allocators._common import best_placement_on_interrupt, make_placement
from harness.allocators.options import time_limit_option
from harness.allocators.trace import IntTrace, as_int_trace
from harness.hookspecs import hookimpl
from harness.model import MemoryBlock, Placement
from membudget_minisearch._search import PREFERENCES
from membudget_minisearch.solver import SearchResult, solve

__all__ = ["MiniSearch", "SearchResult", "solve", "membudget_register_allocators"]

__version__ = "0.1.0"

DEFAULT_TIME_LIMIT = 5.0


class MiniSearch:
    """``minisearch``: best-fit, then exact canonical search until proved optimal or out of time.

    Options (constructor arguments, or keywords of :meth:`place`, which ``membudget place
    --option KEY=VALUE`` passes): ``time_limit`` (seconds, default 5; ``None``: no limit),
    ``node_limit`` (children tried, default none: a limit that makes the result the same
    on any machine), ``kernel`` (``"numba"`` or ``"python"``, the reference), ``preference``
    (which of equally low blocks the search tries first: ``"portfolio"``, the default,
    runs the orders ``lifetime``, ``size``, ``area``, ``start``, ``start-size`` and a seeded
    random one side by side; or one of the named orders alone).

    Without a proof, the result depends on how far the search got: a time limit makes it
    depend on the machine's speed (a node limit does not).
    """

    name = "minisearch"
    description = "best-fit, then exact search over MiniMalloc's canonical space: proved optimal or a stated gap"
    options = ("time_limit", "node_limit", "kernel", "preference")

    def __init__(self, time_limit: float | None = DEFAULT_TIME_LIMIT, node_limit: int | None = None,
                 kernel: str = "numba", preference: str = "portfolio") -> None:
        self.settings = self._check(dict(time_limit=time_limit, node_limit=node_limit, kernel=kernel,
                                         preference=preference))

    @classmethod
    def _check(cls, settings: dict) -> dict:
        unknown = sorted(set(settings) - set(cls.options))
        if unknown:
            raise TypeError(f"minisearch has no option {', '.join(map(repr, unknown))}; its options: "
                            f"{', '.join(cls.options)}")
        time_limit_option(settings.get("time_limit"))
        nl = settings.get("node_limit")
        if isinstance(nl, float) and nl.is_integer() and nl >= 0:  # --option node_limit=1e6 reads as a float
            nl = settings["node_limit"] = int(nl)
        if nl is not None and (isinstance(nl, bool) or not isinstance(nl, int) or nl < 0):
            raise ValueError(f"node_limit must be an integer >= 0 (or None), got {nl!r}")
        if settings.get("kernel", "numba") not in ("numba", "python"):
            raise ValueError(f"kernel must be 'numba' or 'python', got {settings['kernel']!r}")
        if settings.get("preference", "portfolio") not in ("portfolio", *PREFERENCES):
            raise ValueError(f"preference must be one of portfolio, {', '.join(PREFERENCES)}, "
                             f"got {settings['preference']!r}")
        return settings

    def deterministic(self) -> "MiniSearch":
        """The same settings with a node limit (20,000 unless one is set) instead of the time
        limit: the same placement on every machine (what conformance checks need)."""
        node_limit = self.settings.get("node_limit") or 20_000
        return MiniSearch(**{**self.settings, "time_limit": None, "node_limit": node_limit})

    def solve(self, trace: Union[IntTrace, Sequence[MemoryBlock]], **options) -> SearchResult:
        """The full :class:`SearchResult` for ``trace`` (options as for :meth:`place`)."""
        settings = {**self.settings, **self._check(options)}
        t = as_int_trace(trace)
        return solve(t.lower, t.upper, t.size, **settings)

    def place(self, trace: Sequence[MemoryBlock], **options) -> Placement:
        """Place ``trace``; ``options`` override the allocator's settings for this call."""
        t = as_int_trace(trace)
        with best_placement_on_interrupt(lambda partial: self._placement(t, partial)):  # membudget place prints it
            res = self.solve(t, **options)
        return self._placement(t, res)

    def _placement(self, t: IntTrace, res: SearchResult) -> Placement:
        """The ``Placement`` of a search's result, its notes saying what was proved."""
        if res.optimal:
            notes = f"proved optimal in {res.wall_time_s:.2f} s ({res.nodes} nodes)"
        else:
            notes = (f"not proved: lower bound {res.lower_bound_bytes} bytes, gap {100 * res.gap:.3f}% "
                     f"after {res.wall_time_s:.2f} s ({res.nodes} nodes)")
        notes += f"; best-fit's arena {res.incumbent_bytes}"
        return make_placement(self.name, t, res.offsets, optimal=res.optimal, notes=notes,
                              lower_bound_bytes=res.lower_bound_bytes)


@hookimpl
def membudget_register_allocators(register):
    """Register ``minisearch``."""
    register(MiniSearch())
