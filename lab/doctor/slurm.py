"""The doctor's Slurm checks, when the hosts are a Slurm cluster (the first host has ``sinfo`` and
a slurm.conf).

From the first host (the login host, where ``--launcher srun`` starts its jobs): whether slurmctld
answers (``scontrol ping``), each node's state as it has it (``sinfo``), and a munge credential
made there; then on every host, whether its munged decodes that credential (``unmunge``): a host
whose munge key is another's cannot, and slurmctld rejects everything it sends. Each problem is a
finding with its cause and fix; :func:`findings` is pure.
"""
from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lab.core.slurm import WORKING
from lab.errors import LabError
from lab.inventory.model import Host
from lab.netcheck.model import Finding
from lab.transport.base import Transport, for_each_host

MARK = "lab-slurm:"
# whether the host is configured as a Slurm client (its commands read $SLURM_CONF, else these)
_HAS_CONF = ('{ [ -r "${SLURM_CONF:-/etc/slurm/slurm.conf}" ] || [ -r /etc/slurm-llnl/slurm.conf ] || '
             '[ -r /run/slurm/conf/slurm.conf ]; }')


@dataclass
class SlurmAnswers:
    """What the hosts said (see the module)."""

    login: str
    ping: str  # scontrol ping's line
    states: dict[str, str] = field(default_factory=dict)  # node -> its state
    decoded: dict[str, str | None] = field(default_factory=dict)  # host -> None (it decoded the credential) or why not


def ask(transports: Mapping[str, Transport], hosts: Sequence[Host], timeout: float) -> SlurmAnswers | None:
    """Ask the hosts (see the module); None when the first host has no Slurm, or cannot be asked."""
    login = hosts[0]
    wait = max(1, round(timeout))
    script = (f"command -v sinfo >/dev/null 2>&1 || exit 0; {_HAS_CONF} || exit 0; "
              f"echo \"{MARK}ping $(timeout {wait} scontrol ping 2>&1 | tr '\\n' ' ')\"; "
              f"timeout {wait} sinfo --noheader --Node --format='%N %T' 2>/dev/null | sed 's/^/{MARK}node /'; "
              f"echo \"{MARK}cred $(timeout {wait} munge -n 2>&1 | tr -d '\\n')\"")
    try:
        _, output = transports[login.name].call(["/bin/sh", "-c", script], 3 * wait + 5)
    except (OSError, LabError):
        return None
    said = [line[len(MARK):] for line in output.splitlines() if line.startswith(MARK)]
    if not said:
        return None
    answers = SlurmAnswers(login.name, next((s[5:].strip() for s in said if s.startswith("ping ")), ""))
    for line in said:
        if line.startswith("node ") and len(parts := line.split()) == 3:
            answers.states[parts[1]] = parts[2]
    credential = next((s[5:].strip() for s in said if s.startswith("cred ")), "")
    if credential.startswith("MUNGE:"):
        decode = (f"out=$(printf %s {shlex.quote(credential)} | timeout {wait} unmunge 2>&1 >/dev/null); "
                  f"echo \"{MARK}$? $out\" | tr -d '\\n'")

        def decoded(transport: Transport) -> str | None:
            _, out = transport.call(["/bin/sh", "-c", decode], wait + 5)
            status, _, why = out[out.find(MARK) + len(MARK):].partition(" ") if MARK in out else ("", "", out)
            return None if status == "0" else (why.strip() or "no answer")

        for name, outcome in for_each_host(transports, decoded).items():
            answers.decoded[name] = f"not asked: {outcome}" if isinstance(outcome, Exception) else outcome
    return answers


_CONTROLLER = re.compile(r"Slurmctld\(\w+\) at (\S+) is (UP|DOWN)")


def findings(answers: SlurmAnswers, hosts: Sequence[Host]) -> list[Finding]:
    """The problems in ``answers``, each with its cause and fix, or one note that Slurm is well."""
    found: list[Finding] = []
    up = _CONTROLLER.search(answers.ping)
    controller = up[1] if up else "the controller"
    if not up or up[2] != "UP":
        found.append(Finding("error", "slurm", answers.login,
                             f"slurmctld does not answer: {answers.ping or 'no reply'}",
                             "no job can start while the controller is down or unreachable",
                             f"start slurmctld on {controller} (in the lab: `python -m lab up --scheduler slurm` "
                             f"again); its log: /var/log/slurm/slurmctld.log"))
    for host in hosts:
        state = answers.states.get(host.name)
        if answers.states and state is None:
            found.append(Finding("error", "slurm", host.name, "is not a node of this Slurm cluster",
                                 f"sinfo on {answers.login} lists {', '.join(sorted(answers.states))}",
                                 "name the inventory's hosts as Slurm names its nodes (`sinfo -N`)"))
        why = answers.decoded.get(host.name)
        down = f" (Slurm has the node {state})" if state is not None and state not in WORKING else ""
        if why is None and down:  # (with munge failing there, that is why: one finding, its cause)
            found.append(Finding("error", "slurm", host.name, f"Slurm has the node {state}",
                                 "slurmd there does not answer slurmctld, or the node was drained or set down",
                                 f"start slurmd on {host.name} (its log: /var/log/slurmd.log), then "
                                 f"`scontrol update nodename={host.name} state=resume` as root"))
        if why is not None:
            other_key = "Invalid credential" in why or "decode" in why.lower()
            found.append(Finding(
                "error", "slurm", host.name,
                f"munge there cannot decode a credential made on {answers.login}: {why}",
                ("its munge key is not the cluster's: slurmctld rejects everything it sends" if other_key else
                 "munged does not run there, or does not answer") + down,
                "give every host the same munge key (/etc/munge/munge.key) and restart munged (in the lab: "
                "`python -m lab up --scheduler slurm` again)" if other_key else f"start munged on {host.name}"))
    if not found:
        states = sorted({answers.states.get(h.name, "?") for h in hosts})
        found.append(Finding("info", "slurm", "cluster",
                             f"Slurm: slurmctld on {controller} answers; {len(hosts)} node(s) {', '.join(states)}; "
                             f"every host's munge decodes {answers.login}'s credentials"))
    return found
