"""Worlds of spawned processes over gloo for the fa3.distributed tests.

Each world runs as spawned processes; a per-test deadline kills a world whose ranks
are stuck, and the process group's own timeout makes a collective whose peer is gone
fail rather than wait. Starting the processes costs far more than small cases
themselves, so a test runs many cases in one world, on groups of its first ranks.
"""

import datetime
import os
import socket
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DEADLINE_S = 90
# The group sizes a world of GROUP_SIZES[-1] ranks runs its cases on (the last one
# the default group).
GROUP_SIZES = (2, 3, 4)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(worker, world_size, *args):
    """Runs worker(rank, world_size, port, *args) on world_size spawned processes;
    fails (killing them) past DEADLINE_S, and re-raises a rank's exception."""
    port = free_port()
    context = mp.start_processes(
        worker, args=(world_size, port, *args), nprocs=world_size, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + DEADLINE_S
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"world of {world_size} ranks did not finish within {DEADLINE_S} s")


def init(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=DEADLINE_S // 2)
    )


def leave():
    """Tears the world down once every rank is done with it, and ends the process: a rank
    that destroys its process group (closing its connections) while a peer still
    completes work with it can make that peer's transport threads abort the process, and
    so can the interpreter's own teardown of the communication library's threads (a
    rank once died of "terminate called without an active exception" after its checks
    had passed). Past the barrier every check has passed, so the process leaves at once,
    with status 0, without that teardown."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def groups_of_first_ranks(rank, world_size):
    """[(size, group)] for each of GROUP_SIZES that holds rank: the group of ranks 0 ..
    size - 1, None (the default group) for the whole world. new_group is collective:
    every rank creates every group, in the same order, whether it belongs to it or not."""
    groups = {size: dist.new_group(list(range(size))) for size in GROUP_SIZES if size != world_size}
    groups[world_size] = None
    return [(size, group) for size, group in groups.items() if rank < size]
