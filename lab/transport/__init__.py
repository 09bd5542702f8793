"""Transports: how a command reaches a host (``local``, ``ssh``, ``docker``, ``slurm``; the interface
in ``base``); ``reach`` picks one from the host's ``connection``.

This file imports nothing, so that a light module of a transport (the host keys it declares,
``lab.transport.ssh.keys``) can be imported without the transports themselves (paramiko, the Docker
SDK).
"""
