# Type stubs for npyfeed's C++ module. Users import the public names from `npyfeed`, not from here.
from collections.abc import Sequence
from typing import Callable

import numpy as np

class NpyFormatError(ValueError):
    path: str
    offset: int
    reason: str

def read_header(path: str, max_header_size: int = 10000) -> dict: ...
def parse_header_bytes(data: bytes, max_header_size: int = 10000) -> dict: ...
def load_many(
    paths: Sequence[str],
    mode: str,
    threads: int,
    max_header_size: int,
    populate: bool,
    progress: Callable[[int, int], None] | None = None,
    cpus: Sequence[int] = ...,
    nice: int | None = None,
    io_priority: tuple[int, int] | None = None,
) -> list[tuple[np.ndarray, bool]]: ...
def load_npz_many(
    paths: Sequence[str],
    mode: str,
    threads: int,
    max_header_size: int,
    populate: bool,
    cpus: Sequence[int] = ...,
    nice: int | None = None,
    io_priority: tuple[int, int] | None = None,
) -> list[list[tuple[str, np.ndarray]]]: ...
def read_npz_headers(path: str, max_header_size: int) -> list[tuple[str, dict, str, int]]: ...

have_inflate: bool

class SampleIndex:
    def __len__(self) -> int: ...
    @property
    def keys(self) -> list[str]: ...

def load_index(paths: Sequence[str], cache_dir: str, threads: int) -> tuple[SampleIndex, str | None, bool, str]: ...
def index_from_columns(feature_index: np.ndarray, label_index: np.ndarray, keys: Sequence[str], name: str) -> SampleIndex: ...

class BatchStream:
    def __next__(self) -> tuple[np.ndarray, np.ndarray]: ...
    def close(self) -> None: ...
    @property
    def num_batches(self) -> int: ...
    @property
    def buffered_bytes(self) -> int: ...
    @property
    def peak_buffered_bytes(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...

class SamplesByKey:
    @property
    def runs(self) -> bool: ...

class Plan:
    def __init__(self, source: WindowSourceCore, shuffle: str, seed: int, num_shards: int, shard_index: int,
                 batch_size: int, drop_remainder: bool, memory_budget: int, prefetch: int,
                 samples_by_key: SamplesByKey | None = None, shard_by: str = "samples") -> None: ...
    def __len__(self) -> int: ...
    @property
    def shard_size(self) -> int: ...
    @property
    def samples_by_key(self) -> SamplesByKey | None: ...
    @property
    def streams_started(self) -> int: ...
    def ids(self, epoch: int, batch: int) -> np.ndarray: ...
    def order(self, epoch: int) -> np.ndarray: ...
    def take(self, epoch: int, batch: int) -> tuple[np.ndarray, np.ndarray]: ...
    def stream(self, epoch: int, start_batch: int, prefetch: int) -> BatchStream: ...
    def close(self) -> None: ...

class WindowSourceCore:
    def __len__(self) -> int: ...
    @property
    def skipped(self) -> int: ...
    @property
    def direct_fallbacks(self) -> list[str]: ...
    @property
    def mapping_limit(self) -> int: ...
    @property
    def x_shape(self) -> tuple[int, ...]: ...
    @property
    def y_shape(self) -> tuple[int, ...]: ...
    def describe(self, sample: int) -> str: ...
    def get(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

def open_window_files(
    index: SampleIndex,
    factor_paths: Sequence[str],
    label_paths: Sequence[str],
    window: int,
    dtype: str,
    bounds: str,
    mode: str,
    threads: int,
    max_header_size: int,
    cpus: Sequence[int] = ...,
    nice: int | None = None,
    io_priority: tuple[int, int] | None = None,
    npz_member: str = "",
    npz_memory_limit: int = 0,
) -> WindowSourceCore: ...
def window_source_from_arrays(
    index: SampleIndex,
    factors: Sequence[np.ndarray],
    labels: Sequence[np.ndarray],
    window: int,
    dtype: str,
    bounds: str,
    threads: int,
    cpus: Sequence[int] = ...,
    nice: int | None = None,
    io_priority: tuple[int, int] | None = None,
) -> WindowSourceCore: ...
def warm_files(
    paths: Sequence[str],
    threads: int,
    read: bool,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[tuple[int, int, int]], int]: ...
