"""The steps a rank of ``lab run`` takes, one type for the worker that says them (``step`` events)
and the controller that reads them: its start-up (importing torch), a stage's rendezvous, an
exercise, and the lab's barrier after one. On the wire a step is a word: ``init:env``, ``p2p``,
``wait:p2p`` (:meth:`RankStep.wire`), read back by :func:`parse` alone.

A rank's program may send anything on its channel: a word that names no step of the run is none.

Standard library only: the worker sends them.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

Kind = Literal["startup", "rendezvous", "exercise", "barrier"]
_RENDEZVOUS, _BARRIER = "init:", "wait:"  # (on the wire, before a rendezvous' init method, a barrier's exercise)
STEP_MAX = 100  # characters of a rendezvous' step said, at most


@dataclass(frozen=True)
class RankStep:
    """One step of a rank: ``name`` is a rendezvous' init method ("env", "tcp", "file"), or the
    exercise of an exercise's step and of the barrier after it."""

    kind: Kind
    name: str = ""

    @property
    def exercise(self) -> str | None:
        """The exercise it is in or has just left (the barrier after it), else None."""
        return self.name if self.kind in ("exercise", "barrier") else None

    @property
    def before_program(self) -> bool:
        """One of the lab's own steps before any of the program's: start-up, a rendezvous."""
        return self.kind in ("startup", "rendezvous")

    def wire(self) -> str:
        """The step as a ``step`` event says it."""
        return {"startup": "startup", "rendezvous": _RENDEZVOUS + self.name, "exercise": self.name,
                "barrier": _BARRIER + self.name}[self.kind]

    def __str__(self) -> str:
        """The step as a person reads it."""
        if self.kind == "rendezvous":
            return f"the rendezvous (init_method {self.name}://)"
        if self.kind == "barrier":
            return f"the barrier after {self.name}"
        return "start-up (importing torch)" if self.kind == "startup" else self.name


STARTUP = RankStep("startup")


def rendezvous(init: str) -> RankStep:
    return RankStep("rendezvous", init)


def exercise(name: str) -> RankStep:
    return RankStep("exercise", name)


def barrier(name: str) -> RankStep:
    return RankStep("barrier", name)


def parse(said: str, exercises: Collection[str]) -> RankStep | None:
    """The step a ``step`` event says, of a run of ``exercises``; None where it names none of the run's."""
    if said in exercises:
        return exercise(said)
    if said.startswith(_BARRIER) and said[len(_BARRIER):] in exercises:
        return barrier(said[len(_BARRIER):])
    if said.startswith(_RENDEZVOUS) and len(said) < STEP_MAX:
        return rendezvous(said[len(_RENDEZVOUS):])
    return None
