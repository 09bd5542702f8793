#!/bin/sh
# Start a test machine: its dockerd in the background (overlay2 on the /var/lib/docker volume,
# its containers' cgroups under /dind-HOSTNAME), then sshd in the foreground. Where the test put
# TLS files in /etc/lab-machine/tls (ca.pem, cert.pem, key.pem), the engine also answers on
# tcp://:2376, to clients with a certificate of that CA only (--tlsverify).
set -eu
[ -f /etc/ssh/ssh_host_ed25519_key ] || ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
rm -f /var/run/docker.pid /var/run/docker/containerd/containerd.pid
tls=/etc/lab-machine/tls
set --
[ -f "$tls/ca.pem" ] && set -- -H unix:///var/run/docker.sock -H tcp://0.0.0.0:2376 --tlsverify \
  --tlscacert "$tls/ca.pem" --tlscert "$tls/cert.pem" --tlskey "$tls/key.pem"
dockerd --storage-driver overlay2 --cgroup-parent "/dind-$(hostname)" "$@" >/var/log/dockerd.log 2>&1 &
exec /usr/sbin/sshd -D -e
