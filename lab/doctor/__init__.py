"""``lab doctor``: why a multi-node job fails or hangs, before and after it does.

``model`` holds the data (what the probes report, the findings), ``run`` drives the probes
(``lab.rank.probe``) on every host, ``rules`` turns their reports into findings (pure), and
``scenario`` is the cross-VPC lesson built on them. Nothing here prints: ``lab.cli.views.doctor``
shows a diagnosis.
"""
