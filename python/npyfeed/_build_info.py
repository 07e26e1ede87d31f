"""`build_info`: what this installation of npyfeed was built with and what it can use on this machine."""

from __future__ import annotations

import os
import platform
from importlib.metadata import PackageNotFoundError, distribution, version

from . import _core

#: The op library of npyfeed.tf, beside _core (CMakeLists.txt installs both into the package).
_TF_OPS = "_tf_ops.so"

try:
    __version__ = version("npyfeed")  # the one place it is written is pyproject.toml; `npyfeed.__version__`
except PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"


def build_info(tf: bool = False) -> dict:
    """What this build of npyfeed holds and what it uses on this machine.

    The compiled part answers from its compile-time macros and the core's own run-time probes (the same ones that
    choose the read path and the vector kernels), so the answer is what the loads and gathers really do here.

    Parameters
    ----------
    tf : bool, default False
        Also import TensorFlow and load npyfeed.tf's op library the way `npyfeed.tf.dataset` does, to report
        whether it loads (``tf_ops_loadable``) and TensorFlow's version. Without it TensorFlow is not imported
        and ``tf_ops_loadable`` is None.

    Returns
    -------
    dict
        ``version``, ``python``, ``numpy``: the versions in use; ``module``: the path of the compiled module;
        ``wheel_tag``: the tags of the wheel npyfeed was installed from (``cp311-cp311-manylinux_2_28_x86_64``
        for a prebuilt wheel, a ``linux_x86_64`` one for a build from source), None when not installed;
        ``compiler``, ``compiler_version`` (its ``__VERSION__``), ``toolchain`` (the cross toolchain of a
        prebuilt wheel, else ""), ``cxx_library``; ``glibc_target`` (the oldest glibc the build runs on, or
        ``"system"``: the one it was built on), ``glibc_headers``, ``glibc_runtime``; ``io_uring_compiled``
        (built with liburing), ``io_uring_usable`` (a ring can be set up here and ``NPYFEED_IO_URING`` is not
        ``0``: window reads are queued on it); ``zlib`` (deflated ``.npz`` members can be read);
        ``simd_kernels_compiled``, ``cpu_vendor``, ``avx2_available``, ``avx512_available`` (the CPU has it and
        the kernel saves its registers), ``avx2_used``, ``avx512_used`` (``NPYFEED_AVX512=0`` turns it off);
        ``tf_ops``: the op library's path, None when it is not installed; ``tf_ops_loadable``: True or False
        with ``tf=True``, else None; ``tensorflow``: TensorFlow's version with ``tf=True``, else None.
    """
    import numpy

    info = {
        "version": __version__,
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "module": os.path.abspath(_core.__file__),
        "wheel_tag": _wheel_tag(),
    }
    info.update(_core.build_info())
    path = os.path.join(os.path.dirname(os.path.abspath(_core.__file__)), _TF_OPS)
    info["tf_ops"] = path if os.path.exists(path) else None
    info["tf_ops_loadable"] = None
    info["tensorflow"] = None
    if tf:
        try:
            import tensorflow
        except ImportError:
            info["tf_ops_loadable"] = False
        else:
            from .tf._feed import native_ops

            info["tensorflow"] = tensorflow.__version__
            info["tf_ops_loadable"] = native_ops() is not None
    return info


def format_build_info(info: dict) -> str:
    """`build_info`'s dict as aligned ``key: value`` lines (``npyfeed info``)."""
    width = max(len(k) for k in info)
    return "\n".join(f"{k + ':':<{width + 1}} {_text(v)}" for k, v in info.items())


def _text(value) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _wheel_tag():
    """The Tag lines of the installed distribution's WHEEL file, joined by ``.``; None where it has none."""
    try:
        text = distribution("npyfeed").read_text("WHEEL")
    except (PackageNotFoundError, OSError):
        return None
    if not text:
        return None
    tags = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]
    return ".".join(tags) or None

