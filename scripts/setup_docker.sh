#!/usr/bin/env bash
# The host set-up shared by scripts/quickstart.sh and tests/run.sh (one copy, not two):
#   bash scripts/setup_docker.sh [more-apt-packages...]
# On Debian/Ubuntu with root (or sudo): installs docker.io when dockerd is missing, python3-venv when Python's venv
# is missing, and the packages given (tests/run.sh adds debootstrap, slurm-wlm, docker-registry), then starts
# dockerd when no engine answers. Elsewhere (macOS, Windows, other Linux) it says in one line how to get Docker.
# Says what it does; exits 1 when it cannot give this machine a working engine.
set -euo pipefail
say() { printf '== %s\n' "$*"; }
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else SUDO="none"; fi   # sudo may ask for your password
fi
can_apt() { command -v apt-get >/dev/null && [ "$SUDO" != none ]; }
GET_DOCKER="get Docker: Docker Desktop (macOS, Windows: https://docs.docker.com/get-docker/), or on Linux your \
distribution's docker package (Debian/Ubuntu: sudo apt-get install docker.io), then run this again"

need_apt=("$@")
command -v dockerd >/dev/null || docker info >/dev/null 2>&1 || need_apt+=(docker.io)
python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  if can_apt; then
    say "installing ${need_apt[*]} (apt-get, as $([ -z "$SUDO" ] && echo root || echo sudo))"
    ${SUDO:+$SUDO} apt-get update -qq
    DEBIAN_FRONTEND=noninteractive ${SUDO:+$SUDO} apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  elif [[ " ${need_apt[*]} " == *" docker.io "* ]]; then
    echo "No Docker Engine on this machine, and no apt-get with root or sudo to install one: $GET_DOCKER." >&2
    exit 1
  else
    echo "missing ${need_apt[*]} and no apt-get with root or sudo to install them: install them, then run this again" >&2
    exit 1
  fi
fi

if ! docker info >/dev/null 2>&1; then
  if ! command -v dockerd >/dev/null || [ "$SUDO" = none ]; then
    echo "The Docker Engine does not answer (\`docker info\` fails) and cannot be started from here: start it \
(Docker Desktop, or \`sudo systemctl start docker\`), or $GET_DOCKER." >&2
    exit 1
  fi
  say "starting dockerd (log: /var/log/trainkit-dockerd.log)"
  ${SUDO:+$SUDO} sh -c 'nohup dockerd >/var/log/trainkit-dockerd.log 2>&1 &'
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /var/log/trainkit-dockerd.log" >&2; exit 1; }
fi
