"""Built-in allocators: place the blocks of a memory trace in one arena.

- ``caching``: a model of PyTorch's CUDA caching allocator (:mod:`.caching`);
- ``first-fit`` and ``cnmem``: CNMEM-like free-list pools, first fit and CNMEM's own
  smallest-fit (:mod:`.first_fit`);
- ``greedy-by-size``: TFLite's offsets planned largest block first (:mod:`.greedy_by_size`);
- ``exact``: the optimum of papers/003's MIP by OR-Tools CP-SAT, an optional extra
  (:mod:`.exact`, imports OR-Tools only when it solves).

The profile-guided best-fit of papers/003 is the ``membudget-bestfit`` plugin
(``plugins/bestfit``). Traces, CSV files and max-live bytes are in :mod:`.trace`, the
placement validator in :mod:`.validate`, the options an allocator takes in :mod:`.options`;
``membudget place`` is ``harness.commands.place_command``.
"""

from __future__ import annotations


def register_builtin(register, find_allocator=None):
    """Register the built-in allocators; ``find_allocator`` (name -> allocator) lets ``exact`` take
    another allocator's placement as its hint."""
    from harness.allocators.caching import CachingAllocator
    from harness.allocators.exact import ExactAllocator
    from harness.allocators.first_fit import Cnmem, FirstFit
    from harness.allocators.greedy_by_size import GreedyBySize

    register(CachingAllocator())
    register(FirstFit())
    register(Cnmem())
    register(GreedyBySize())
    register(ExactAllocator(find_allocator=find_allocator))
