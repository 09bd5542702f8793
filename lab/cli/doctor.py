"""``doctor``: a cluster checked for what makes multi-node jobs fail or hang."""
from __future__ import annotations

import argparse

from lab.cli.common import Commands, add_command, check_timeout, cluster, cluster_options, ssh_settings
from lab.cli.views import screen
from lab.cli.views.doctor import print_diagnosis
from lab.doctor.run import diagnose
from lab.transport.reach import with_master_address


def add_doctor(commands: Commands) -> None:
    doc = add_command(
        commands, "doctor", help="check a cluster for what makes multi-node jobs fail or hang",
        description="Check every host and every pair: SSH, python/torch versions, GPUs/NCCL, name "
                    "resolution, the address gloo and NCCL advertise, MASTER_ADDR:MASTER_PORT, the "
                    "all-pairs mesh, NAT, address families. Exit 0 only when the cluster can run a job.")
    cluster_options(doc)
    doc.add_argument("--master-port", type=int, metavar="PORT", help="check this MASTER_PORT (default: a free one)")
    doc.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS", help="per connection (default 5)")
    doc.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    doc.set_defaults(handler=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    check_timeout(args.timeout)
    settings = ssh_settings(args)
    diagnosis = diagnose(with_master_address(cluster(args), settings), settings,
                         master_port=args.master_port, timeout=args.timeout)
    if args.json:
        screen.print_json(diagnosis.to_json())
    else:
        print_diagnosis(screen.console(), diagnosis)
    return diagnosis.exit_code
