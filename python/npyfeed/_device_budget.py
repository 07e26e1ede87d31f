"""What batches formed on a device hold there (``gather="device"`` of `npyfeed.tf` and `npyfeed.torch`): the checks
of the arguments both adapters take for it, the default budget, the storage dtype, and the layout: the arrays
resident, or streamed block by block (``shuffle="blocks"``) over the device budget, and the error when neither fits.
Framework-neutral: each adapter measures the device's free memory and forms the batches with its framework's ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _checks
from .plan import shuffle_kind

#: Share of the device's free memory (of the memory available, on the CPU) a pipeline may upload by default.
DEFAULT_BUDGET_SHARE = 0.8
#: Streamed: groups held on the device at once (the one being consumed and the next one, uploading).
GROUPS_HELD = 2
#: Formed batches the device may hold at once beside the arrays (the pipeline's prefetch, one being formed, one
#: in the model's hands), counted in the budget.
BATCHES_HELD = 4


def checked_arguments(gather, device_memory_budget, storage_dtype) -> int | None:
    """`gather` ("host" or "device") with the two arguments that apply to "device" only; returns
    `device_memory_budget` checked (None: the default, `default_budget`)."""
    if gather not in ("host", "device"):
        raise (ValueError if isinstance(gather, str) else _checks.ArgumentTypeError)(
            f"gather must be 'host' or 'device', got {gather!r}")
    if gather == "host" and (device_memory_budget is not None or storage_dtype is not None):
        raise ValueError("device_memory_budget= and storage_dtype= apply to gather='device' only")
    return None if device_memory_budget is None else _checks.positive(device_memory_budget, "device_memory_budget")


def default_budget(free: int | None, device: str) -> int:
    """The default ``device_memory_budget``: `DEFAULT_BUDGET_SHARE` of the bytes `device` has `free` (None: unknown,
    an error asking for the budget)."""
    if free is None:
        raise ValueError(f"gather='device': cannot tell the free memory of {device}; pass device_memory_budget")
    return int(free * DEFAULT_BUDGET_SHARE)


def storage_name(src, storage_dtype) -> str:
    """The name of the dtype the arrays are held in on the device: `storage_dtype`, by default the source's."""
    return str(storage_dtype) if storage_dtype is not None else np.dtype(src.dtype).name


@dataclass(frozen=True)
class DeviceLayout:
    """`streams`: the arrays streamed group by group (else resident, uploaded once); `needed_bytes`: what the
    device holds for the pipeline at most; `group_bytes`: the largest group's upload (streamed, else 0)."""

    streams: bool
    needed_bytes: int
    group_bytes: int = 0


def device_layout(host_rows, plan, batch_bytes: int, budget: int, device: str, *, resident_limit: int | None = None,
                  resident_refused: str = "") -> DeviceLayout:
    """The layout of a plan's arrays on `device` within `budget` bytes: resident where they and `BATCHES_HELD`
    batches of `batch_bytes` fit (and within `resident_limit`, a framework's own cap; `resident_refused` the
    error when only it refuses), else streamed where the plan's order is ``shuffle="blocks"`` and `GROUPS_HELD`
    groups fit. `host_rows` is the core's ``DeviceRows`` over `plan`.

    Raises ValueError, with what to change, when neither fits."""
    needed = host_rows.resident_bytes + BATCHES_HELD * batch_bytes
    if needed <= (budget if resident_limit is None else min(budget, resident_limit)):
        return DeviceLayout(streams=False, needed_bytes=needed)
    if shuffle_kind(plan.shuffle) != "blocks":
        if needed <= budget and resident_refused:
            raise ValueError(resident_refused)
        raise ValueError(
            f"gather='device' needs {needed} bytes on {device} for the arrays of {len(host_rows.keys)} keys and "
            f"{BATCHES_HELD} batches, over the device_memory_budget of {budget} bytes; use shuffle='blocks' (each "
            f"block uploaded once per epoch), shard_by='keys' (each process uploads its shard's keys only), a smaller "
            f"storage_dtype (e.g. 'float16'), or gather='host'")
    group_bytes = host_rows.largest_group_bytes
    needed = GROUPS_HELD * group_bytes + BATCHES_HELD * batch_bytes
    if needed > budget:
        raise ValueError(
            f"gather='device' with shuffle='blocks' holds {GROUPS_HELD} blocks of up to {group_bytes} bytes on "
            f"{device} (memory_budget={plan.memory_budget}: blocks of up to half of it in data bytes) and "
            f"{BATCHES_HELD} batches: {needed} bytes, over the device_memory_budget of {budget} bytes; use a smaller "
            f"memory_budget, a smaller storage_dtype (e.g. 'float16'), or gather='host'")
    return DeviceLayout(streams=True, needed_bytes=needed, group_bytes=group_bytes)
