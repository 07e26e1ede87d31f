"""The documentation against the code: runnable blocks run, signature blocks show the defaults, every public name
is on the API page, the benchmark block is what bench/report.py renders, the benchmarks page stays short and every
file in bench/results is cited, every C++ unit is in the source map.

The blocks are those of docs/*.md and the README (tests/_doc_blocks.py: a block is marked by a ``<!-- runnable -->``
or ``<!-- signature -->`` line just above its fence).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import tempfile

import npyfeed
import numpy as np
import pytest
from _doc_blocks import DATA_SETS, DOCS, ROOT, blocks, prelude

HAVE_TF = importlib.util.find_spec("tensorflow") is not None
RUNNABLE = [b for b in blocks() if "runnable" in b.markers]
SIGNATURE_BLOCKS = [b for b in blocks() if "signature" in b.markers]
API = DOCS / "api.rst"


def _keras_backend(code: str) -> str | None:
    backend = re.search(r"KERAS_BACKEND\"\] = \"(\w+)\"", code)
    return backend.group(1) if backend else None


def _needs_tf(code: str) -> bool:
    imports = re.search(r"^\s*(import tensorflow|import npyfeed.tf|import npyfeed, npyfeed.tf)", code, re.M)
    return bool(imports) or _keras_backend(code) == "tensorflow"


def _frameworks(code: str) -> set:
    """The frameworks other than TensorFlow a block imports (npyfeed's adapters count as theirs), and the Keras
    backend it chooses."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    found = {n.split(".")[0] for n in names} | {n.split(".")[1] for n in names if n.startswith("npyfeed.")}
    if _keras_backend(code) not in (None, "tensorflow"):
        found.add(_keras_backend(code))
    return found & {"keras", "torch", "torchdata", "jax"}


def _missing_framework(code: str) -> str | None:
    for name in sorted(_frameworks(code)):
        if importlib.util.find_spec(name) is None:
            return f"{name} is not installed"
        if name == "keras" and int(importlib.metadata.version("keras").split(".")[0]) < 3:
            return "the block needs Keras 3"
    return None


def test_the_markers_are_on_python_blocks():
    assert len(RUNNABLE) >= 8 and len(SIGNATURE_BLOCKS) >= 4
    for block in RUNNABLE + SIGNATURE_BLOCKS:
        assert block.language == "python", f"{block.id}: a marked block must be a python block"
        ast.parse(block.code)


@pytest.mark.parametrize("data_set", DATA_SETS)
@pytest.mark.parametrize("block", [pytest.param(b, id=b.id, marks=[pytest.mark.slow]
                                                if _needs_tf(b.code) or _frameworks(b.code) else [])
                                   for b in RUNNABLE])
def test_runnable_block_runs_as_shown(block, data_set, tmp_path):
    """Each block runs after a prelude that defines only `factor_dir`, `label_dir` and `index_files`, on data sets
    whose keys, shapes (1-d label files too) and index files differ: a block runs on any data set."""
    if _needs_tf(block.code) and not HAVE_TF:
        pytest.skip("TensorFlow is not installed")
    missing = _missing_framework(block.code)
    if missing:
        pytest.skip(missing)
    # The index cache, warm's lock file and the prelude's data set (tempfile) all live in the test's own folder.
    env = dict(os.environ, NPYFEED_CACHE_DIR=str(tmp_path / "cache"), TMPDIR=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("KERAS_BACKEND", None)  # a block that needs a backend chooses it
    proc = subprocess.run([sys.executable, "-c", prelude(data_set) + block.code], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"{block.id} on {data_set}\n{proc.stdout}{proc.stderr[-4000:]}"
    losses = [float(line.split()[-1]) for line in proc.stdout.splitlines() if line.startswith("epoch ")]
    if "for epoch in range(2)" in block.code or "range(EPOCHS)" in block.code:  # the loops print a loss per epoch
        assert len(losses) == 2 and all(np.isfinite(losses)), proc.stdout


def test_the_doc_data_sets_differ_where_examples_could_assume(tmp_path, monkeypatch):
    """What the runnable blocks must not assume differs between the data sets: keys, F, label shape (1-d label
    files among them), one index file or several."""
    specs = list(DATA_SETS.values())
    for field in ("keys", "features", "labels", "index_files"):
        values = [spec[field] for spec in specs]
        assert len(set(values)) == len(values), field
    assert () in [spec["labels"] for spec in specs]
    assert not {"a", "b"} & {k for spec in specs for k in spec["keys"]}  # none of the old fixture's keys
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ns = {}
    exec(prelude("1d-labels"), ns)
    assert sorted(k for k in ns if not k.startswith("__")) == ["factor_dir", "index_files", "label_dir"]
    src = npyfeed.WindowSource(ns["index_files"], ns["factor_dir"], ns["label_dir"], window=100, cache=False)
    assert src.x_shape == (100, 5) and src.y_shape == ()
    x, y = src.get([0])
    key = src.keys[0]
    np.testing.assert_array_equal(y[0], np.load(os.path.join(ns["label_dir"], key + ".npy"))[99])
    np.testing.assert_array_equal(x[0], np.load(os.path.join(ns["factor_dir"], key + ".npy"))[0:100])


# The calls the signature blocks present as signatures.
SIGNATURES = {
    "npyfeed.load_many": npyfeed.load_many,
    "npyfeed.load_factor_files": npyfeed.load_factor_files,
    "npyfeed.WindowSource": npyfeed.WindowSource,
    "npyfeed.warm": npyfeed.warm,
}


@pytest.mark.parametrize("name", list(SIGNATURES))
def test_signature_blocks_show_the_defaults(name):
    calls = [node for b in SIGNATURE_BLOCKS for node in ast.walk(ast.parse(b.code))
             if isinstance(node, ast.Call) and ast.unparse(node.func) == name]
    assert calls, f"no signature block shows {name}(...)"
    parameters = inspect.signature(SIGNATURES[name]).parameters
    checked = 0
    for call in calls:
        for keyword in call.keywords:
            assert keyword.arg in parameters, f"docs: {name}(..., {keyword.arg}=...) is not a parameter"
            default = parameters[keyword.arg].default
            if default is inspect.Parameter.empty:
                continue  # a required argument, given an example value
            try:
                shown = ast.literal_eval(keyword.value)
            except ValueError:
                continue  # a variable
            assert shown == default, f"docs: {name}(..., {keyword.arg}={shown!r}); the code's default is {default!r}"
            checked += 1
    assert checked > 0


def _documented() -> set:
    """The names the API page documents with an autodoc directive."""
    return set(re.findall(r"^\.\. auto\w+:: (npyfeed\.[\w.]+)", API.read_text(encoding="utf-8"), re.M))


@pytest.mark.parametrize("name", npyfeed.__all__)
def test_every_public_name_is_on_the_api_page(name):
    assert f"npyfeed.{name}" in _documented(), f"docs/api.rst documents no npyfeed.{name}: add an autodoc directive"


def test_the_tf_adapter_is_on_the_api_page():
    assert "npyfeed.tf.dataset" in _documented()


def test_the_framework_adapters_are_on_the_api_page():
    assert {"npyfeed.keras.PyDataset", "npyfeed.torch.WindowDataset"} <= _documented()


def _adapter_class(module: str, name: str):
    """An adapter's class, or a skip where its framework is missing."""
    if module == "keras" and int(importlib.metadata.version("keras").split(".")[0] if
                                 importlib.util.find_spec("keras") else 0) < 3:
        pytest.skip("npyfeed.keras needs Keras 3")
    pytest.importorskip(module)
    return getattr(importlib.import_module(f"npyfeed.{module}"), name)


@pytest.mark.parametrize("cls", [npyfeed.WindowSource, npyfeed.BatchIterator, npyfeed.Plan, npyfeed.WarmReport,
                                 ("keras", "PyDataset"), ("torch", "WindowDataset")],
                         ids=lambda c: c.__name__ if isinstance(c, type) else ".".join(c))
def test_public_methods_and_properties_are_on_the_api_page(cls):
    if not isinstance(cls, type):
        cls = _adapter_class(*cls)
    text = API.read_text(encoding="utf-8")
    qualified = cls.__module__ + "." + cls.__name__ if cls.__module__ in ("npyfeed.keras", "npyfeed.torch") \
        else "npyfeed." + cls.__name__
    directive = re.search(rf"^\.\. autoclass:: {re.escape(qualified)}\n((?:   .*\n|\s*\n)*)", text, re.M)
    assert directive, f"docs/api.rst has no autoclass for {qualified}"
    members = set(re.findall(r"\w+", " ".join(re.findall(r":members:(.*(?:\n {13,}.*)*)", directive.group(1)))))
    public = {name for name, value in vars(cls).items() if not name.startswith("_")
              and (isinstance(value, (property, classmethod, staticmethod)) or inspect.isfunction(value))}
    assert public, cls
    assert public <= members, f"{cls.__name__}: {sorted(public - members)} missing from :members: in docs/api.rst"
    for name in public:
        doc = inspect.getdoc(getattr(cls, name))
        assert doc, f"{cls.__name__}.{name} has no docstring (autodoc would leave it out)"


def test_the_benchmark_pages_are_rendered_from_the_committed_results():
    """The benchmarks page's block and the README's headline are exactly what bench/report.py renders from
    bench/results/*.json, and the figures they show are committed."""
    for page in ("docs/benchmarks.md", "README.md"):
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), "--check", str(ROOT / page)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    block = (DOCS / "benchmarks.md").read_text(encoding="utf-8").split("<!-- bench:begin")[1].split("<!-- bench:end")[0]
    assert "**Window batches**" in block and "**Whole files**" in block and "| met |" in block
    assert "MISSED" not in block
    tracked = subprocess.run(["git", "ls-files", "bench/results"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    for figure in ("windows.svg", "stream.svg", "node.svg"):
        assert f"bench/results/{figure}" in tracked.stdout.split(), f"bench/results/{figure} is not committed"
        assert f"../bench/results/{figure}" in (DOCS / "benchmarks.md").read_text(encoding="utf-8")


RESULTS = ROOT / "bench" / "results"
BENCHMARKS_PAGE_MAX_LINES = 400


def _cites(text: str, name: str) -> bool:
    """Whether `text` names the result file `name` as a current file: bare (``"windows.json"``, as report.py does)
    or under bench/results/; a run in git's history (``git show REV:bench/results/NAME``) or a file of the same
    name elsewhere (``/tmp/NAME``) does not count."""
    for match in re.finditer(rf"(?<![\w.-]){re.escape(name)}(?![\w-]|\.\w)", text):
        before = text[max(0, match.start() - 40):match.start()]
        if before.endswith(":bench/results/") or (before.endswith("/") and not before.endswith("results/")):
            continue
        return True
    return False


def test_the_benchmarks_page_is_short():
    lines = (DOCS / "benchmarks.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= BENCHMARKS_PAGE_MAX_LINES, (
        f"docs/benchmarks.md has {len(lines)} lines, more than {BENCHMARKS_PAGE_MAX_LINES}: it is the page a user "
        "reads (what each benchmark measures, the current figures and limits, targets, how to reproduce); the "
        "story of a change belongs in its commit message")


def test_every_result_file_is_cited():
    """bench/results holds the current file of each benchmark: each is rendered by a script in bench/ or cited
    by docs/ or the README. A run no page cites belongs in git's history, not in the tree."""
    pages = [ROOT / "README.md", *DOCS.glob("*.md"), *DOCS.glob("*.rst"), *(ROOT / "bench").glob("*.py")]
    text = "\n".join(page.read_text(encoding="utf-8") for page in pages)
    files = sorted(path.name for path in RESULTS.iterdir())
    assert len(files) >= 4
    uncited = [name for name in files if not _cites(text, name)]
    assert not uncited, (f"bench/results/{uncited} cited nowhere (docs/, README.md, bench/*.py): cite it where "
                         "its figures are quoted, or git rm it (its history stays in git)")


def test_every_cited_result_file_is_there():
    for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
        for match in re.finditer(r"(?<![:\w])bench/results/([\w.-]+\.(?:json|svg))", page.read_text(encoding="utf-8")):
            assert (RESULTS / match.group(1)).is_file(), (
                f"{page.name} cites bench/results/{match.group(1)}, which is not there; a run in git's history is "
                f"cited as `git show REV:bench/results/{match.group(1)}`")


def test_report_renders_the_figures(tmp_path):
    pytest.importorskip("matplotlib")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "report.py"), "--figures", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for figure in ("windows.svg", "stream.svg", "node.svg"):
        svg = (tmp_path / figure).read_text(encoding="utf-8")
        assert svg.lstrip().startswith("<?xml") and "</svg>" in svg
        assert len(svg) < 200_000  # small enough to commit


def test_every_cpp_unit_is_in_the_source_map():
    page = (DOCS / "development.md").read_text(encoding="utf-8")
    headers = sorted((ROOT / "csrc" / "npyfeed").rglob("*.h*"))
    assert len(headers) > 20
    for header in headers:
        unit = header.relative_to(ROOT / "csrc" / "npyfeed").with_suffix("").as_posix()
        assert f"| `{unit}` |" in page, f"docs/development.md's source map has no row for {unit}"


def test_no_process_words_in_readme_or_docs():
    for page in [ROOT / "README.md", *DOCS.glob("*.md"), *DOCS.glob("*.rst")]:
        text = page.read_text(encoding="utf-8")
        assert "MISSED" not in text, page
        assert not re.search(r"\bissues? \d+|#\d{1,4}\b", text), page


def test_keras_blocks_choose_the_tensorflow_backend():
    """The users train with TensorFlow and may have no JAX: a block that sets KERAS_BACKEND sets TensorFlow's (and
    names the others in a comment)."""
    chosen = [_keras_backend(b.code) for b in RUNNABLE if _keras_backend(b.code)]
    assert chosen and set(chosen) == {"tensorflow"}, chosen
