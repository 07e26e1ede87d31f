"""The code blocks of the README and of docs/*.md, with the markers in the comment lines just above them.

A block's markers are the ``<!-- word -->`` lines directly above its opening fence:

* ``<!-- runnable -->``: the block runs as shown, after `prelude(data_set)`, on each of `DATA_SETS`
  (tests/test_docs.py);
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
# folders and index files. A block sees only the three names the pages say stand for the reader's own
# (`factor_dir`, `label_dir`, `index_files`), and runs on each data set below: their key names, feature counts,
# label shapes and index files (one path or a list) differ, so a block that assumes any of them fails.
DATA_SETS = {
    # keys as exchange codes, F=6, labels (T, 3), one index file given as a path
    "2d-labels": dict(keys=("600000.SH", "000001.SZ", "300750.SZ"), rows=240, features=6, labels=(3,),
                      index_files=1),
    # F=5, 1-d label files (T,): scalar label rows, y_shape (); two index files given as a list
    "1d-labels": dict(keys=("k-01", "k_02"), rows=260, features=5, labels=(), index_files=2),
}


def prelude(data_set: str) -> str:
    """The code run before a block: makes `data_set` in a new temporary folder and defines only `factor_dir`,
    `label_dir` and `index_files`."""
    spec = DATA_SETS[data_set]
    return f"""
def _data_set(keys, rows, features, labels, index_files):
    import os, tempfile
    import numpy as np
    root = tempfile.mkdtemp()
    factor_dir, label_dir = os.path.join(root, "factor"), os.path.join(root, "label")
    os.makedirs(factor_dir), os.makedirs(label_dir)
    rng = np.random.default_rng(0)
    for k in keys:
        np.save(os.path.join(factor_dir, k + ".npy"), rng.standard_normal((rows, features)).astype(np.float32))
        np.save(os.path.join(label_dir, k + ".npy"), rng.standard_normal((rows, *labels)).astype(np.float32))
    paths = [os.path.join(root, f"index-{{i}}.txt") for i in range(index_files)]
    for i, path in enumerate(paths):  # the keys split between the files, windows of W=100 rows
        with open(path, "w") as f:
            f.writelines(f"{{r}},{{r}},{{k}}\\n" for k in keys[i::index_files] for r in range(99, rows, 3))
    return factor_dir, label_dir, paths[0] if index_files == 1 else paths


factor_dir, label_dir, index_files = _data_set(**{spec!r})
del _data_set
"""
