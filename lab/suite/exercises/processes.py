"""Start processes with torch.multiprocessing: Process + start/join, then mp.spawn.

From "Process Creation in PyTorch" (tutorial 000) and "Multi-process Application 실행 방법,
1) 사용자의 코드가 메인프로세스가 되어 특정 함수를 서브프로세스로 분기한다" (tutorials 002/003):
the user's code is the parent and runs a function in child processes. No process group
is needed here; each child only reports back which child it is and its pid.
"""
import os

import torch.multiprocessing as mp

CHILDREN = 2


def child(index, queue):
    """What a child started with Process runs (it must live at module level to be picklable)."""
    queue.put(("Process", index, os.getpid()))


def spawned(index, queue):
    """What a child started by mp.spawn runs: mp.spawn passes the child's index first."""
    queue.put(("spawn", index, os.getpid()))


def drain(queue):
    """Everything the children put into the queue (they have all been joined)."""
    reports = []
    while not queue.empty():
        reports.append(queue.get())
    return reports


def run(rank):
    # The tutorials explain two start methods: "fork" copies this process as it is (fast,
    # but a lock another thread holds at that moment stays locked in the child forever),
    # "spawn" starts a fresh interpreter (safe, but every child imports torch again: seconds
    # each). Here a third, "forkserver": one fresh, single-threaded server process imports
    # torch once (the preload) and forks every child from itself, so the children are as
    # safe as spawned ones and start as fast as forked ones. A queue for its children must
    # come from the same context.
    mp.set_forkserver_preload(["torch"])
    forkserver = mp.get_context("forkserver")

    # 1) Process + start + join.
    queue = forkserver.SimpleQueue()
    processes = []
    for index in range(CHILDREN):
        p = forkserver.Process(target=child, args=(index, queue))  # created, not running yet
        p.start()  # only now does the child run child(index, queue)
        processes.append(p)
    for p in processes:
        p.join()  # wait for the child to end and reclaim it: the parent's duty
    reports = drain(queue)

    # 2) mp.spawn does that create/start/join loop for us (with start_method="spawn" unless
    # told otherwise; mp.start_processes is the same with the start method named).
    queue = forkserver.SimpleQueue()
    mp.start_processes(spawned, args=(queue,), nprocs=CHILDREN, join=True, start_method="forkserver")
    reports += drain(queue)

    print(f"rank {rank}: my pid {os.getpid()}, my children reported {reports}")
    return {"pid": os.getpid(), "reports": reports}
