"""npyfeed: fast, safe feeding of NumPy `.npy` files into training."""

from ._core import NpyFormatError
from .loading import MODES, Header, load, load_factor_files, load_many, read_header

__version__ = "0.1.0"

__all__ = [
    "NpyFormatError",
    "Header",
    "MODES",
    "read_header",
    "load",
    "load_many",
    "load_factor_files",
    "__version__",
]
