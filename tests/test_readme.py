"""The README against the code: every keyword argument its API section writes with a literal value, for a
parameter that has a default, shows that default (a user copying the line gets the documented behaviour); the
Multi-GPU section's snippet runs as shown (over a small data set standing in for the user's files)."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import npyfeed
import numpy as np
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"

# The calls the API section presents as signatures (elsewhere calls are examples with chosen values).
SIGNATURES = {
    "npyfeed.load_many": npyfeed.load_many,
    "npyfeed.load_factor_files": npyfeed.load_factor_files,
    "npyfeed.WindowSource": npyfeed.WindowSource,
    "npyfeed.warm": npyfeed.warm,
}


def _api_blocks() -> list:
    """The python code blocks of the README's "## API" section, parsed."""
    text = README.read_text(encoding="utf-8")
    section = re.search(r"^## API\n(.*?)^## ", text, re.S | re.M).group(1)
    # Blocks inside a list item are indented.
    return [ast.parse(textwrap.dedent(block)) for block in re.findall(r"```python\n(.*?)```", section, re.S)]


def _calls(name: str) -> list:
    """The API section's calls of `name`, as ast.Call nodes."""
    return [node for tree in _api_blocks() for node in ast.walk(tree)
            if isinstance(node, ast.Call) and ast.unparse(node.func) == name]


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_readme_shows_the_defaults(name):
    calls = _calls(name)
    assert calls, f"the README no longer shows {name}(...)"
    parameters = inspect.signature(SIGNATURES[name]).parameters
    checked = 0
    for call in calls:
        for keyword in call.keywords:
            assert keyword.arg in parameters, f"README: {name}(..., {keyword.arg}=...) is not a parameter"
            default = parameters[keyword.arg].default
            if default is inspect.Parameter.empty:
                continue  # a required argument, given an example value
            try:
                shown = ast.literal_eval(keyword.value)
            except ValueError:
                continue  # a variable
            assert shown == default, f"README: {name}(..., {keyword.arg}={shown!r}); the code's default is {default!r}"
            checked += 1
    assert checked > 0


def test_the_benchmark_tables_are_rendered_from_the_committed_results():
    """The README's benchmark block is exactly what bench/report.py renders from bench/results/*.json, and it
    renders at least the window and whole-file runs (so its figures are those files', not typed by hand)."""
    bench = README.parent / "bench"
    proc = subprocess.run([sys.executable, str(bench / "report.py"), "--check", str(README)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (bench / "results" / "windows.json").is_file() and (bench / "results" / "load.json").is_file()
    block = README.read_text(encoding="utf-8").split("<!-- bench:begin")[1].split("<!-- bench:end")[0]
    assert "**Window batches**" in block and "**Whole files**" in block and "| met |" in block
# ----------------------------------------------------------------------------------------------------------
# Snippets that run as shown


def _section_blocks(title: str) -> list:
    """The python code blocks of the README section `title` (a "## " heading), as text."""
    text = README.read_text(encoding="utf-8")
    section = re.search(rf"^## {re.escape(title)}\n(.*?)^## ", text, re.S | re.M).group(1)
    return re.findall(r"```python\n(.*?)```", section, re.S)


# What the snippets take from the sections before them: a small data set in the users' layout.
_DATA = """
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


@pytest.mark.slow
def test_multi_gpu_snippet_runs_as_shown():
    pytest.importorskip("tensorflow")
    # The section's first snippet trains; the loader-placement recipe after it needs a node's cores and RANK
    # (test_placement.py checks what it relies on).
    blocks = [b for b in _section_blocks("Multi-GPU and several machines") if "MirroredStrategy" in b]
    assert len(blocks) == 1
    proc = subprocess.run([sys.executable, "-c", _DATA + blocks[0]], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    losses = [float(line.split()[-1]) for line in proc.stdout.splitlines() if line.startswith("epoch ")]
    assert len(losses) == 2 and all(np.isfinite(losses)), proc.stdout
