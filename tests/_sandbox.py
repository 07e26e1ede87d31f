"""Child interpreters in conditions the test process cannot put itself in: on a ramfs (which refuses O_DIRECT
on every kernel, unlike tmpfs since Linux 6.6) and as an unprivileged user (root reads a chmod 000 file).

Each runs `script` in a fresh interpreter with this directory on ``sys.path`` (so a script can import helpers
from the test modules) and returns the finished process; a child that cannot set itself up exits with
`SKIP_STATUS` and says why, which the caller turns into a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

SKIP_STATUS = 77
NOBODY = 65534

_PRELUDE = textwrap.dedent(f"""
    import os, sys
    sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
""")

# Mounts a ramfs on argv[1] (in the private mount namespace unshare(1) made) and checks that it refuses
# O_DIRECT, so that the script after it really takes the fallback path.
_RAMFS = textwrap.dedent(f"""
    import ctypes, errno
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"none", sys.argv[1].encode(), b"ramfs", 0, None) != 0:
        print("cannot mount ramfs:", os.strerror(ctypes.get_errno()))
        sys.exit({SKIP_STATUS})
    _probe = os.path.join(sys.argv[1], "o_direct_probe")
    open(_probe, "wb").close()
    try:
        os.close(os.open(_probe, os.O_RDONLY | os.O_DIRECT))
        print("this ramfs accepts O_DIRECT")
        sys.exit({SKIP_STATUS})
    except OSError as e:
        assert e.errno == errno.EINVAL, e
    os.unlink(_probe)
""")

# Drops root for good (after the imports above it, which may need root's view of the file system).
_UNPRIVILEGED = textwrap.dedent(f"""
    if os.geteuid() == 0:
        try:
            os.setgroups([])
            os.setgid({NOBODY})
            os.setuid({NOBODY})
        except OSError as e:
            print("cannot drop root:", e)
            sys.exit({SKIP_STATUS})
    assert os.geteuid() != 0 and os.getuid() != 0
""")


def _finish(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    if proc.returncode == SKIP_STATUS:
        pytest.skip(proc.stdout.strip() or proc.stderr.strip())
    return proc


def run_on_ramfs(script: str, mountpoint, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `script` with a fresh ramfs mounted on `mountpoint` (an empty directory), which is ``sys.argv[1]``;
    `args` follow it. Needs unshare(1) and unprivileged user namespaces (or root)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    code = _PRELUDE + _RAMFS + textwrap.dedent(script)
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", sys.executable, "-c", code,
                           str(mountpoint), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 and proc.stderr.startswith("unshare:"):
        pytest.skip(f"cannot make a mount namespace here: {proc.stderr.strip()}")
    return _finish(proc)


def run_unprivileged(script: str, *args, imports: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `imports`, then `script` as user `nobody` when this process is root (else as this user); `args` are
    ``sys.argv[1:]``. Files the script uses must be reachable by that user (see `shared_dir`)."""
    code = _PRELUDE + textwrap.dedent(imports) + _UNPRIVILEGED + textwrap.dedent(script)
    proc = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    return _finish(proc)


@contextlib.contextmanager
def shared_dir():
    """A fresh directory that an unprivileged child can enter, removed afterwards (pytest's ``tmp_path`` lies
    under a 0700 directory, whose mode pytest restores if anyone widens it)."""
    path = Path(tempfile.mkdtemp(prefix="npyfeed-test-"))
    try:
        os.chmod(path, 0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
