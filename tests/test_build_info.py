"""`npyfeed.build_info()` and `npyfeed info` against what a test can see for itself.

The compiler named must be the one in the compiled module's ELF ``.comment`` section; the glibc target must be
no older than the newest glibc symbol version the module needs; io_uring "usable" must be what the kernel says
to an ``io_uring_setup`` system call made here (and no where NPYFEED_IO_URING=0 or the build has no liburing);
AVX2/AVX-512 "available" must be what ``/proc/cpuinfo`` lists, and "used" must follow ``NPYFEED_AVX512``.

With ``NPYFEED_EXPECT_WHEEL=1`` (the wheel leg of .ci/run) the installed npyfeed must also be a prebuilt wheel:
installed into site-packages from a manylinux wheel, built by the cross toolchain for glibc 2.28 with libc++,
liburing and zlib compiled in.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import struct
import subprocess
import sys
import sysconfig

import npyfeed
import numpy as np
import pytest
from npyfeed import _core

EXPECT_WHEEL = os.environ.get("NPYFEED_EXPECT_WHEEL") == "1"
GLIBC_VERSION = re.compile(rb"GLIBC_(\d+)\.(\d+)")


def _sections(path) -> dict[str, bytes]:
    """The named sections of a 64-bit little-endian ELF file."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, f"{path} is not a 64-bit little-endian ELF"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx]
    strtab = data[names[4]:names[4] + names[5]]
    out = {}
    for name, _type, _flags, _addr, offset, size in headers:
        key = strtab[name:strtab.index(b"\0", name)].decode()
        out[key] = data[offset:offset + size]
    return out


def _needed_glibc(path) -> tuple[int, int]:
    """The newest GLIBC_x.y version the library asks the dynamic linker for."""
    versions = [(int(a), int(b)) for a, b in GLIBC_VERSION.findall(_sections(path).get(".dynstr", b""))]
    return max(versions, default=(0, 0))


def _kernel_allows_io_uring() -> bool:
    """Whether this process may set up an io_uring: the io_uring_setup system call itself, without liburing."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed: no flags
    fd = libc.syscall(ctypes.c_long(425), ctypes.c_uint(4), params)  # __NR_io_uring_setup on x86-64 and arm64
    if fd < 0:
        return False
    os.close(fd)
    return True


def _cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _info_in_subprocess(env_update: dict) -> dict:
    env = dict(os.environ, **env_update)
    out = subprocess.run([sys.executable, "-m", "npyfeed", "info", "--json"], capture_output=True, text=True,
                         env=env, timeout=120, check=True)
    return json.loads(out.stdout)


def test_versions_and_paths():
    info = npyfeed.build_info()
    assert info["version"] == npyfeed.__version__
    assert info["numpy"] == np.__version__
    assert info["python"] == ".".join(map(str, sys.version_info[:3]))
    assert os.path.samefile(info["module"], _core.__file__)


def test_compiler_is_the_one_in_the_module():
    info = npyfeed.build_info()
    name, version = info["compiler"].split(" ", 1)
    assert name in ("GCC", "Clang") and re.fullmatch(r"\d+\.\d+\.\d+", version), info["compiler"]
    assert version in info["compiler_version"]  # __VERSION__
    comment = _sections(info["module"]).get(".comment", b"").decode(errors="replace")
    # GCC writes "GCC: (Debian 12.2.0-14) 12.2.0", clang "clang version 22.1.8".
    assert version in comment and name.lower() in comment.lower(), (info["compiler"], comment)
    assert info["cxx_library"].split(" ")[0] in ("libstdc++", "libc++")


def test_glibc():
    info = npyfeed.build_info()
    assert "glibc " + info["glibc_runtime"] == os.confstr("CS_GNU_LIBC_VERSION")
    needed = _needed_glibc(info["module"])
    headers = tuple(map(int, info["glibc_headers"].split(".")))
    assert needed <= headers, f"the module needs GLIBC_{needed}, newer than the headers it was built with"
    if info["glibc_target"] != "system":
        assert info["glibc_target"] == info["glibc_headers"]
        assert info["toolchain"], "a glibc target other than the system's comes from a cross toolchain"


def test_io_uring_usable_is_what_the_kernel_says(monkeypatch):
    info = npyfeed.build_info()
    expected = info["io_uring_compiled"] and _kernel_allows_io_uring()
    monkeypatch.delenv("NPYFEED_IO_URING", raising=False)
    assert npyfeed.build_info()["io_uring_usable"] == expected
    monkeypatch.setenv("NPYFEED_IO_URING", "0")  # read at every call, as the readers read it
    assert npyfeed.build_info()["io_uring_usable"] is False


@pytest.mark.skipif(not _cpuinfo_flags(), reason="no /proc/cpuinfo flags to compare with")
def test_avx_available_is_what_the_cpu_lists():
    info = npyfeed.build_info()
    flags = _cpuinfo_flags()
    assert info["avx2_available"] == ("avx2" in flags)
    assert info["avx512_available"] == ("avx512f" in flags)
    if info["simd_kernels_compiled"]:
        assert info["avx2_used"] == info["avx2_available"]


def test_avx512_used_follows_the_cpu_and_the_switch():
    on = _info_in_subprocess({"NPYFEED_AVX512": "1"})
    off = _info_in_subprocess({"NPYFEED_AVX512": "0"})
    assert on["avx512_used"] == (on["simd_kernels_compiled"] and on["avx512_available"])
    assert off["avx512_used"] is False
    assert off["avx2_used"] == on["avx2_used"]


def test_tf_ops_is_reported_without_importing_tensorflow():
    code = ("import sys, npyfeed; info = npyfeed.build_info(); "
            "print(info['tf_ops'] or '', info['tf_ops_loadable'], 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    path, loadable, imported = out.stdout.split()
    assert path and os.path.isfile(path), "the op library is built and installed beside _core"
    assert (loadable, imported) == ("None", "False")


@pytest.mark.slow
def test_tf_ops_loads_in_tensorflow():
    pytest.importorskip("tensorflow")
    info = _info_in_subprocess_with_tf()
    assert info["tf_ops_loadable"] is True, info
    assert info["tensorflow"]


def _info_in_subprocess_with_tf() -> dict:
    out = subprocess.run([sys.executable, "-m", "npyfeed", "info", "--tf", "--json"], capture_output=True,
                         text=True, timeout=300, check=True)
    return json.loads(out.stdout)


def test_tf_ops_that_look_tensorflow_up_refuse_cleanly_without_it():
    """The wheels' op library names no TensorFlow library and looks its C functions up when loaded: loaded where
    TensorFlow is not, it must load, register nothing and say so (-2), never crash on a missing function."""
    path = npyfeed.build_info()["tf_ops"]
    if path is None:
        pytest.skip("the op library is not installed")
    if b"libtensorflow_framework.so.2" in _sections(path).get(".dynstr", b""):
        pytest.skip("this build links TensorFlow's framework by name (a source build)")
    code = ("import ctypes, sys; init = ctypes.CDLL(sys.argv[1]).npyfeed_tf_ops_init; "
            "init.argtypes, init.restype = [ctypes.c_void_p], ctypes.c_int; print(init(None))")
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "-2"


def test_cli_prints_every_key():
    out = subprocess.run([sys.executable, "-m", "npyfeed", "info"], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    keys = [line.split(":", 1)[0] for line in out.splitlines()]
    assert keys == list(npyfeed.build_info())
    assert re.search(r"^io_uring_usable: +(yes|no)$", out, re.M)


@pytest.mark.skipif(not EXPECT_WHEEL, reason="NPYFEED_EXPECT_WHEEL=1 (the wheel leg of .ci/run) checks a wheel")
def test_installed_from_the_prebuilt_wheel():
    info = npyfeed.build_info()
    site = os.path.realpath(sysconfig.get_paths()["platlib"])
    assert os.path.realpath(npyfeed.__file__).startswith(site + os.sep), npyfeed.__file__
    assert re.search(r"manylinux_2_(\d+)_x86_64", info["wheel_tag"] or ""), info["wheel_tag"]
    assert info["toolchain"].startswith("zig ")
    assert info["glibc_target"] == "2.28"
    assert _needed_glibc(info["module"]) <= (2, 28)
    assert _needed_glibc(info["tf_ops"]) <= (2, 28)
    assert info["cxx_library"].startswith("libc++")
    assert info["io_uring_compiled"] and info["zlib"] and info["simd_kernels_compiled"]
    assert b"libtensorflow_framework.so.2" not in _sections(info["tf_ops"])[".dynstr"]
    # Exceptions unwind with the system's libgcc_s, the unwinder pthread_exit() uses (a daemon thread at exit).
    assert b"libgcc_s.so.1" in _sections(info["module"])[".dynstr"]
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return
    with_tf = _info_in_subprocess_with_tf()
    assert with_tf["tf_ops_loadable"] is True, with_tf
