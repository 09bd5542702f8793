"""The run's port holder: rank 0's host chooses the rendezvous ports and holds them for as long as
the run lasts (``lab.rank.ports``), so runs from any number of controllers never pick the same port."""
from __future__ import annotations

import queue
import threading

from lab.core.plan import Plan
from lab.core.streams import read_events
from lab.errors import RunError
from lab.rank.events import Event, Ports
from lab.rank.isolation import USERS_VAR
from lab.rank.ports import EXCLUSIVE
from lab.rank.protocol import LINE_MAX
from lab.transport.base import RankProcess, Transport

PORTS_WAIT = 30.0  # seconds for rank 0's host to report the ports it holds


def hold_ports(transport: Transport, plan: Plan) -> tuple[RankProcess, tuple[int, ...]]:
    """Start the port holder on rank 0's host: the process (kill it to free the ports) and the
    ports it holds for the run."""
    assert transport.run_dir is not None
    env = {"PYTHONPATH": f"{transport.run_dir}/code", "LAB_TOKEN": plan.token, "PYTHONUNBUFFERED": "1",
           **({USERS_VAR: str(plan.options.rank_users)} if plan.options.rank_users is not None else {})}
    try:
        holder = transport.start([*transport.module_argv("lab.rank.ports"),
                                  *([EXCLUSIVE] if plan.hands_over_ports else []), str(plan.port_count)], env,
                                 transport.run_dir)
    except OSError as exc:
        raise RunError(f"host {transport.host.name}: cannot start the port holder: {exc}") from exc
    try:
        ports = _ports_in(_first_event(holder, plan.token, PORTS_WAIT))
    except BaseException:
        holder.kill()
        raise
    if len(ports) != plan.port_count:
        ended = holder.poll() is not None
        error = holder.stderr.read(LINE_MAX).decode("utf-8", "replace").strip().splitlines() if ended else []
        holder.kill()
        raise RunError(f"host {transport.host.name}: could not hold {plan.port_count} free port(s) for the "
                       f"rendezvous: {error[-1] if error else f'no answer within {PORTS_WAIT:g}s'}")
    return holder, ports


def _ports_in(event: Event | None) -> tuple[int, ...]:
    """The ports a ``ports`` event names (its reader checked each is a TCP port); none when it is not one."""
    return event.ports if isinstance(event, Ports) else ()


def _first_event(process: RankProcess, token: str, timeout: float) -> Event | None:
    """The first event on ``process``'s stdout within ``timeout`` seconds (None: none came), read
    within bounds (lab.core.streams.read_events)."""
    found: queue.Queue[Event | None] = queue.Queue()

    def read() -> None:
        try:
            found.put(next(read_events(process.stdout, token), None))
        except (OSError, ValueError):  # (MalformedEvent is a ValueError)
            found.put(None)

    threading.Thread(target=read, name="lab-read-ports", daemon=True).start()
    try:
        return found.get(timeout=timeout)
    except queue.Empty:
        return None
