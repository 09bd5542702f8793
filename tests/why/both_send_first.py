"""Both ranks send first: each blocks in send until the other posts the matching recv, which it
only does after its own send. (gloo's send waits for the receiver whatever the size; 16 MiB is
also past any socket buffer.) The fix: one rank receives first (p2p_even_odd.py).

expect: kind=p2p-cycle; nproc=2; exit=4; headline contains "0 waits for 1";
        report contains "both_send_first.py:16"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
peer = 1 - rank
mine, theirs = torch.full((4 * 1024 * 1024,), float(rank)), torch.empty(4 * 1024 * 1024)
for _ in range(2):  # exchange halos with the neighbour
    dist.send(mine, dst=peer)
    dist.recv(theirs, src=peer)
dist.destroy_process_group()
