"""membudget: a plugin-based benchmarking harness for GPU memory management in DNN training.

The import package is ``harness``; see docs/architecture.md for the pipeline
(profile -> plan -> execute -> place -> results).
"""

from harness.hookspecs import hookimpl
from harness.model import (
    Algorithm, MemoryBlock, Op, Placement, Profile, Run, Schedule, Stage, TimelineEvent, Transfer,
)
from harness.protocols import Workload

__all__ = [
    "Algorithm", "MemoryBlock", "Op", "Placement", "Profile", "Run", "Schedule", "Stage",
    "TimelineEvent", "Transfer", "Workload", "hookimpl",
]
__version__ = "0.1.0"
