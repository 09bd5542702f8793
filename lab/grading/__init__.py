"""``lab grade``: a class's submissions, where each runs, and the gradebook.

``grade`` (submissions, the grades, the gradebook, K submissions graded at once), ``places``
(where a submission runs: a share of an inventory's hosts, the local cluster, or a sandbox made for
it; what ``lab grade`` was asked and the choice between them), ``sandbox`` (the throwaway container).
Above the container lab (it starts the sandboxes); nothing here prints or exits (``lab.cli`` does).
"""
