"""A published page, written as Markdown and as XHTML from the same calls."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Sequence


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
td.bad { color: #a00; }
img { max-width: 100%; border: 1px solid #eee; }
code { background: #f4f4f4; padding: 0 0.2em; }
.small { color: #666; font-size: 0.85em; }
"""


class Doc:
    """A page written twice, as Markdown and as XHTML, from the same calls."""

    def __init__(self, title: str):
        self.title = title
        self.md: list[str] = [f"# {title}", ""]
        self.html: list[str] = [f"<h1>{html.escape(title)}</h1>"]

    def heading(self, text: str, level: int = 2) -> None:
        """A section heading."""
        self.md += [f"{'#' * level} {text}", ""]
        self.html.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def para(self, text: str, small: bool = False) -> None:
        """A paragraph of plain text."""
        self.md += [text, ""]
        cls = ' class="small"' if small else ""
        self.html.append(f"<p{cls}>{html.escape(text)}</p>")

    def link_para(self, before: str, label: str, href: str, after: str = "", small: bool = False) -> None:
        """A paragraph of plain text with one link in it."""
        self.md += [f"{before}[{label}]({href}){after}", ""]
        cls = ' class="small"' if small else ""
        self.html.append(f'<p{cls}>{html.escape(before)}<a href="{html.escape(href)}">{html.escape(label)}</a>'
                         f"{html.escape(after)}</p>")

    def markdown(self, text: str) -> None:
        """A passage written in Markdown by a person (a run's notes): as it is on the Markdown page, rendered
        on the HTML one."""
        import markdown

        self.md += [text, ""]
        self.html.append(markdown.markdown(text, extensions=["tables"], output_format="xhtml"))

    def link_list(self, items: Sequence[tuple[str, str]]) -> None:
        """A bulleted list of (text, href) links."""
        self.md += [f"- [{text}]({href})" for text, href in items] + [""]
        lis = "".join(f'<li><a href="{html.escape(href)}">{html.escape(text)}</a></li>' for text, href in items)
        self.html.append(f"<ul>{lis}</ul>")

    def image(self, src: str, alt: str) -> None:
        """An image (a plot file beside the page)."""
        self.md += [f"![{alt}]({src})", ""]
        self.html.append(f'<p><img src="{html.escape(src)}" alt="{html.escape(alt)}"/></p>')

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]],
              bad: set[tuple[int, int]] = frozenset()) -> None:
        """A table; ``bad`` marks cells (row, column) to show as failures."""
        def md_cell(v: Any) -> str:
            return str(v).replace("|", "\\|").replace("\n", " ")

        self.md.append("| " + " | ".join(md_cell(h) for h in headers) + " |")
        self.md.append("|" + "|".join(" --- " for _ in headers) + "|")
        self.md += ["| " + " | ".join(md_cell(v) for v in row) + " |" for row in rows]
        self.md.append("")
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
        body = []
        for i, row in enumerate(rows):
            cells = "".join(
                ('<td class="bad">' if (i, j) in bad else "<td>") + f"{html.escape(str(v))}</td>"
                for j, v in enumerate(row)
            )
            body.append(f"<tr>{cells}</tr>")
        self.html.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")

    def write(self, folder: Path, stem: str = "index") -> list[Path]:
        """Write ``stem.md`` and ``stem.html`` into ``folder``."""
        md, page = folder / f"{stem}.md", folder / f"{stem}.html"
        md.write_text("\n".join(self.md).rstrip() + "\n", encoding="utf-8")
        page.write_text(
            "<!DOCTYPE html>\n"
            '<html xmlns="http://www.w3.org/1999/xhtml" lang="en">\n'
            f'<head><meta charset="utf-8"/><title>{html.escape(self.title)}</title>'
            f"<style>{_CSS}</style></head>\n<body>\n" + "\n".join(self.html) + "\n</body>\n</html>\n",
            encoding="utf-8",
        )
        return [md, page]
