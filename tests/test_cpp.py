"""The C++ tests (tests/cpp) and the fuzzers (tests/fuzz: the header parser, the .npz zip container), built with CMake and run from pytest.

Each build is the core and its C++ tests without Python (NPYFEED_BUILD_PYTHON=OFF), in its own temporary
directory, with Ninja and two jobs: plain, ASan+UBSan and TSan (g++), then ctest. The fuzz test builds the
libFuzzer target with clang and fuzzes for a fixed 30 seconds (tests/fuzz/run_fuzz.sh); it is skipped when
clang++ or its libFuzzer runtime is missing. Minutes in all: deselect with ``-m "not slow"``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FUZZ_SECONDS = 30
HANG_GUARD_S = 1500  # a build or test run still going after this is stuck, not slow

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the C++ tests and sanitizer builds are Linux"),
]

BUILDS = {"plain": "", "asan-ubsan": "address,undefined", "tsan": "thread"}


def _require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} not found")
    return path


def _run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=HANG_GUARD_S, **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-20000:]}\n{proc.stderr[-20000:]}"
    return proc


@pytest.mark.parametrize("name", BUILDS)
def test_cpp_unit_tests(name, tmp_path):
    cmake = _require("cmake")
    ctest = _require("ctest")
    build = tmp_path  # 0.3-0.6 GB: removed when the test passes (tmp_path_retention_policy)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    # The sanitizer runtimes the CMake options ask for are g++'s (libasan, libubsan, libtsan).
    compiler = [f"-DCMAKE_CXX_COMPILER={shutil.which('g++')}"] if shutil.which("g++") else []
    # Sanitizer builds at -O1 with assertions on: half the compile time of -O3, the findings just as well.
    build_type = ["-DCMAKE_BUILD_TYPE=Debug", "-DCMAKE_CXX_FLAGS=-O1"] if BUILDS[name] else []
    _run([cmake, "-S", ROOT, "-B", build, *generator, *compiler, *build_type, "-DNPYFEED_BUILD_PYTHON=OFF",
          "-DNPYFEED_BUILD_TESTS=ON", f"-DNPYFEED_SANITIZE={BUILDS[name]}"])
    _run([cmake, "--build", build, "-j2"])
    proc = _run([ctest, "--test-dir", build, "--output-on-failure", "--timeout", "600"])
    assert "100% tests passed" in proc.stdout, proc.stdout


def test_cpp_without_zlib(tmp_path):
    """-DNPYFEED_WITH_ZLIB=OFF (what a machine without zlib's headers gets): the core still builds, with a CMake
    warning, and a deflated .npz member raises a clear NpyFormatError (test_zip_archive checks the message)."""
    cmake = _require("cmake")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    proc = _run([cmake, "-S", ROOT, "-B", tmp_path, *generator, "-DNPYFEED_BUILD_PYTHON=OFF", "-DNPYFEED_BUILD_TESTS=ON",
                 "-DNPYFEED_WITH_ZLIB=OFF"])
    assert "building without zlib" in proc.stderr
    _run([cmake, "--build", tmp_path, "-j2", "--target", "test_zip_archive"])
    assert "NPYFEED_HAVE_ZLIB" not in (tmp_path / "build.ninja").read_text() if generator else True
    out = _run([tmp_path / "tests" / "cpp" / "test_zip_archive", "zlib"])
    assert "1 passed, 0 failed" in out.stdout + out.stderr


def test_cpp_without_liburing(tmp_path):
    """-DNPYFEED_WITH_LIBURING=OFF (what a machine without liburing's headers gets): the core builds without io_uring
    and every queued read is a blocking pread (test_read_queue on that path alone)."""
    cmake = _require("cmake")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    proc = _run([cmake, "-S", ROOT, "-B", tmp_path, *generator, "-DNPYFEED_BUILD_PYTHON=OFF", "-DNPYFEED_BUILD_TESTS=ON",
                 "-DNPYFEED_WITH_LIBURING=OFF"])
    assert "building without liburing" in proc.stdout + proc.stderr
    _run([cmake, "--build", tmp_path, "-j2", "--target", "test_read_queue"])
    assert "NPYFEED_HAVE_LIBURING" not in (tmp_path / "build.ninja").read_text() if generator else True
    out = _run([tmp_path / "tests" / "cpp" / "test_read_queue"])
    assert "io_uring_enabled() = 0" in out.stderr
    assert "5 passed, 0 failed" in out.stdout + out.stderr


def _has_libfuzzer(clang: str, tmp_path: Path) -> bool:
    probe = tmp_path / "probe.cpp"
    probe.write_text('extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n')
    proc = subprocess.run([clang, "-fsanitize=fuzzer,address,undefined", str(probe), "-o", str(tmp_path / "probe")],
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    return proc.returncode == 0


def test_fuzz_header_parser(tmp_path):
    _fuzz(tmp_path, "fuzz_npy_header")


def test_fuzz_zip_archive(tmp_path):
    """The .npz container (zip directory, inflate, CRC), seeded with the hostile archive corpus."""
    _fuzz(tmp_path, "fuzz_zip_archive")


def _fuzz(tmp_path, target: str) -> None:
    clang = shutil.which("clang++")
    if clang is None:
        pytest.skip("clang++ not installed (Debian: apt-get install clang libclang-rt-14-dev)")
    if not _has_libfuzzer(clang, tmp_path):
        pytest.skip("clang++ cannot link -fsanitize=fuzzer: libFuzzer's runtime is missing (Debian: libclang-rt-14-dev)")
    _require("cmake")
    env = dict(os.environ, CXX=clang, NPYFEED_FUZZ_BUILD=str(tmp_path / "build"), NPYFEED_FUZZ_JOBS="2")
    # run_fuzz.sh runs `python3` for the seeds: this interpreter's directory first, so it finds numpy.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = _run(["bash", ROOT / "tests" / "fuzz" / "run_fuzz.sh", str(FUZZ_SECONDS), target], env=env)
    summary = [line for line in proc.stdout.splitlines() if line.startswith("fuzz:")]
    assert summary and "findings 0" in summary[-1], proc.stdout
    print("\n".join(summary))
