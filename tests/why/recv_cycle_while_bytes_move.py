"""Every rank receives first (recv_cycle.py), while each rank's process still moves bytes on a
connection of its own for 8 s (a data loader's, a metrics client's): a hang is nothing moving, so
the lab waits until the bytes stop, then finds the cycle within --hang-after. The line each rank
prints when its bytes stop shows that no verdict came before (tests/test_local_run.py looks for it).

expect: kind=p2p-cycle; nproc=2; exit=4; headline contains "0 waits for 1";
        report contains "recv_cycle_while_bytes_move.py:35"
"""
import socket
import threading
import time

import torch
import torch.distributed as dist

SIDE_TRAFFIC = 8.0  # seconds: longer than the tests' --hang-after (5)


def side_traffic() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()) as out, server.accept()[0] as into:
        until = time.monotonic() + SIDE_TRAFFIC
        while time.monotonic() < until:
            out.sendall(b"x" * 64)
            into.recv(64)
            time.sleep(0.3)
    print(f"rank {dist.get_rank()}: its side traffic stopped", flush=True)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
token = torch.full((1024,), float(rank))
dist.barrier()
threading.Thread(target=side_traffic, daemon=True).start()
dist.recv(token, src=(rank - 1) % world)
dist.send(token, dst=(rank + 1) % world)
dist.destroy_process_group()
