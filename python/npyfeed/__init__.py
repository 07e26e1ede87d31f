"""npyfeed: fast, safe feeding of NumPy `.npy` files into training."""

from ._build_info import __version__, build_info
from ._core import ClosedError, FileChangedError, NpyFormatError
from ._resources import settings
from .index_check import IndexProblem, IndexReport, check_index
from .loading import MODES, Header, load, load_factor_files, load_many, read_header
from .plan import BatchIterator, Plan
from .warm import DirectoryResidency, WarmReport, warm
from .windows import BOUNDS, SampleLocation, WindowSource


def __getattr__(name):
    # The framework adapters import their framework (`npyfeed.tf` TensorFlow, `npyfeed.keras` Keras 3,
    # `npyfeed.torch` PyTorch), so each is loaded only when asked for.
    if name in ("tf", "keras", "torch"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "NpyFormatError",
    "FileChangedError",
    "ClosedError",
    "Header",
    "MODES",
    "read_header",
    "load",
    "load_many",
    "load_factor_files",
    "WindowSource",
    "Plan",
    "BatchIterator",
    "BOUNDS",
    "SampleLocation",
    "check_index",
    "IndexReport",
    "IndexProblem",
    "warm",
    "WarmReport",
    "DirectoryResidency",
    "build_info",
    "settings",
    "__version__",
]
