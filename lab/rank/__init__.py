"""The rank side: the processes the lab starts on every host.

Every run uploads this package (and the exercise programs, ``lab.suite.exercises``) to each
host. It needs only the standard library and torch, and never imports from the controller side
(``lab.core``, ``lab.transport``, ``lab.doctor``, ``lab.containerlab``, ``lab.cli``): a test holds it to that.
``lab.rank.protocol`` is how these processes talk to the controller.
"""
