#!/bin/sh
# Start this host's part of the lab's Slurm cluster (`lab up --scheduler slurm`, lab/containerlab/slurm.py).
# The lab's munge key comes on stdin: it is never in the image, nor in a file mounted into the
# container. slurm.conf is mounted at /etc/slurm/slurm.conf. Run as root, which here has no
# CAP_DAC_OVERRIDE: every file is made by root in a directory of root's, then given away.
# Idempotent: a daemon that runs already is left running.
set -eu
# DIR OWNER: a directory of OWNER's, made if it is missing (one the packages made is theirs already);
# its mode is set before it is given away (changing another's file's mode would need CAP_FOWNER)
directory() { [ -d "$1" ] || { mkdir -m 0755 "$1" && chown "$2:$2" "$1"; }; }
umask 077
[ -d /run/lab-munge ] || mkdir -m 0711 /run/lab-munge
cat > /run/lab-munge/munge.key.new
[ -s /run/lab-munge/munge.key.new ] || { echo "no munge key on stdin" >&2; exit 2; }
chmod 0400 /run/lab-munge/munge.key.new
chown munge:munge /run/lab-munge/munge.key.new
if [ -f /run/lab-munge/munge.key ] && runuser -u munge -- cmp -s /run/lab-munge/munge.key.new /run/lab-munge/munge.key
then
    rm -f /run/lab-munge/munge.key.new
else  # a first key, or another one: munged reads its key when it starts
    mv -f /run/lab-munge/munge.key.new /run/lab-munge/munge.key
    if pkill -x munged; then
        for _ in 1 2 3 4 5 6 7 8 9 10; do pgrep -x munged >/dev/null || break; sleep 0.2; done
    fi
fi
directory /run/munge munge
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged --key-file=/run/lab-munge/munge.key

umask 022
controller="$(sed -n 's/^SlurmctldHost=//p' /etc/slurm/slurm.conf)"
if [ "$(hostname)" = "$controller" ] && ! pgrep -x slurmctld >/dev/null; then
    for d in /var/spool/slurmctld /var/log/slurm /run/slurm; do directory "$d" slurm; done
    runuser -u slurm -- /usr/sbin/slurmctld
fi
directory /var/spool/slurmd root
pgrep -x slurmd >/dev/null || /usr/sbin/slurmd
