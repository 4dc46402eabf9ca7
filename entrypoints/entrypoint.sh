#!/usr/bin/env bash
# Container entrypoint, run under dumb-init (PID 1: reaps zombies, forwards signals).
# It only prepares the environment and then `exec`s the command, so the trainer itself is
# the process that receives SIGTERM from `docker stop` and can write its checkpoint.
# On NGC bases the command is exec'd through NGC's own entrypoint (see run_command).
#
# The trainer's commands (trainer/commands.py; `train`, the default, through python -m trainer.launch: one process,
# or torchrun per GPU; every other as python -m trainer COMMAND):
# BEGIN commands (scripts/generate.py)
#   train [ARGS...]                   train with the TRAIN_* configuration (the default command)
#   config [--json]                   print the resolved configuration without training
#   doctor [--json]                   what this machine can do, and whether the configured run can work here
#   bench [ARGS...]                   measure techniques side by side (python -m trainer bench --help)
#   fetch [--json]                    download the configured Hub model, tokenizer and data into the cache (for offline
#                                     runs)
#   export SRC OUT                    turn a run, a checkpoint or final/ into a plain Transformers model folder (LoRA
#                                     merged, shards joined)
#   push SRC REPO                     upload a model folder (an export, or a run's final/) to a Hub repository
#   data [--show N]                   tokenize TRAIN_DATA into the cache ahead of a run; --show N prints what the run
#                                     trains on
#   generate MODEL                    chat with a model, or answer a file of prompts (--input/--output)
#   eval MODEL --data D --output DIR  score a model on your eval set: loss, perplexity, exact_match, contains
#   diff RUN_A RUN_B                  what differs between two runs' provenance and settings
#   serve OUT                         serve an export on an OpenAI-compatible API (llama.cpp for GGUF, vLLM for folders
#                                     and adapters)
#   check URL --against OUT           does an OpenAI-compatible endpoint answer as the export does? (prompts, answers,
#                                     stops)
#   reproduce OUTPUT_DIR              run a finished run again with the same settings and compare its per-step loss
# END commands
#   shell [ARGS...]                   bash
#   -ANYTHING ...                     arguments for train
#   CMD [ARGS...]                     any other command, run as given (e.g. `python my_script.py`)
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
        # `id -un` prints the bare number (and fails) for a UID without a name: that number is not taken
        USER="$(id -un 2>/dev/null)" || USER="uid$(id -u)"
        export USER
    fi
    export LOGNAME="${LOGNAME:-$USER}"
}

prepare_user_env

cmd="${1:-train}"
if [ "$#" -gt 0 ]; then shift; fi
in_list() {
    local word="$1" item
    shift
    for item in "$@"; do [ "$item" = "$word" ] && return 0; done
    return 1
}
# BEGIN command lists (scripts/generate.py)
launched_commands=(train)
trainer_commands=(config doctor bench fetch export push data generate eval diff serve check reproduce)
# END command lists
# Arguments of user commands may hold secrets: the log names the program only.
case "$cmd" in
    -*) set -- python -m trainer.launch train "$cmd" "$@"; what="python -m trainer.launch train" ;;
    shell) set -- bash "$@"; what="bash" ;;
    *)
        if in_list "$cmd" "${launched_commands[@]}"; then
            set -- python -m trainer.launch "$cmd" "$@"; what="python -m trainer.launch $cmd"
        elif in_list "$cmd" "${trainer_commands[@]}"; then
            set -- python -m trainer "$cmd" "$@"; what="python -m trainer $cmd"
        else
            set -- "$cmd" "$@"; what="$cmd"
        fi
        ;;
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
