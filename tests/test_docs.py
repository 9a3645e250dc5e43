"""The Markdown of the repository: relative links resolve inside it, cited papers are listed.

A clone has only what git tracks, so both checks read ``git ls-files``: every relative
link of every tracked ``*.md`` file (http(s), mailto and anchor-only links aside) must
name a file or folder of the repository, and every ``papers/NNN`` cited in a tracked file
must have its entry (a ``## papers/NNN`` heading) in docs/references.md.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = ROOT / "docs" / "references.md"

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
HTML_LINK = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"", re.I)
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.I)  # http:, https:, mailto:, ...
PAPER = re.compile(r"papers/(\d{3})")


def tracked(*patterns: str) -> list[Path]:
    """The files git tracks that match ``patterns`` (skips when this is not a git checkout)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(["git", "ls-files", "-z", "--", *patterns], cwd=ROOT, capture_output=True, check=True)
    return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def links(text: str) -> list[str]:
    """The link targets of a Markdown text, outside code blocks and code spans."""
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    return [m.group(1) for rx in (INLINE_LINK, REFERENCE_DEF, HTML_LINK) for m in rx.finditer(text)]


def broken_links(md: Path) -> list[str]:
    """The relative links of ``md`` that name nothing inside the repository."""
    problems = []
    for target in links(md.read_text(encoding="utf-8")):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        resolved = ((ROOT / path.lstrip("/")) if path.startswith("/") else (md.parent / path)).resolve()
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            problems.append(target)
    return problems


def test_the_link_finder_sees_links_and_skips_code() -> None:
    text = ('[a](docs/a.md) ![b](img/b.png "t") [c]: ../c.md\n[c]: ../c.md\n<a href="d.html">d</a>\n'
            "`[x](code.md)`\n```\n[y](block.md)\n```\n[e](https://example.org) [f](#anchor)")
    assert links(text) == ["docs/a.md", "img/b.png", "https://example.org", "#anchor", "../c.md", "d.html"]


def test_a_link_outside_the_repository_or_to_nothing_is_broken(tmp_path: Path) -> None:
    md = ROOT / "docs" / "architecture.md"
    assert broken_links(md) == []
    probe = tmp_path / "probe.md"
    probe.write_text("[shared](../shared/DESIGN.md) [gone](no-such-file.md)")
    assert len(broken_links(probe)) == 2


def test_every_relative_link_of_the_tracked_markdown_resolves() -> None:
    files = tracked("*.md")
    assert ROOT / "README.md" in files
    broken = {str(md.relative_to(ROOT)): bad for md in files if (bad := broken_links(md))}
    assert not broken, broken


def test_every_cited_paper_is_in_the_references() -> None:
    listed = set(re.findall(r"^## papers/(\d{3})\s*$", REFERENCES.read_text(encoding="utf-8"), re.M))
    cited: dict[str, str] = {}
    for path in tracked():
        if path == REFERENCES or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary (plots)
        for number in PAPER.findall(text):
            cited.setdefault(number, str(path.relative_to(ROOT)))
    assert cited, "the code cites papers/NNN; finding none means the scan is broken"
    missing = {f"papers/{n}": where for n, where in cited.items() if n not in listed}
    assert not missing, f"cited but not in docs/references.md: {missing}"
