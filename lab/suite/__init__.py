"""The exercise suite: the registry (``registry``), the rank programs (``exercises/``, run on the
hosts) and their checkers (``checks/``, pure-Python oracles run on the controller).

The rank programs are uploaded with every run, like ``lab.rank`` (standard library and torch
only); the checkers and the registry never are: a rank cannot import what a checker expects.
"""
