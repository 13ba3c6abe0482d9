"""Each benchmark's section of docs/benchmarks.md: the text between its own two markers."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def write_section(name: str, text: str, title: str | None = None,
                  path: Path = BENCHMARKS_MD) -> None:
    """Replace the text between `<!-- name:start -->` and `<!-- name:end -->`, leaving the rest
    of the page; a page without the markers gets them appended (under `title` when given)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    page = path.read_text()
    if start not in page:
        page += (f"\n{title}\n" if title else "") + f"\n{start}\n{end}\n"
    head, rest = page.split(start, 1)
    tail = rest.split(end, 1)[1]
    path.write_text(f"{head}{start}\n{text}\n{end}{tail}")
