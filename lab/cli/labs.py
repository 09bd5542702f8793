"""The container lab: ``up``, ``down``, ``status``, ``ls``, and what is done to a running lab: ``net``
(shaped links, peering), ``break`` and ``fix`` (classic failures, for real)."""
from __future__ import annotations

import argparse

from lab.cli.common import Commands, Parser, machines_option, name_option
from lab.cli.overlay import add_overlay, cmd_overlay
from lab.cli.running import run_and_report
from lab.cli.views import labs as views
from lab.cli.views import screen
from lab.containerlab import containers, crossvpc, engine, faults, shaping, state
from lab.containerlab.image import DEFAULT_BASE, OFFLINE
from lab.containerlab.labs import down_every_lab, find_lab, known_labs
from lab.containerlab.lifecycle import NETWORK_MODES, UpRequest
from lab.containerlab.topology import SCHEDULERS, TOPOLOGIES, HostLimits
from lab.core.plan import Options
from lab.errors import ExitCode, UsageError
from lab.inventory.hosts import load_inventory
from lab.suite import registry
from lab.transport.ssh.settings import SSHSettings

# -- up ---------------------------------------------------------------------------------------


def add_up(commands: Commands) -> None:
    up = commands.add_parser(
        "up", help="build the lab image and start the container lab, write its inventory, smoke-test it",
        description="Start a lab of hosts (containers with their own addresses and sshd) on the local "
                    "Docker engine, or across the Docker machines of --machines joined in a Swarm, write the "
                    "inventory for it, and run the p2p exercise across them.")
    up.add_argument("--hosts", type=int, metavar="N", help="hosts in the lab (default 4; with --machines: one "
                    "per machine, or each machine's lab_hosts)")
    up.add_argument("--slots", type=int, default=1, metavar="S", help="ranks per host in the inventory (default 1)")
    up.add_argument("--topology", choices=TOPOLOGIES, default="plain",
                    help="plain: one network; cross-vpc: two private networks joined only through a NAT "
                         "gateway, like two cloud VPCs (default plain)")
    up.add_argument("--peering", action="store_true", help="cross-vpc: route between the private networks")
    up.add_argument("--scheduler", choices=SCHEDULERS, default="none",
                    help="slurm: the hosts also form a Slurm cluster (slurmctld on node1, slurmd on every "
                         "host, munge with a key of the lab's own; plain topology) (default none)")
    up.add_argument("--base", default=DEFAULT_BASE, metavar="IMAGE",
                    help=f"base image (default {DEFAULT_BASE}); '{OFFLINE}' builds a Debian base with "
                         f"debootstrap, as happens when the base cannot be pulled")
    up.add_argument("--gpus", choices=("auto", "all", "none"), default="auto",
                    help="give the hosts the engine's GPUs (needs the NVIDIA container toolkit; "
                         "auto: when the engine has the nvidia runtime)")
    up.add_argument("--memory", type=int, default=HostLimits.memory_mb, metavar="MB",
                    help=f"memory each host's container may use (default {HostLimits.memory_mb})")
    up.add_argument("--pids", type=int, default=HostLimits.pids, metavar="N",
                    help=f"processes (and threads) each host may run (default {HostLimits.pids})")
    name_option(up)
    up.add_argument("--inventory", metavar="PATH", help="where to write the lab's inventory (default: "
                    "inventory.yaml for the lab named lab, NAME.inventory.yaml for the others)")
    up.add_argument("--no-smoke", action="store_true", help="skip the p2p run across the hosts")
    machines_options = up.add_argument_group("across Docker machines (README: Several machines)")
    machines_option(machines_options, "start the hosts across the Docker machines of FILE (an Ansible-style "
                    "inventory of machines), joined in a Swarm; the image goes to each by docker save | load")
    machines_options.add_argument("--network", choices=NETWORK_MODES, default="overlay",
                                  help="overlay: the hosts on an attachable overlay network, each at its own address "
                                       "(default); host: one host per machine, on the machine's own address")
    machines_options.add_argument("--accept-new-host-keys", action="store_true",
                                  help="trust and record a machine's SSH host key seen for the first time")
    up.set_defaults(handler=cmd_up)


def cmd_up(args: argparse.Namespace) -> int:
    request = UpRequest(args.hosts, args.slots, args.topology, args.scheduler, args.peering, args.network, args.base,
                        args.gpus, HostLimits(args.memory, args.pids), args.accept_new_host_keys)
    lab = find_lab(args.name, args.inventory, args.machines)
    console = screen.console()
    say = screen.sayer(console)
    working = "starting the lab" + (" across machines" if lab.across_machines else "")
    with state.locked(args.name, "up"), screen.working(console, working) as progress:
        inventory = lab.up(request, say, progress)
    if args.no_smoke:
        return ExitCode.OK
    if request.topology == "cross-vpc" and not request.peering:
        say("no smoke check: without peering the mesh cannot form (that is the point); "
            f"see `python -m lab run cross-vpc --hosts {inventory}`")
        return ExitCode.OK
    say("smoke check: p2p across the hosts")
    return run_and_report(load_inventory(inventory), Options(tuple(registry.select(["p2p"]))), SSHSettings())


# -- down, status, ls -------------------------------------------------------------------------


def add_down(commands: Commands) -> None:
    down = commands.add_parser("down", help="remove every container, network and volume of a lab")
    name_option(down)
    down.add_argument("--all", action="store_true", help="remove every lab on the engine")
    machines_option(down, "the lab is across the Docker machines of FILE: clean every one, and leave each "
                          "Swarm as lab up found it (default: the file `lab up --machines` was given)")
    down.set_defaults(handler=cmd_down)


def cmd_down(args: argparse.Namespace) -> int:
    say = screen.sayer(screen.console())
    if args.all:
        down_every_lab(say, args.machines)
    else:
        with state.locked(args.name, "down"):
            find_lab(args.name, machines=args.machines).down(say)
    return ExitCode.OK


def add_status(commands: Commands) -> None:
    status = commands.add_parser("status", help="show each lab host, its addresses and whether sshd answers "
                                                "(and, with Slurm, each node's state and munge key)")
    name_option(status)
    machines_option(status, "the lab is across the Docker machines of FILE (default: the file `lab up "
                            "--machines` was given)")
    status.set_defaults(handler=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    console = screen.console()
    lab = find_lab(args.name, machines=args.machines)
    status = lab.status()
    found = status.hosts
    if lab.across_machines:
        views.print_hosts_across_machines(console, args.name, found, status.unanswered)
        return ExitCode.OK if found and all(h.ssh for h in found) and not status.unanswered else ExitCode.UNREACHABLE
    if not found:
        raise UsageError(views.no_lab(args.name))
    views.print_hosts(console, found)
    problems: tuple[str, ...] = ()
    if status.slurm is not None:  # the lab's Slurm cluster: a row per node, and its problems
        views.print_slurm(console, status.slurm)
        problems = status.slurm.problems
    views.print_problems(console, problems)
    return ExitCode.OK if all(h.ssh for h in found) and not problems else ExitCode.UNREACHABLE


def add_ls(commands: Commands) -> None:
    ls = commands.add_parser("ls", help="list the labs on the Docker engine: name, topology, hosts, slots, state")
    ls.set_defaults(handler=cmd_ls)


def cmd_ls(args: argparse.Namespace) -> int:
    known = known_labs()
    views.print_labs(screen.console(), known.on_engine, known.across_machines)
    return ExitCode.OK


# -- net, break, fix --------------------------------------------------------------------------


def add_net(commands: Commands) -> None:
    net = commands.add_parser("net", help="shape the running lab's links (delay, jitter, loss, rate), peer its "
                                          "two private networks (cross-vpc), or join its hosts with a WireGuard "
                                          "overlay")
    net_commands = net.add_subparsers(dest="net_command", required=True, metavar="WHAT", parser_class=Parser)
    peering = net_commands.add_parser("peering", help="add or remove the route between the two private networks")
    peering.add_argument("state", choices=("on", "off", "show"))
    shape = net_commands.add_parser(
        "shape", help="give hosts' links a delay, jitter, loss or rate (in place of the shape they had)",
        description="Delay, jitter and loss apply once to each packet a shaped host exchanges with another (a "
                    "round trip grows by the delay of each shaped end, as with tc netem on both), the rate to what "
                    "it sends. A helper container with NET_ADMIN in each host's network namespace sets them (tc tbf "
                    "for the rate, an NFQUEUE for the rest); the hosts stay unprivileged. `lab net clear` takes "
                    "them away, `lab down` too.")
    shape.add_argument("hosts", nargs="*", metavar="HOST", help="node1 node2 ... or all (default: all)")
    shape.add_argument("--delay", metavar="TIME", help="added to every packet: 20ms, 500us, 1s")
    shape.add_argument("--jitter", metavar="TIME", help="each packet's delay varies by up to this, either way")
    shape.add_argument("--loss", metavar="PERCENT", help="the share of packets lost: 0.1%%")
    shape.add_argument("--rate", metavar="RATE", help="what a host sends, at most: 100mbit, 1gbit")
    show = net_commands.add_parser("show", help="each host's shape")
    clear = net_commands.add_parser("clear", help="take hosts' shapes away")
    clear.add_argument("hosts", nargs="*", metavar="HOST", help="node1 node2 ... or all (default: all)")
    name_option(net, peering, shape, show, clear, *add_overlay(net_commands))
    net.set_defaults(handler=cmd_net)


def cmd_net(args: argparse.Namespace) -> int:
    if args.net_command == "overlay":
        return cmd_overlay(args)
    wanted = shaping.parse_shape(args.delay, args.jitter, args.loss, args.rate) if args.net_command == "shape" else None
    client = engine.client()
    topology = containers.running_topology(client, args.name)
    say = screen.sayer(screen.console())
    if args.net_command == "peering":
        if args.state != "show":
            crossvpc.set_peering(client, topology, args.state == "on")
        say(f"lab {args.name}: peering is {'on' if crossvpc.peering(client, topology) else 'off'}")
    elif wanted is not None:
        shaping.shape(client, topology, shaping.host_indices(topology, args.hosts), wanted, say)
    elif args.net_command == "clear":
        shaping.clear(client, topology, shaping.host_indices(topology, args.hosts), say)
    else:
        views.print_shapes(shaping.shapes(client, topology))
    return ExitCode.OK


def add_break(commands: Commands) -> None:
    broken = commands.add_parser(
        "break", help="make a classic multi-node failure happen on a lab host, for real (`lab fix` undoes it)",
        epilog="\n".join(f"  {f.kind:18} {f.about}" for f in faults.FAULTS.values()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    name_option(broken)
    broken.add_argument("kind", choices=faults.KINDS, metavar="KIND", help=", ".join(faults.KINDS))
    broken.add_argument("hosts", nargs="*", metavar="HOST", help="node1 node2 ... or all (default: every host for "
                        "loopback-hostname, as Debian installs them; node1, MASTER_ADDR's host, for slow-dns and "
                        "port-taken; node2 otherwise)")
    broken.add_argument("--port", type=int, default=faults.DEFAULT_PORT, metavar="PORT",
                        help=f"port-taken: the port to hold (default {faults.DEFAULT_PORT}, the tutorials')")
    broken.set_defaults(handler=cmd_break)


def cmd_break(args: argparse.Namespace) -> int:
    client = engine.client()
    topology = containers.running_topology(client, args.name)
    fault = faults.FAULTS[args.kind]
    default = [name for name in fault.default_hosts if name in map(topology.name, topology.indices())] or ["all"]
    indices = shaping.host_indices(topology, args.hosts or default)
    faults.break_hosts(client, topology, args.kind, indices, args.port)
    screen.sayer(screen.console())(f"{', '.join(topology.name(i) for i in indices)}: broken: {fault.about}; a job "
                                   f"shows: {fault.shows} (`lab fix {args.kind}` mends it)")
    return ExitCode.OK


def add_fix(commands: Commands) -> None:
    fixed = commands.add_parser("fix", help="undo `lab break`: every fault on every host, or one kind")
    name_option(fixed)
    fixed.add_argument("kind", nargs="?", choices=faults.KINDS, metavar="KIND", help="default: every kind")
    fixed.add_argument("hosts", nargs="*", metavar="HOST", help="node1 node2 ... or all (default: all)")
    fixed.set_defaults(handler=cmd_fix)


def cmd_fix(args: argparse.Namespace) -> int:
    client = engine.client()
    topology = containers.running_topology(client, args.name)
    faults.fix(client, topology, [args.kind] if args.kind else faults.KINDS,
               shaping.host_indices(topology, args.hosts), screen.sayer(screen.console()))
    return ExitCode.OK
