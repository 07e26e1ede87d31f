"""The warnings a `WindowSource` gives, once each, whatever consumer reads it (its numpy iterator, `Plan.take`,
`npyfeed.tf`, the Keras and PyTorch adapters, which all read through a `Plan`): a global shuffle over more files
than memory holds, given when such a plan is made, and O_DIRECT refused by the filesystem, given at construction
and after an epoch that met a new refusal."""

from __future__ import annotations

import logging
import os

from ._resources import available_memory

log = logging.getLogger("npyfeed")


class SourceWarnings:
    """What one source has warned about already."""

    def __init__(self):
        self._fallbacks = 0
        self._memory = False

    def direct_fallback(self, source) -> None:
        """With ``mode="direct"``: a warning naming the first file whose O_DIRECT reads were refused, when more
        files were refused than at the last warning."""
        if source.mode != "direct":
            return
        fell = source.direct_fallback
        if len(fell) > self._fallbacks:
            self._fallbacks = len(fell)
            log.warning("npyfeed: O_DIRECT refused for %s (%d of %d files); WindowSource(mode='direct') reads them "
                        "with buffered reads", fell[0], len(fell), len(source.files))

    def larger_than_memory(self, source) -> None:
        """Once per source: a global shuffle over files that do not fit in memory reads at random from disk."""
        if self._memory or not source.files:
            return
        self._memory = True
        try:
            data = sum(os.stat(p).st_size for p in source.files)
        except OSError:
            return
        available = available_memory()
        if available is not None and data > available:
            log.warning("npyfeed: shuffle=True over %.1f GB of files with %.1f GB of memory available: each sample "
                        "is then a random read from disk; shuffle=\"blocks\" reads every file once per epoch, "
                        "in sequence (docs/blocks.md)", data / 1e9, available / 1e9)
