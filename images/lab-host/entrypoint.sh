#!/bin/sh
# Start a lab host: make this container's own host key, start the lab user's warm start, then run
# sshd in the foreground.
set -eu
# The shared directory (a volume on every host) is writable by all, like /tmp.
[ -d /shared ] && chmod 1777 /shared
[ -f /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
# The warm start (lab/rank/warm.py): a server of the lab user's own that imports torch once, from
# which that user's launches under --launcher lab are forked. Its folder is the user's, in one of
# root's (root here has no CAP_DAC_OVERRIDE: made by root, then given away); it starts with a clean
# environment, to which it adds what the lab gives every launch, in a session of its own. A host
# without it still runs every launch, each importing torch itself.
if uid="$(id -u lab 2>/dev/null)" && [ -x /usr/local/bin/lab-python ]; then
    [ -d /run/lab-warm ] || mkdir -m 0755 /run/lab-warm
    [ -d "/run/lab-warm/$uid" ] || { mkdir -m 0700 "/run/lab-warm/$uid" && chown lab:lab "/run/lab-warm/$uid"; }
    setpriv --reuid lab --regid lab --init-groups \
        env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/home/lab PYTHONPATH=/opt/lab \
        setsid /usr/local/bin/lab-python -m lab.rank.warm serve "/run/lab-warm/$uid" </dev/null >/dev/null 2>&1 &
fi
# LAB_SSH_PORT: another port than 22, for a host in its machine's own network (lab up --network host).
exec /usr/sbin/sshd -D -e ${LAB_SSH_PORT:+-p "$LAB_SSH_PORT"}
