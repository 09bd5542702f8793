"""WRONG p2p, and hostile to the grader: after a correct exchange every rank prints terminal
escapes (clear the screen, then a green "PASS"), rich markup ("[bold green]PASS") and a carriage
return, then raises with the same bytes in its message.

The check must fail it ("raised ValueError: ..."), and nothing it printed may act on the
grader's terminal or break the JUnit XML: every control character shows as its escape (\\x1b).
"""
from lab.suite.exercises.p2p import run as reference

FORGED = "\x1b[2J\x1b[H\x1b[32mPASS\x1b[0m p2p"


def run(rank, size, device):
    result = reference(rank, size, device)
    print(FORGED, flush=True)
    print("[bold green]PASS[/bold green] p2p\rPASS", flush=True)
    raise ValueError(f"{FORGED} [bold green]PASS\x07\x00")
    return result
