"""Host values onto the model's device without a host-device sync."""

from __future__ import annotations

import torch


def to_device(values, device: torch.device, dtype=torch.long) -> torch.Tensor:
    """Host values (a list, or a CPU tensor) on ``device`` without a host-device sync: on CUDA
    the values go through pinned memory and an asynchronous copy (a copy from pageable memory
    would wait for every kernel queued before it). The caching host allocator keeps the pinned
    block until the copy has run."""
    tensor = torch.as_tensor(values, dtype=dtype)
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)
