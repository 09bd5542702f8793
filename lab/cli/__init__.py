"""The command line, the only part of the lab that prints to a person or exits.

``main`` (the root parser, dispatch, errors to exit codes, the debug log); a module per group of
commands, each command's parser beside its handler: ``running`` (list, run, launch, submit),
``grading`` (grade), ``labs`` (up, down, status, ls, net, break, fix), ``bench``, ``doctor``;
``common`` (the options several share); ``views`` (everything shown, the only importer of rich).
"""
from lab.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
