"""The process helper the CLI and the harness share: rank, world, device, torch threads."""

import os

import pytest
import torch

from ngramspec.app import jobs
from ngramspec.app.jobs import start_processes, threads_for_busy_cores

READ_RUNNABLE = jobs.runnable_elsewhere  # the real one (an autouse fixture stands in for it in tests)


@pytest.fixture()
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_one_process_without_accelerate_keeps_torch_threads_unless_asked(restore_threads):  # idle: conftest
    torch.set_num_threads(1)
    processes = start_processes(None, distributed=False)
    assert (processes.rank, processes.world, processes.device, processes.threads) == (0, 1, None, None)
    assert torch.get_num_threads() == 1 and processes.is_main and processes.state is None
    assert processes.gather([1, 2]) == [1, 2]
    processes.wait()
    processes.close()  # nothing to tear down
    start_processes(2, distributed=False)
    assert torch.get_num_threads() == 2


def test_pinned_threads_are_the_cores_split_over_the_processes(restore_threads):
    processes = start_processes(None, distributed=False, pin_threads=True)
    assert processes.threads == torch.get_num_threads() == max(1, os.cpu_count() // 1)


def test_a_single_accelerate_process_is_rank_0_of_1_on_this_device(restore_threads):
    processes = start_processes(None)
    expected = "cpu" if not torch.cuda.is_available() else processes.device
    assert (processes.rank, processes.world, processes.device) == (0, 1, expected)
    assert processes.state is not None and processes.gather(["mine"]) == ["mine"]
    processes.close()


def test_several_cpu_processes_share_the_cores(restore_threads, monkeypatch):
    class TwoCpuProcesses:  # what accelerate reports to rank 1 of 2 CPU processes
        process_index, num_processes, device = 1, 2, torch.device("cpu")

        def __init__(self, cpu):
            pass

    import accelerate

    monkeypatch.setattr(accelerate, "PartialState", TwoCpuProcesses)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    processes = start_processes(None)
    assert (processes.rank, processes.world, processes.device, processes.threads) == (1, 2, "cpu", 4)
    assert not processes.is_main and torch.get_num_threads() == 4
    assert start_processes(3).threads == 3  # an explicit count wins



@pytest.mark.parametrize("cores, others, default, chosen", [
    (2, 0, 2, None),  # idle: torch's choice
    (2, 1, 2, 1),  # one core busy elsewhere: the other one
    (2, 5, 2, 1),  # more busy tasks than cores: one thread
    (16, 4, 16, 12),
    (2, 3, 1, None),  # torch's choice is one thread already
    (2, None, 2, None),  # /proc/loadavg unreadable: torch's choice
])
def test_threads_leave_the_cores_other_processes_keep_busy(monkeypatch, cores, others, default, chosen):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(jobs, "runnable_elsewhere", lambda: others)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert threads_for_busy_cores(default) == chosen


def test_a_cpu_run_takes_the_free_cores_and_the_command_says_so(restore_threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(jobs, "runnable_elsewhere", lambda: 7)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    torch.set_num_threads(2)
    processes = start_processes(None, distributed=False)
    assert (processes.threads, processes.busy) == (1, True) and torch.get_num_threads() == 1
    assert start_processes(2, distributed=False).threads == 2  # --threads wins
    assert start_processes(None, distributed=False, pin_threads=True).busy is False  # the harness pins
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    assert start_processes(None, distributed=False).threads is None  # the user's OMP_NUM_THREADS stands


def test_runnable_elsewhere_counts_the_other_runnable_tasks(tmp_path):
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("4.61 5.21 4.60 5/142 21052\n")  # 5 runnable, this process one of them
    assert READ_RUNNABLE(samples=3, source=str(loadavg)) == 4
    assert READ_RUNNABLE(source=str(tmp_path / "missing")) is None
