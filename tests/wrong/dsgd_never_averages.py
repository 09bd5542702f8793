"""WRONG distributed SGD: average_gradients does nothing, so every rank steps on its own
batch's gradient and the replicas drift apart from the first step.

The check must say the ranks' parameters differ after step 1; with 4 ranks
"rank 1: dsgd parameters after step 1 (epoch 0, batch 1) as on rank 0: fc1.weight sum:
expected -0.4985070824623108, got -0.4548403024673462 (and 17 more)"
(then, on every rank, that they differ from one process training on the full batch), and
the note "the ranks' parameters differ from the first step on: average_gradients did not
leave the same gradient on every rank".
"""


def average_gradients(model):
    pass  # the mistake: no all_reduce, no division

