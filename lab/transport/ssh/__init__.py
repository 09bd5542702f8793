"""The SSH transport (paramiko): ``transport`` reaches a host and runs its ranks, ``connections``
logs in to it and keeps its connections alive, ``config`` says where the host is,
``known_hosts`` checks its key; ``keys`` declares the host keys it reads (port, user, key file,
known_hosts file).

This file imports nothing, so that importing a light module of the package does not load paramiko.
"""
