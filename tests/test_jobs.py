"""The process helper the CLI and the harness share: rank, world, device, torch threads."""

import os

import pytest
import torch

from ngramspec.app.jobs import start_processes


@pytest.fixture()
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_one_process_without_accelerate_keeps_torch_threads_unless_asked(restore_threads):
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

