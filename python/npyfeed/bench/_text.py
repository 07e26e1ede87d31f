"""How `npyfeed.bench` writes figures in text: bytes, optional numbers, wrapped lines."""

from __future__ import annotations

import textwrap


def _bytes(n) -> str:
    if n is None:
        return "unknown"
    if n >= 1e8:
        return f"{n / 1e9:,.2f} GB"
    return f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} kB" if n >= 1e3 else f"{n:,.0f} bytes"


def _fmt(value, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _wrap(line: str, width: int | None, indent: int | None = None) -> str:
    """`line` wrapped to `width` columns (as it is with None), its continuation lines indented by `indent`
    (default: its own indent and two more)."""
    if width is None or len(line) <= width:
        return line
    own = len(line) - len(line.lstrip(" "))
    return "\n".join(textwrap.wrap(line, width, subsequent_indent=" " * (own + 2 if indent is None else indent),
                                   break_long_words=False, break_on_hyphens=False))
