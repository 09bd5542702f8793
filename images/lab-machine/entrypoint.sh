#!/bin/sh
# Start a test machine: its dockerd in the background (overlay2 on the /var/lib/docker volume,
# its containers' cgroups under /dind-HOSTNAME), then sshd in the foreground.
set -eu
[ -f /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
rm -f /var/run/docker.pid /var/run/docker/containerd/containerd.pid
dockerd --storage-driver overlay2 --cgroup-parent "/dind-$(hostname)" >/var/log/dockerd.log 2>&1 &
exec /usr/sbin/sshd -D -e
