"""The container lab: hosts as containers on a Docker engine, each with its own address and sshd,
or across Docker machines joined in a Swarm.

One lifecycle for both (``lifecycle``: up, down, status and its one row type), found by
``labs.find_lab``: ``engine_lab`` (this machine's engine) and ``machines_lab`` (the machines of
``machines``, joined by ``swarm``). What they share: ``topology`` (names, networks, addresses;
pure), ``engine`` (the Docker engine and distro tools), ``image`` (the host image), ``resources``
(a lab's things, found by their labels), ``networks`` (subnets, networks, routes), ``sshd`` (the
lab's key, the hosts' keys, waiting for sshd), ``containers`` (one way to keep or start a host;
status, removal, the labs an engine runs), ``crossvpc`` (the NAT gateway between two private
networks).
"""
