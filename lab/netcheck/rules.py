"""What the probes' reports mean: every failed check with its likely cause and fix. Pure.

:func:`analyse` turns the hosts' reports into :class:`~lab.netcheck.model.Finding` s, errors
first; :func:`hang_causes` sums them up for a run that hung at its start.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from lab.netcheck.model import SEVERITIES, Diagnosis, Finding, HostReport, Master
from lab.rank.netfacts import (
    Link,
    Target,
    family,
    is_loopback,
)

SLOW_LOOKUP = 1.0  # seconds: a name lookup slower than this stalls init noticeably

SAME_NETWORK_FIX = ("put the hosts on one network or peer the VPCs (a route between the private ranges); "
                    "or join them with an overlay: on a lab `python -m lab net overlay up` (a WireGuard mesh) and "
                    "run on the inventory it writes, elsewhere WireGuard or Tailscale with each host's data_address "
                    "and network_interface (GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME) the overlay's (wg0, tailscale0). "
                    "MASTER_ADDR at the external address alone is not enough: each rank still advertises its "
                    "private one")
PORTS_FIX = ("open TCP between the hosts for MASTER_PORT (the store) and gloo's ports (ephemeral: "
             "net.ipv4.ip_local_port_range, usually 32768-60999) on the interface gloo uses, or set "
             "network_interface to an interface every host reaches")
NO_NETWORK_CAUSE = ("the network checks pass (every host reaches MASTER_ADDR and every peer's advertised "
                    "address): the hang is likely in the program (a rank that skips a collective, or waits "
                    "for a message nobody sends)")


def analyse(reports: Sequence[HostReport], master: Master) -> list[Finding]:
    """Every finding, errors first; pure."""
    findings = [*_reach_findings(reports), *_version_findings(reports), *_gpu_findings(reports),
                *_resolution_findings(reports), *_interface_findings(reports), *_family_findings(reports, master),
                *_master_findings(reports, master), *_mesh_findings(reports), *_nat_findings(reports),
                *_large_message_findings(reports), *_busy_findings(reports)]
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


def spans_machines(reports: Sequence[HostReport]) -> bool:
    """Whether the hosts are more than one network stack (a host not heard from counts as its own)."""
    machines = {r.facts.machine for r in reports if r.facts is not None}
    return len(machines) > 1 or any(r.facts is None and not r.host.is_local for r in reports)


def master_endpoint(master: Master, report: HostReport) -> Master:
    """The port every host tries for MASTER_ADDR: MASTER_PORT where rank 0's host could
    listen on it, else its probe's own listener."""
    if report.facts is None:
        return master
    return Master(master.host, master.address, report.facts.master_port or report.facts.port, master.requested_port)


def plan_targets(reports: Sequence[HostReport], master: Master) -> dict[str, list[Target]]:
    """What each host (with facts) connects to: MASTER_ADDR, every other host's advertised
    address (its own too when it runs several ranks: they connect to each other through
    it), and a peer's data_address where that differs from what it advertises."""
    ready = [r for r in reports if r.facts is not None]
    plans: dict[str, list[Target]] = {}
    for source in ready:
        targets = [Target("master", master.host, master.address, master.port)] if master.port else []
        for peer in ready:
            assert peer.facts is not None
            if peer is source and peer.host.slots < 2:
                continue
            advertised = peer.facts.gloo.address
            if advertised:
                targets.append(Target("mesh", peer.name, advertised, peer.facts.port))
            data = peer.host.peer_address
            if data != advertised and peer is not source:
                targets.append(Target("data", peer.name, data, peer.facts.port))
        plans[source.name] = targets
    return plans


def _reach_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    for r in reports:
        if r.unreachable:
            yield Finding("error", "reach", r.name, f"unreachable: {r.unreachable}",
                          "the transport could not log in to the host or find its container",
                          "check that the host is up and that ansible_host, ansible_port, ansible_user and the key "
                          "are right (a new host key needs --accept-new-host-keys)")
        elif r.failure:
            yield Finding("error", "probe", r.name, r.failure,
                          "the host was reached, but the lab's probe could not run there or stopped answering",
                          f"check that ansible_python_interpreter ({r.host.python}) is a Python 3 on {r.name}")


def _version_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    pythons = {r.name: ".".join(r.facts.python.split(".")[:2]) for r in reports if r.facts}
    torches = {r.name: r.runtime.torch.split("+")[0] for r in reports if r.runtime and r.runtime.torch}
    for r in reports:
        if r.runtime is not None and r.runtime.torch is None:
            python = r.facts.executable if r.facts and r.facts.executable else r.host.python
            usual = _most_common(torches)
            yield Finding("error", "versions", r.name, f"torch is not importable by {python}: {r.runtime.torch_error}",
                          "a rank cannot start without torch",
                          f"install torch{' ' + usual if usual else ''} for that Python, or set "
                          f"ansible_python_interpreter to the Python that has it")
    for what, versions, cause in (
            ("Python", pythons, "objects the ranks pickle for each other (the *_object collectives, mp.spawn) "
                                "may not load across Python versions"),
            ("torch", torches, "ranks on different torch versions may disagree at the rendezvous or on the wire: "
                               "init fails or hangs")):
        if len(set(versions.values())) > 1:
            usual = _most_common(versions)
            yield Finding("error", "versions", "cluster", f"{what} differs between hosts: {_grouped(versions)}",
                          cause, f"install the same {what} on every host (most have {usual})")


def _most_common(values: dict[str, str]) -> str | None:
    counts: dict[str, int] = {}
    for value in values.values():
        counts[value] = counts.get(value, 0) + 1
    return max(counts, key=lambda v: counts[v]) if counts else None


def _grouped(values: dict[str, str]) -> str:
    """``2.13.0 on a, b; 2.12.1 on c``."""
    groups: dict[str, list[str]] = {}
    for name, value in values.items():
        groups.setdefault(value, []).append(name)
    return "; ".join(f"{value} on {', '.join(names)}" for value, names in groups.items())


def _gpu_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    short = []
    for r in reports:
        if r.runtime is None or r.runtime.torch is None:
            continue
        seen = r.runtime.cuda_devices
        if r.host.gpus > seen:
            yield Finding("warning", "gpus", r.name,
                          f"the inventory says gpus: {r.host.gpus}, but torch sees {seen} GPU(s)"
                          + (f" ({r.runtime.cuda_error})" if r.runtime.cuda_error else ""),
                          "a CPU-only torch build, a missing driver, or GPUs not given to the container",
                          "correct gpus in the inventory, or install a CUDA build of torch and the driver")
        if seen < r.host.slots:
            short.append(f"{r.name} ({seen} for {r.host.slots} slot{'s' if r.host.slots > 1 else ''})")
    if short:
        yield Finding("info", "gpus", "cluster", f"fewer GPUs than ranks on {', '.join(short)}: runs use gloo "
                      "(nccl needs one GPU per rank)")


def _resolution_fix(r: HostReport) -> str:
    hostname = r.facts.hostname if r.facts else r.name
    return (f"map {hostname} to its routable address in /etc/hosts on {r.name} "
            f"('{r.host.peer_address} {hostname}'), or set network_interface (GLOO_SOCKET_IFNAME) "
            f"to the interface the other hosts reach")


def _resolution_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    several = spans_machines(reports)
    for r in reports:
        if r.facts is None:
            continue
        facts = r.facts
        if "GLOO_SOCKET_IFNAME" not in facts.env and several and facts.gloo.address and is_loopback(facts.gloo.address):
            if facts.resolved.answer and is_loopback(facts.resolved.answer[0]):
                message = (f"its hostname {facts.hostname} resolves to {facts.resolved.answer[0]} (loopback): "
                           f"gloo advertises it, so peers would connect to themselves")
                cause = ("a default /etc/hosts line ('127.0.1.1 hostname' on Debian and Ubuntu); the rendezvous "
                         "completes, then the first collective hangs")
            else:
                why = facts.resolved.error or f"it gives {', '.join(facts.resolved.answer) or 'nothing'}"
                message = (f"its hostname {facts.hostname} resolves to no address of {r.name} ({why}): "
                           f"gloo falls back to {facts.gloo.address}, which peers cannot reach")
                cause = ("gloo advertises the address the hostname resolves to; the rendezvous completes, "
                         "then the mesh hangs")
            yield Finding("error", "resolve", r.name, message, cause, _resolution_fix(r))
        slow = [lookup for lookup in (facts.resolved, *facts.reverse, *r.heard) if lookup.seconds > SLOW_LOOKUP]
        if slow:
            what = ("reverse lookups stall init" if any(lookup is not facts.resolved for lookup in slow)
                    else "resolving the hostname stalls init")
            details = ", ".join(f"{'getaddrinfo' if lookup is facts.resolved else 'gethostbyaddr'}({lookup.query}) "
                                f"took {lookup.seconds:.1f}s" for lookup in slow)
            yield Finding("warning", "lookup", r.name,
                          f"slow name resolution: {what} ({details})",
                          "a DNS server that does not answer for these names; the store and gloo look names up "
                          "at init (seen: about 20s)",
                          "give every host's address a name in /etc/hosts on every host (or fix the DNS server), "
                          "so lookups answer at once")


def _interface_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    for r in reports:
        if r.facts is None:
            continue
        names = ", ".join(f"{i.name} {i.addresses[0]}" for i in r.facts.interfaces
                          if i.addresses and not is_loopback(i.addresses[0])
                          and not i.addresses[0].startswith("fe80:")) or "none but loopback"
        from_inventory = r.host.network_interface is not None
        setting = f"network_interface {r.host.network_interface}" if from_inventory else "GLOO_SOCKET_IFNAME"
        fix = (f"set network_interface of {r.name} in the inventory to one of its interfaces that the other "
               f"hosts reach (it has: {names})" if from_inventory else
               f"unset GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME on {r.name} or name one of its interfaces ({names})")
        if r.facts.gloo.error:
            yield Finding("error", "interface", r.name,
                          f"{setting} ({r.facts.gloo.how}): {r.facts.gloo.error} on {r.name}",
                          "gloo cannot make its device: init_process_group fails on this host", fix)
        gpus = r.host.gpus > 0 or (r.runtime is not None and r.runtime.cuda_devices > 0)
        same_setting = r.facts.env.get("NCCL_SOCKET_IFNAME") == r.facts.env.get("GLOO_SOCKET_IFNAME")
        if r.facts.nccl.error and gpus and not (r.facts.gloo.error and same_setting):
            yield Finding("error", "interface", r.name, f"NCCL: {r.facts.nccl.error} on {r.name}",
                          "NCCL cannot bootstrap: init_process_group('nccl') fails on this host", fix)


def _family_findings(reports: Sequence[HostReport], master: Master) -> Iterable[Finding]:
    advertised = {r.name: r.facts.gloo.address for r in reports if r.facts and r.facts.gloo.address}
    families = {name: family(address) or "?" for name, address in advertised.items()}
    kinds = set(families.values()) - {"?"}
    if len(kinds) > 1:
        yield Finding("error", "family", "cluster",
                      "hosts advertise addresses of both families: "
                      + "; ".join(f"{n} {advertised[n]} ({f})" for n, f in families.items()),
                      "gloo connects each pair address to address: an IPv6 address cannot reach an IPv4-only one",
                      "make every hostname resolve to an address of one family (/etc/hosts), or set "
                      "network_interface to interfaces with IPv4 addresses")
    master_family = family(master.address) or next(
        (family(link.peer_ip) for r in reports for link in r.links if link.target.kind == "master" and link.peer_ip),
        None)
    if master_family and len(kinds) == 1 and master_family not in kinds:
        yield Finding("warning", "family", "cluster", f"MASTER_ADDR {master.address} is {master_family} but the "
                      f"hosts advertise {kinds.pop()} addresses",
                      "the store and gloo's mesh then use different networks: one may be reachable and not the other",
                      f"set data_address of {master.host} to an address of the family the hosts advertise")


def _why(link: Link, source: str) -> str:
    """The likely cause of one failed connection, from how it failed."""
    target = link.target
    return {
        "refused": f"{target.address} answers but nothing listens on port {target.port}: the address is not "
                   f"{target.peer}'s, or a firewall rejects the port",
        "timeout": "no answer: a firewall drops the traffic, or there is no route between the networks",
        "unreachable": f"no route from {source} to {target.address}: the hosts are on different networks",
        "resolve": f"{target.address} does not resolve on {source}",
        "wrong-host": f"{target.address} leads to {link.answered_by}, not {target.peer}: that address is another "
                      f"host's (the same private range in two networks?)",
        "no-probe": f"another program answers on {target.address}:{target.port}",
    }.get(link.failure or "", link.error or "the connection failed")


def _master_findings(reports: Sequence[HostReport], master: Master) -> Iterable[Finding]:
    home = next(r for r in reports if r.name == master.host)
    if home.facts is not None and home.facts.master_port_error:
        yield Finding("error", "master", master.host, f"MASTER_PORT {master.requested_port} cannot be used on "
                      f"{master.host}: {home.facts.master_port_error}",
                      "another job, or a rank left from an earlier run, holds the port",
                      f"choose another port, or stop what holds it (ss -ltnp 'sport = :{master.requested_port}')")
    fix = (f"set data_address of {master.host} to an address every host reaches (same network, VPC peering, or an "
           f"overlay such as WireGuard/Tailscale) and open TCP port {master.port} (the store) on {master.host}")
    failed = [(r.name, link) for r in reports for link in r.links if link.target.kind == "master" and not link.reached]
    tried = [r for r in reports if any(link.target.kind == "master" for link in r.links)]
    if failed and len(failed) == len(tried) > 1:
        yield Finding("error", "master", "cluster",
                      f"no host reaches MASTER_ADDR {master.address}:{master.port} ({failed[0][1].error})",
                      f"{_why(failed[0][1], failed[0][0])}; every rank's init_process_group waits for the store "
                      f"until its timeout", fix)
    else:
        for name, link in failed:
            yield Finding("error", "master", name,
                          f"cannot reach MASTER_ADDR {master.address}:{master.port}: {link.error}",
                          _why(link, name), fix)
    if home.facts is not None and family(master.address) and not is_loopback(master.address) \
            and master.address not in home.facts.addresses:
        own = ", ".join(sorted(a for a in home.facts.addresses if not is_loopback(a)))
        yield Finding("info", "master", master.host,
                      f"MASTER_ADDR {master.address} is not an address {master.host} has ({own}): "
                      f"hosts reach it through NAT or a forwarded port",
                      "the store listens on every address, so the rendezvous works that way; but each rank "
                      "advertises an address it has, not this one")


def _mesh_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    failed: dict[str, list[tuple[str, Link]]] = {}
    other_way: dict[str, set[str]] = {}  # peer -> addresses of it that someone reached (data_address, MASTER_ADDR)
    for r in reports:
        for link in r.links:
            if link.target.kind == "mesh" and not link.reached:
                failed.setdefault(link.target.peer, []).append((r.name, link))
            elif link.target.kind != "mesh" and link.ok:
                other_way.setdefault(link.target.peer, set()).add(link.target.address)
    findings, kinds = [], set()
    for peer, links in failed.items():
        sources = ", ".join(name for name, _ in links)
        link = links[0][1]
        address = link.target.address
        message = (f"{sources} cannot reach {peer} at {address}:{link.target.port}, the address gloo advertises "
                   f"there ({link.error})")
        if is_loopback(address):
            kinds.add("loopback")
            cause = f"{peer} advertises a loopback address: each peer connects to itself"
            fix = _resolution_fix(next(r for r in reports if r.name == peer))
        elif other_way.get(peer, set()) - {address}:
            kinds.add("private")
            reached = ", ".join(sorted(other_way[peer] - {address}))
            cause = (f"{peer} is reachable as {reached}, but gloo advertises {address}, an address of its own "
                     f"network that the others cannot route to (different networks or VPCs, NAT)")
            fix = SAME_NETWORK_FIX
        else:
            kinds.add("blocked")
            cause, fix = _why(link, links[0][0]), PORTS_FIX
        findings.append(Finding("error", "mesh", f"-> {peer}", message, cause, fix))
    tried = [link for r in reports for link in r.links if link.target.kind == "master"]
    if failed and tried and all(link.reached for link in tried):
        private = "private" in kinds or any(True for _ in _nat_findings(reports))
        fix = (SAME_NETWORK_FIX if private else PORTS_FIX if "blocked" in kinds
               else "make each host advertise a routable address (see each host's finding)")
        yield Finding("error", "mesh", "cluster",
                      f"the store (MASTER_ADDR) is reachable but ranks advertise {'private ' if private else ''}"
                      f"addresses other hosts cannot reach: the rendezvous will connect, then the mesh hangs",
                      "init_process_group reaches the store at MASTER_ADDR, then every pair of ranks connects "
                      "directly, to the address each one advertises", fix)
    yield from findings


def _nat_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    for r in reports:
        if r.facts is None:
            continue
        seen: dict[str, set[str]] = {}
        for link in r.links:
            if link.ok and link.seen and not is_loopback(link.seen) and link.seen not in r.facts.addresses:
                seen.setdefault(link.seen, set()).add(link.target.peer)
        if not seen:
            continue
        believed = r.facts.gloo.address or ", ".join(sorted(r.facts.addresses))
        by = "; ".join(f"{address} by {', '.join(sorted(peers))}" for address, peers in seen.items())
        yield Finding("warning", "nat", r.name,
                      f"{r.name} is seen as {', '.join(seen)} but believes it is {believed}: behind NAT ({by})",
                      "its peers see another address than the one it has; gloo and NCCL advertise the address a "
                      "host has, which peers outside its network cannot reach",
                      SAME_NETWORK_FIX)


MTU_FIX = ("set the MTU of the interface the data goes over to what the path carries (find it with `ping -M do -s "
           "SIZE PEER`; `ip link set dev IF mtu N`; on a lab overlay `lab net overlay up --mtu N`), or let ICMP "
           "'fragmentation needed' through so TCP finds it itself")


def _large_message_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    """Connections whose handshake passed while a large message did not. With none of it
    acknowledged, packets above some size are lost on the way (the MTU black hole): one error,
    naming the host every such pair has in common where there is one; with part of it, a slow link."""
    lost = [(r.name, link) for r in reports for link in r.links if link.ok and link.large_error]
    # (none acknowledged while the kernel sent it again: the network's own word; a peer too busy to read
    # still has its kernel acknowledge what arrives)
    black_hole = [(name, link) for name, link in lost if link.large_acked == 0 and link.large_resent]
    if black_hole:
        pairs = sorted({(name, link.target.peer) for name, link in black_hole})
        common = set.intersection(*({a, b} for a, b in pairs))
        subject = min(common) if len(common) == 1 else "cluster"
        shown = "; ".join(f"{a} -> {b}" for a, b in pairs)
        yield Finding("error", "mtu", subject,
                      f"small messages pass but large ones do not: {black_hole[0][1].large_error}, none of its "
                      f"bytes acknowledged ({shown})" + (f": every such pair has {subject}" if common else ""),
                      "packets above some size are lost on the way while the small ones pass: the path carries "
                      "less than the interfaces' MTU and no 'fragmentation needed' comes back (a tunnel or overlay "
                      "under them); init completes, then the first large tensor hangs", MTU_FIX)
    for name, link in lost:
        if (name, link) not in black_hole:
            acked = "" if link.large_acked is None else f" ({link.large_acked} of its bytes acknowledged)"
            yield Finding("warning", "mtu", f"{name} -> {link.target.peer}",
                          f"the handshake passes, but {link.large_error}{acked}",
                          "the link is slow or loses packets: large tensors will take long",
                          "check the link's rate and loss (`lab net show` on a lab)")


def _busy_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    """Connections the network carried to a peer too busy to answer them in time: a warning, never a
    stop (the network is fine; the check of who answered could not be made)."""
    for r in reports:
        for link in r.links:
            if link.failure == "slow":
                yield Finding("warning", "busy", f"{r.name} -> {link.target.peer}",
                              f"{link.target.address}:{link.target.port} took the connection ({link.error})",
                              f"{link.target.peer}'s launcher is busy (a loaded machine, torch being imported): "
                              f"the network carried the connection, but who answered was not checked",
                              "nothing to fix in the network; `lab doctor` on a quieter moment checks who answers")


def hang_causes(diagnosis: Diagnosis) -> list[str]:
    """Short lines: the likely causes of a hang at the rendezvous or the first collective
    (errors, and the warnings that slow or break init), each fix said once."""
    lines, fixes = [], set()
    for f in diagnosis.findings:
        if f.severity == "error" or (f.severity == "warning" and f.check in ("lookup", "nat", "family")):
            lines.append(f"{f.subject}: {f.message}" + (f"; fix: {f.fix}" if f.fix and f.fix not in fixes else ""))
            fixes.add(f.fix)
    return lines or [NO_NETWORK_CAUSE]

