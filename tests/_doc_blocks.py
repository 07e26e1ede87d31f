"""The code blocks of the README and of docs/*.md, with the markers in the comment lines just above them.

A block's markers are the ``<!-- word -->`` lines directly above its opening fence:

* ``<!-- runnable -->``: the block runs as shown (tests/test_docs.py runs it after `PRELUDE`);
* ``<!-- signature -->``: the block presents calls as signatures, so each keyword it writes with a literal
  value shows the code's default (tests/test_docs.py checks this).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
_MARKER = re.compile(r"^\s*<!-- (\w+) -->\s*$")


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    markers: frozenset
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(pages=PAGES) -> list:
    """Every fenced block of `pages`, in order."""
    out = []
    for page in pages:
        lines = page.read_text(encoding="utf-8").split("\n")
        i = 0
        while i < len(lines):
            m = _FENCE.match(lines[i])
            if not m or not m.group(2):
                i += 1
                continue
            indent, language, start = m.group(1), m.group(2), i
            markers, j = set(), i - 1
            while j >= 0 and _MARKER.match(lines[j]):
                markers.add(_MARKER.match(lines[j]).group(1))
                j -= 1
            i += 1
            body = []
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            code = textwrap.dedent("\n".join(body)) if indent else "\n".join(body)
            out.append(Block(page, start + 1, language, frozenset(markers), code + "\n"))
            i += 1
    return out


# What the runnable blocks take as given: a small data set in the users' layout, standing in for the reader's
# folders and index files.
PRELUDE = """
import os, sys, tempfile
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
root = tempfile.mkdtemp()
factor_dir, label_dir = os.path.join(root, "factor"), os.path.join(root, "label")
os.makedirs(factor_dir), os.makedirs(label_dir)
rng = np.random.default_rng(0)
for k in ("a", "b"):
    np.save(os.path.join(factor_dir, k + ".npy"), rng.standard_normal((300, 4)).astype(np.float32))
    np.save(os.path.join(label_dir, k + ".npy"), rng.standard_normal((300, 2)).astype(np.float32))
index_files = os.path.join(root, "index.txt")
with open(index_files, "w") as f:
    f.writelines(f"{r},{r},{k}\\n" for k in ("a", "b") for r in range(99, 300, 3))
"""
