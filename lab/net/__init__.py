"""Networks the lab makes between hosts, whatever the hosts are: the WireGuard overlay (its
protocol-level parts in ``wireguard``, the steps in ``overlay``, on an inventory's hosts over SSH
in ``overlay_hosts``), and the choice of free subnets (``subnets``)."""
