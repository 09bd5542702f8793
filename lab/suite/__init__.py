"""The exercise suite: the registry (``registry``), the rank programs (``exercises/``, run on the
hosts) and their checkers (``checks/``, pure-Python oracles run on the controller).

Uploaded with every run, like ``lab.rank``: standard library and torch only.
"""
