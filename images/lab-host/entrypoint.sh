#!/bin/sh
# Start a lab host: make this container's own host key, then run sshd in the foreground.
set -eu
# The shared directory (a volume on every host) is writable by all, like /tmp.
[ -d /shared ] && chmod 1777 /shared
[ -f /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
# LAB_SSH_PORT: another port than 22, for a host in its machine's own network (lab up --network host).
exec /usr/sbin/sshd -D -e ${LAB_SSH_PORT:+-p "$LAB_SSH_PORT"}
