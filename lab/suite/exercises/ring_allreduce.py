"""Ring all-reduce from point-to-point messages: the tutorial's, then the bandwidth-optimal one.

From "Our Own Ring-Allreduce" (사용자 정의 링-올리듀스) of the official tutorial (001/004):
``allreduce(send, recv)`` passes whole tensors around the ring with ``isend``/``recv``, n - 1
times, so every rank sends n - 1 whole tensors. It is written here in the lab's own words; the
tutorial's own text is graded as a solution by the tests, taken from the tutorial itself.
The tutorial leaves the rest as homework:
DeepSpeech's ring all-reduce cuts the tensor into n *chunks* (hint: ``torch.chunk``) and
runs a reduce-scatter (n - 1 steps: at the end rank r holds the SUM of one chunk) then an
all-gather (n - 1 steps: the reduced chunks go round), so every rank sends 2 (n - 1) / n of
the tensor however many ranks there are. That is ``ring_allreduce(tensor)`` below.

To grade your own: copy this file, rewrite ``allreduce`` and/or ``ring_allreduce``, and run
``python -m lab run ring-allreduce --solution mine.py --nproc 5``. Both are tried on every
case of ``lab/suite/exercises/ring_cases.py``: sizes 0 and 1, sizes no world size divides, a 2-D
tensor and a few large ones, in float32, float64, int64 and int32. The inputs are random values
drawn afresh for every rank of every run, and for each function apart, so a chunk in the wrong place
or a lost remainder shows, and no rank knows another's values without receiving them.
"""
import torch
import torch.distributed as dist

from lab.suite.exercises.ring_cases import DTYPES, SHAPES, case_name, digest, numel, starts


def allreduce(send, recv):
    """The tutorial's ring all-reduce: ``recv`` gets the SUM of every rank's ``send``.

    Whole tensors go round the ring: each of the n - 1 steps, a rank sends to the right the
    tensor it has just passed on to itself (its own ``send`` at first), receives the next one
    from the left and adds it to its running sum. Two buffers take turns: the one just sent
    becomes the one to receive into, once the send is done.
    """
    rank, size = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % size, (rank + 1) % size
    total = send.clone()
    outgoing, incoming = send.clone(), torch.empty_like(send)
    for _ in range(size - 1):
        request = dist.isend(outgoing, right)
        dist.recv(incoming, left)
        request.wait()
        total += incoming
        outgoing, incoming = incoming, outgoing
    recv.copy_(total)


def ring_allreduce(tensor):
    """The homework: in place, SUM, reduce-scatter then all-gather over n chunks, 2 (n - 1) steps.

    ``tensor`` must be contiguous (its flat view is what the chunks share).
    """
    rank, size = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % size, (rank + 1) % size
    flat = tensor.view(-1)
    # torch.chunk makes pieces of ceil(numel / n) elements, so it can return FEWER than n
    # pieces (5 elements in 4 chunks: 2, 2, 1): add empty ones, so every rank owns one.
    # (torch.tensor_split(flat, size) always gives n pieces, too.) The pieces are views of
    # the tensor: adding into them and receiving into them writes the result in place.
    chunks = list(torch.chunk(flat, size))
    chunks += [flat[flat.numel():]] * (size - len(chunks))

    # Reduce-scatter. Step s: send chunk (rank - s) to the right, receive the left's partial
    # sum of chunk (rank - s - 1) and add it in. After n - 1 steps chunk (rank + 1) holds the
    # SUM over every rank.
    for s in range(size - 1):
        out, into = chunks[(rank - s) % size], chunks[(rank - s - 1) % size]
        incoming = torch.empty_like(into)
        send_req = dist.isend(out, right)
        dist.recv(incoming, left)
        send_req.wait()
        into += incoming

    # All-gather. Step s: send the reduced chunk (rank + 1 - s) to the right and receive the
    # reduced chunk (rank - s) from the left, over what this rank had there.
    for s in range(size - 1):
        out, into = chunks[(rank + 1 - s) % size], chunks[(rank - s) % size]
        send_req = dist.isend(out, right)
        dist.recv(into, left)
        send_req.wait()


def run_cases(rank, size, device, inputs, allreduce, ring_allreduce):
    """Every case through both functions, from this rank's drawn ``inputs`` (int16 values, the
    cases' one after another, each function's apart: ring_cases); a digest of each result for the checker."""
    if inputs is None:
        raise RuntimeError("no inputs were drawn for this rank: run the exercise with python -m lab run")
    drawn = torch.frombuffer(bytearray(inputs), dtype=torch.int16).to(torch.int64)
    reports = {"allreduce": {}, "ring_allreduce": {}}
    for shape in SHAPES:
        sent, reduced = (drawn[at:at + numel(shape)]
                         for at in (starts("allreduce")[shape], starts("ring_allreduce")[shape]))
        for dtype_name in DTYPES:
            name = case_name(shape, dtype_name)
            dtype = getattr(torch, dtype_name)
            send = sent.to(dtype=dtype, device=device, copy=True).reshape(shape)
            recv = torch.zeros_like(send)
            allreduce(send, recv)
            reports["allreduce"][name] = _report(recv, size)

            tensor = reduced.to(dtype=dtype, device=device, copy=True).reshape(shape)
            ring_allreduce(tensor)
            reports["ring_allreduce"][name] = _report(tensor, size)
            if name == "size 7 int64":
                print(f"rank {rank}: allreduce: {recv.tolist()}; ring_allreduce: {tensor.tolist()}")
    return reports


def _report(tensor, size):
    return {"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch."),
            **digest(tensor.reshape(-1).tolist(), size)}


def run(rank, size, device, inputs):
    return run_cases(rank, size, device, inputs, allreduce, ring_allreduce)
