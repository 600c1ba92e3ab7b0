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
import time
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
    busy: bool = False  # threads were lowered because other processes keep cores busy

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
    count and so must fix it. Otherwise a CPU run takes the cores other processes leave free
    (:func:`threads_for_busy_cores`; torch's choice on an idle machine).
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
    if not processes.threads and not torch.cuda.is_available():
        processes.threads = threads_for_busy_cores(torch.get_num_threads())
        processes.busy = processes.threads is not None
    if processes.threads:
        torch.set_num_threads(processes.threads)
    return processes


def runnable_elsewhere(samples: int = 5, source: str = "/proc/loadavg") -> int | None:
    """Tasks other processes keep runnable right now: the median over ``samples`` reads of the
    runnable count in /proc/loadavg, less this process (None where it cannot be read). An
    instant count, not the load average: the average lags a minute behind a load that starts
    or stops."""
    counts = []
    for i in range(samples):
        try:
            with open(source) as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
        except (OSError, IndexError, ValueError):
            return None
        if i + 1 < samples:
            time.sleep(0.01)
    return max(0, sorted(counts)[len(counts) // 2])


def threads_for_busy_cores(default: int) -> int | None:
    """Torch threads for a CPU run when none were asked for (by --threads or OMP_NUM_THREADS):
    None (torch's ``default``, every core) on an idle machine; the cores other processes leave
    free (at least 1) when they keep some busy. OpenMP's threads wait for each other at every
    operation, and one that shares its core with another process stalls them all: with both
    cores of a 2-core machine busy, the default 2 threads generated 8-17x slower than 1
    (eval/results/threads)."""
    if os.environ.get("OMP_NUM_THREADS"):  # a count the user chose (torch took it): it stands
        return None
    others = runnable_elsewhere()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    if others is None or max(1, cores - others) >= default:
        return None
    return max(1, cores - others)
