"""The framework adapters are loaded on first use: ``import npyfeed`` imports no framework; each adapter imports
its own, and a missing framework is an ImportError naming the extra to install. The JAX recipe (docs/frameworks.md):
plan batches placed with a sharding over the devices are the numpy iterator's."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import npyfeed
import numpy as np
import pytest

FRAMEWORKS = ("tensorflow", "keras", "torch", "jax")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_import_npyfeed_imports_no_framework():
    proc = _run(f"""
        import sys
        import npyfeed
        npyfeed.WindowSource, npyfeed.Plan, npyfeed.warm
        loaded = sorted(m for m in {FRAMEWORKS!r} if m in sys.modules)
        assert not loaded, loaded
        print("OK")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stdout + proc.stderr


@pytest.mark.parametrize("adapter, framework, extra", [("keras", "keras", "npyfeed[keras]"),
                                                       ("torch", "torch", "npyfeed[torch]")])
def test_a_missing_framework_names_the_extra(adapter, framework, extra):
    proc = _run(f"""
        import sys
        sys.modules[{framework!r}] = None  # as if it were not installed
        import npyfeed
        try:
            npyfeed.{adapter}
        except ImportError as e:
            print(e)
        else:
            raise SystemExit("no ImportError")
    """)
    assert proc.returncode == 0 and extra in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("adapter, framework", [("keras", "keras"), ("torch", "torch")])
def test_each_adapter_imports_its_framework_on_first_use(adapter, framework):
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    if framework == "keras" and int(importlib.metadata.version("keras").split(".")[0]) < 3:
        pytest.skip("Keras 2: npyfeed.keras needs Keras 3")
    proc = _run(f"""
        import sys
        import npyfeed
        assert {framework!r} not in sys.modules
        module = npyfeed.{adapter}
        assert module.__name__ == "npyfeed.{adapter}" and {framework!r} in sys.modules
        print("OK")
    """)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr


def test_jax_recipe_places_the_plans_batches():
    jax = pytest.importorskip("jax", reason="JAX is not installed (pip install 'npyfeed[jax]')")
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    rng = np.random.default_rng(3)
    factors = {k: rng.standard_normal((30, 3)).astype(np.float32) for k in "abc"}
    labels = {k: rng.standard_normal((30, 2)).astype(np.float32) for k in "abc"}
    index = [(int(r), int(r), k) for k in "abc" for r in rng.integers(3, 30, 12)]
    src = npyfeed.WindowSource.from_arrays(index, factors, labels, 4)
    devices = np.array(jax.devices())
    sharding = NamedSharding(Mesh(devices, ("batch",)), PartitionSpec("batch"))  # split the batch over devices
    batch = 4 * len(devices)
    for shuffle in (False, True, "blocks"):
        plan = src.plan(batch, shuffle=shuffle, seed=1, drop_remainder=True, memory_budget=1000)
        for epoch in (0, 1):
            expected = list(src.batches(batch, shuffle=shuffle, seed=1, epoch=epoch, drop_remainder=True,
                                        memory_budget=1000))
            got = [jax.device_put(b, sharding) for b in plan.batches(epoch)]
            assert len(got) == len(expected) == len(plan)
            for (x, y), (ex, ey) in zip(got, expected):
                assert x.sharding == sharding
                np.testing.assert_array_equal(np.asarray(x), ex)
                np.testing.assert_array_equal(np.asarray(y), ey)
