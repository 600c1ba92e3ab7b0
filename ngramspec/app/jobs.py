"""One process's place in a job that ``accelerate launch`` may spread over processes or GPUs.

    processes = start_processes(threads=None)     # rank, world, device; torch threads set
    mine = items[processes.rank :: processes.world]
    ...
    results = processes.gather(my_results)        # everyone's, on every process
    processes.close()

Used by the CLI (``ngramspec rewrite`` over many documents) and the harness (``python -m eval
run``), so both split work, pick devices and threads, and shut down the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class Processes:
    """Where this process stands: ``rank`` of ``world`` processes, the ``device`` to load the
    model on (None: :func:`~ngramspec.load_model`'s choice) and the torch CPU ``threads`` set
    (None: torch's choice)."""

    rank: int = 0
    world: int = 1
    device: str | None = None
    threads: int | None = None
    state: object = None  # accelerate's PartialState; None: one process, accelerate not involved

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wait(self) -> None:
        """Block until every process gets here."""
        if self.state is not None:
            self.state.wait_for_everyone()

    def gather(self, objects: list) -> list:
        """Every process's ``objects`` concatenated in rank order, on every process."""
        if self.state is None:
            return list(objects)
        from accelerate.utils import gather_object

        self.wait()
        return gather_object(objects)

    def close(self) -> None:
        # Tear the process group down before exit: a gloo group left to the interpreter's
        # shutdown can abort the process after all work is done.
        if self.state is not None:
            self.state.destroy_process_group()


def start_processes(threads: int | None = None, distributed: bool = True, pin_threads: bool = False) -> Processes:
    """Join the job (``distributed``: through accelerate, which also works for a plain single
    process) and set torch's CPU threads.

    ``threads``: torch threads per process. When None, several processes on CPU share the
    cores evenly (each taking them all would oversubscribe the machine); ``pin_threads`` sets
    cores / processes even for one process or on GPU, for callers that report their thread
    count and so must fix it.
    """
    import torch

    processes = Processes(threads=threads)
    if distributed:
        from accelerate import PartialState

        # cpu=True without CUDA: `accelerate launch --multi_gpu --num_processes N` then starts N
        # CPU processes (gloo backend); with GPUs each process gets its own device.
        state = PartialState(cpu=not torch.cuda.is_available())
        processes.state = state
        processes.rank, processes.world = state.process_index, state.num_processes
        processes.device = "cpu" if state.device.type == "cpu" else str(state.device)
    shared_cpu = processes.world > 1 and processes.device == "cpu"
    if not processes.threads and (pin_threads or shared_cpu):
        processes.threads = max(1, (os.cpu_count() or 1) // processes.world)
    if processes.threads:
        torch.set_num_threads(processes.threads)
    return processes
