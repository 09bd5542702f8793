"""Transports: how a command reaches a host (``local``, ``ssh``, ``docker``, ``slurm``; the interface
in ``base``); ``reach`` picks one from the host's ``connection``. A transport that reads host keys
of its own declares them beside it, in a light module (``lab.transport.ssh.keys``,
``lab.transport.docker.keys``); ``local`` and ``slurm`` read none but the inventory's own.

This file imports nothing, so that a transport's declaration of its keys can be imported without
the transports themselves (paramiko, the Docker SDK).
"""
