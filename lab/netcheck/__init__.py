"""The network's checks as data and rules, pure: what each host's probe found (``model``) and what
that says of the job the hosts would run (``rules``). The preflight (lab.core.preflight) and the
doctor (lab.doctor) judge with them."""
