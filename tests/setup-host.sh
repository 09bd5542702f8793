#!/usr/bin/env bash
# What the test tiers need on this machine (`make test` runs this first): the Docker engine,
# debootstrap (the offline image), sshd (the SSH tier), a compose tool, a browser (chromium), node
# and Chrome DevTools' trace engine (the --trace files are loaded as a browser's tools load them). As
# root on Debian the missing ones are installed from the distro and dockerd is started, as `make lab-up` does;
# elsewhere this says what is missing, and the tiers that need it skip with the reason (under
# CI=true they fail instead).
set -uo pipefail

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 || need+=(docker-compose)
command -v chromium >/dev/null 2>&1 || need+=(chromium)  # (a real browser opens lab grade's class page)
command -v node >/dev/null 2>&1 || need+=(nodejs)  # (runs DevTools' trace engine on the --trace files)

can_install() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

if [ ${#need[@]} -gt 0 ]; then
  if can_install; then
    echo "lab: installing ${need[*]} from the distro (for the test tiers)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null || exit 1
  else
    echo "lab: missing ${need[*]} (Debian: sudo apt-get install ${need[*]}); the tiers that need them will skip"
  fi
fi

if command -v node >/dev/null 2>&1; then
  python3 "$(dirname "$0")/tools/trace_engine.py" install || echo "lab: could not fetch DevTools' trace engine (npm's registry); the --trace tests will skip"
fi

if command -v dockerd >/dev/null 2>&1 && ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "lab: starting dockerd (log: /var/log/lab-dockerd.log)"
    (setsid dockerd >>/var/log/lab-dockerd.log 2>&1 </dev/null &)
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "lab: dockerd did not answer; see /var/log/lab-dockerd.log"; exit 1; }
  else
    echo "lab: no Docker engine answers; start dockerd (the Docker tier will skip)"
  fi
fi
exit 0
