"""The ``file`` profiler: a profile read from JSON (``membudget profile ... -o p.json`` wrote it)."""

from __future__ import annotations

from pathlib import Path

from harness.model import ModelError, Profile, load
from harness.errors import ProfilingError
from harness.protocols import Workload


class FileProfiler:
    """Reads the profile JSON file named by ``workload.model`` (optionally prefixed ``file:``).

    When the workload asks for another batch size than the file's, the file's measured
    variant for that batch is used if it has one, else the profile is scaled
    (``Profile.at_batch``, which says so in its notes).
    """

    name = "file"
    description = "reads a profile JSON file (the workload's model names the path)"

    def profile(self, workload: Workload) -> Profile:
        """The profile stored at ``workload.model``, at ``workload.batch_size``."""
        path = Path(workload.model.removeprefix("file:"))
        if not path.is_file():
            raise ProfilingError(f"the file profiler reads a profile JSON file; {str(path)!r} is not a file")
        try:
            profile = load(Profile, path)
        except ModelError as exc:
            raise ProfilingError(str(exc)) from None
        return profile.at_batch(workload.batch_size) if workload.batch_size else profile
