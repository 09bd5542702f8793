"""The container lab: hosts as containers on a Docker engine, each with its own address and sshd.

``topology`` (names, networks, addresses; pure), ``engine`` (the Docker engine and distro tools),
``image`` (the host image), ``hosts`` (starting, listing and removing the lab), ``crossvpc`` (the
NAT gateway between two private networks).
"""
