"""Everything the CLI shows a person, and the only place that imports rich.

``screen`` (consoles, ``lab: ...`` lines, JSON, errors), ``run`` (a run's lines and report, a
launch, the cross-VPC lesson, known causes), ``grades``, ``bench``, ``doctor`` (the diagnosis),
``labs`` (status and ls tables, link shapes). The handlers in ``lab.cli`` decide; these print.
"""
