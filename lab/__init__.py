"""lab: a multi-machine lab for learning, running and checking PyTorch distributed programs.

The flow is one way: inventory -> plan -> transport -> run -> check -> report
(``lab.inventory.hosts`` reads ``lab.inventory.model``'s model, ``lab.core.planner`` makes the
``lab.core.plan``, ``lab.transport``, ``lab.core.runner``, ``lab.core.judge``, ``lab.core.report``).
The package is laid out in floors, each importing only from itself and those below it
(``tests/test_layout.py`` holds it to that):
``lab.suite`` < ``lab.rank`` < ``lab.errors``, ``lab.inventory.model``, ``lab.inventory.keys``
< ``lab.transport`` < ``lab.netcheck`` < ``lab.core``, ``lab.inventory`` < ``lab.jobs`` < ``lab.net``
< ``lab.containerlab`` < ``lab.grading`` < ``lab.doctor`` < ``lab.cli``; only ``lab.cli`` prints or
exits. README.md's "The repository" says what each floor holds.
"""
__version__ = "0.1.0"
