"""Forward timings for the cost model: the decode loop brackets each forward, and the time
reaches an :class:`~ngramspec.cost.costmodel.OnlineCost` without a host-device sync.
"""

from __future__ import annotations

import time

from .costmodel import OnlineCost


class ForwardTimer:
    """Times the decode loop's forwards into an :class:`OnlineCost`. On CPU the forward is
    synchronous and the wall clock times it. On CUDA two events bracket it and are read once
    they have completed (``query()``, a step or more later): no host-device sync is added."""

    def __init__(self, cost: OnlineCost, device, clock=time.perf_counter):
        self.cost = cost
        self.cuda = getattr(device, "type", str(device)) == "cuda"
        self.clock = clock
        self._pending: list = []  # CUDA: (start event, end event, tokens, context, rows)
        self._started = None

    def start(self) -> None:
        if self.cuda:
            import torch

            self._read_completed()
            self._started = torch.cuda.Event(enable_timing=True)
            self._started.record()
        else:
            self._started = self.clock()

    def stop(self, tokens: int, context: int, rows: int = 1) -> None:
        if self.cuda:
            import torch

            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((self._started, end, tokens, context, rows))
        else:
            self.cost.observe(tokens, context, self.clock() - self._started, rows)

    def finish(self) -> None:
        """After the loop: its last step read the target's choices, a sync after every event
        recorded, so the pending timings are complete and reach the cost model unwaited."""
        self._read_completed()

    def _read_completed(self) -> None:
        while self._pending and self._pending[0][1].query():
            start, end, tokens, context, rows = self._pending.pop(0)
            self.cost.observe(tokens, context, start.elapsed_time(end) / 1000, rows)
