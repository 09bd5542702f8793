"""The inventory's room: which hosts the lab runs on, read from an Ansible-style file and held in
one model.

- ``model``: the hosts and the inventory (``Host``, ``Inventory``), data only and the standard
  library only;
- ``keys``: how a host's variables are declared (``Key``) and their values read and checked: what
  each transport declares the keys it reads with, beside its own code (``lab.transport.ssh.keys``,
  ``lab.transport.docker.keys``);
- ``ansible``: the reader of Ansible's YAML layout (groups, inheritance, bounds, ``file:line``
  errors), given a table of keys (the machines file is read by it too);
- ``hosts``: the inventory's table of keys (``HOST_KEYS``: the transports' declarations and the
  inventory's own keys, merged), the reading of an inventory file into the model
  (``load_inventory``) and the writing of one (``inventory_text``).

The room stands on two floors (``tests/test_layout.py``): ``model`` and ``keys`` lie below the
transports, which import them; the reading lies with ``lab.core``, above the transports'
declarations it reads. This file imports nothing, so importing the model loads no reader.
"""
