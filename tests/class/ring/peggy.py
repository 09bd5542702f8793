"""Dishonest: hands in the reference's own functions, imported. Each part is "not written: it uses
the reference's ..." and scores 0."""
from lab.suite.exercises.ring_allreduce import allreduce, ring_allreduce  # noqa: F401
