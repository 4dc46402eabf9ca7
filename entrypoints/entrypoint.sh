#!/usr/bin/env bash
# Container entrypoint, run under dumb-init (PID 1: reaps zombies, forwards signals).
# It only prepares the environment and then `exec`s the command, so the trainer itself is
# the process that receives SIGTERM from `docker stop` and can write its checkpoint.
# On NGC bases the command is exec'd through NGC's own entrypoint (see run_command).
#
#   train [ARGS...]   (default) python -m trainer.launch train: one process, or torchrun per GPU
#   doctor [--json]   python -m trainer doctor: what this machine can do
#   bench [ARGS...]   python -m trainer bench
#   fetch [--json]    python -m trainer fetch: download the configured Hub model/tokenizer/data into /cache
#   export SRC OUT    python -m trainer export: a run/checkpoint -> a plain model folder (merged, verified)
#   push SRC REPO     python -m trainer push: upload a model folder to the Hub
#   data [ARGS...]    python -m trainer data: prepare the tokenized cache; --show N: what will be trained
#   generate MODEL    python -m trainer generate: chat with a model, or --input/--output a file of prompts
#   eval MODEL        python -m trainer eval: loss, perplexity and answer scores on --data, to --output DIR
#   shell [ARGS...]   bash
#   -ANYTHING ...     arguments for train
#   CMD [ARGS...]     any other command, run as given (e.g. `python my_script.py`)
set -euo pipefail

log() { printf '[trainkit] %s\n' "$*" >&2; }

# The container runs as the host user (any UID, usually without a passwd entry): give it a
# writable HOME, and a USER so that getpass.getuser() (torch, triton) does not fail.
prepare_user_env() {
    if [ -z "${HOME:-}" ] || [ "$HOME" = / ] || [ ! -w "$HOME" ]; then
        HOME="/tmp/home-$(id -u)"
        mkdir -p "$HOME"
        export HOME
    fi
    if [ -z "${USER:-}" ]; then
        USER="$(id -un 2>/dev/null || echo "uid$(id -u)")"
        export USER
    fi
    export LOGNAME="${LOGNAME:-$USER}"
}

prepare_user_env

cmd="${1:-train}"
if [ "$#" -gt 0 ]; then shift; fi
# Arguments of user commands may hold secrets: the log names the program only.
case "$cmd" in
    -*) set -- python -m trainer.launch train "$cmd" "$@"; what="python -m trainer.launch train" ;;
    train) set -- python -m trainer.launch train "$@"; what="python -m trainer.launch train" ;;
    doctor) set -- python -m trainer doctor "$@"; what="python -m trainer doctor" ;;
    bench) set -- python -m trainer bench "$@"; what="python -m trainer bench" ;;
    fetch) set -- python -m trainer fetch "$@"; what="python -m trainer fetch" ;;
    export) set -- python -m trainer export "$@"; what="python -m trainer export" ;;
    push) set -- python -m trainer push "$@"; what="python -m trainer push" ;;
    data) set -- python -m trainer data "$@"; what="python -m trainer data" ;;
    generate) set -- python -m trainer generate "$@"; what="python -m trainer generate" ;;
    eval) set -- python -m trainer eval "$@"; what="python -m trainer eval" ;;
    reproduce) set -- python -m trainer reproduce "$@"; what="python -m trainer reproduce" ;;
    shell) set -- bash "$@"; what="bash" ;;
    *) set -- "$cmd" "$@"; what="$cmd" ;;
esac

# NGC's entrypoint sources its entrypoint.d parts (among them CUDA forward compatibility: the image's newer
# libcuda from /usr/local/cuda/compat on older datacenter drivers) and then execs its arguments. Chain
# through it wherever the base has it; every step execs, so the command stays dumb-init's child and gets
# the signals. Its banner goes to stderr: stdout stays the command's own (doctor --json).
# TRAINKIT_NGC_ENTRYPOINT exists for tests, which point it at a stand-in script.
run_command() {
    local ngc="${TRAINKIT_NGC_ENTRYPOINT:-/opt/nvidia/nvidia_entrypoint.sh}"
    if [ -f "$ngc" ] && [ -x "$ngc" ]; then
        exec 3>&1 1>&2
        # shellcheck disable=SC2016  # expanded by the inner bash
        exec "$ngc" bash -c 'exec 1>&3 3>&-; exec "$@"' trainkit "$@"
    fi
    exec "$@"
}

log "uid $(id -u) gid $(id -g): running $what"
run_command "$@"
