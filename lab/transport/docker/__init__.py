"""The docker transport (the Docker SDK): ``transport`` runs a host's ranks in its container with
``docker exec``, ``keys`` declares the host keys it reads.

This file imports nothing, so that importing the declaration does not load the Docker SDK.
"""
