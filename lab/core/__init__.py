"""The controller's core, one way through: inventory -> plan -> run -> judge -> report (the
inventory read by ``lab.inventory``, which shares this floor).

Runs only on the controller. Nothing here prints or exits (``lab.cli`` does); nothing here
travels to a host (``lab.rank`` and ``lab.suite`` do).
"""
