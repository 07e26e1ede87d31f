"""The README is the front door: at most 200 lines, the two commands exactly as the fresh-check tool and
.ci/run expect them, a committed figure, links that lead somewhere. Its runnable examples and its generated
headline are checked with the documentation's (tests/test_docs.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# The two commands, as a new user types them (the fresh-check tool runs exactly these).
DEMO = "python3 -m pip install '.[tf]' && python3 -m npyfeed demo"
TESTS = "bash .ci/run"


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md has {lines} lines; the manual belongs in docs/"


def test_readme_shows_the_two_commands():
    text = README.read_text(encoding="utf-8")
    section = re.search(r"^## The two commands\n(.*?)^## ", text, re.S | re.M).group(1)
    commands = [line for block in re.findall(r"```bash\n(.*?)```", section, re.S) for line in block.splitlines()
                if line and not line.startswith("#")]
    assert commands == [DEMO, TESTS]
    assert (ROOT / ".ci" / "run").is_file()


def test_readme_shows_a_committed_figure():
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", README.read_text(encoding="utf-8"))
    assert len(images) == 1, images
    tracked = subprocess.run(["git", "ls-files", images[0]], cwd=ROOT, capture_output=True, text=True)
    assert (ROOT / images[0]).is_file() and (tracked.returncode != 0 or tracked.stdout.strip() == images[0])


def test_readme_links_lead_somewhere():
    links = [link for link in re.findall(r"\]\(([^)#]+)[^)]*\)", README.read_text(encoding="utf-8"))
             if "://" not in link]
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        assert (ROOT / link).exists(), f"README links to {link}, which does not exist"
