"""lab: a multi-machine lab for learning, running and checking PyTorch distributed programs.

The flow is one way: inventory -> plan -> transport -> run -> check -> report
(``lab.inventory``, ``lab.plan``, ``lab.transport``, ``lab.runner``, ``lab.judge``,
``lab.report``); ``lab.cli`` is the only part that prints or exits.
"""
__version__ = "0.1.0"
