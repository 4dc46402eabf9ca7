"""`python -m trainer serve OUT`: an export on an OpenAI-compatible API (/v1/chat/completions, /v1/completions,
/v1/models), through a kept server (trainer/serve/runtimes.py: llama.cpp's for a GGUF file, vLLM's for a model folder,
a compressed-tensors folder or an adapter on its base), never one of trainkit's own.

It picks what OUT holds that this environment can serve (--artifact when several fit, naming them), binds 127.0.0.1
unless --host says otherwise, prints the URL, a ready curl line and the `check` to run, and serves until SIGTERM or
Ctrl-C, which stop the server and every process it started (exit 128+N). A busy port, nothing servable, a runtime
this environment lacks or an adapter's missing base exit 2 with the fix, before anything starts.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from trainer.errors import ConfigError, Interrupted, raise_on_stop_signals
from trainer.export.artifacts import ADAPTER, LLAMA_CPP, Artifact, artifacts, export_folder, named, nothing_servable

DEFAULT_PORT = 8000
READY_TIMEOUT_S = 900.0  # vLLM's CPU build compiles for minutes where it is not eager; llama.cpp is ready in seconds


def register(parser: argparse.ArgumentParser) -> None:
    """`serve`'s arguments, on the parser trainer/__main__.py made for it (trainer/commands.py)."""
    parser.description = (
        "Serve an export folder on an OpenAI-compatible API: a GGUF file with llama.cpp's server, a model folder, a "
        "compressed-tensors folder or a LoRA adapter with vLLM's. Prints the URL and a curl line; SIGTERM or Ctrl-C "
        "stop it and everything it started."
    )
    parser.add_argument("out", metavar="OUT", help="an export folder (python -m trainer export RUN OUT)")
    parser.add_argument("--artifact", metavar="NAME", help="which of OUT's artifacts: model (the folder), a quantized "
                        "type (q8_0, q4_k_m, fp8, ...) or adapter; needed when several can be served")  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this "
                        "machine only; 0.0.0.0 for every interface)")  # fmt: skip
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    parser.add_argument("--base", metavar="FOLDER", help="an adapter's base model folder (default: the one its "
                        "adapter_config.json names)")  # fmt: skip
    parser.add_argument("--ready-timeout", type=float, default=READY_TIMEOUT_S, metavar="S",
                        help=f"seconds the server may take to load (default {READY_TIMEOUT_S:g})")  # fmt: skip
    parser.add_argument("--server-args", default="", metavar="ARGS", help="more arguments for the server, as one "
                        'string: --server-args="--n_ctx 8192"')  # fmt: skip
    parser.set_defaults(func=main)


def choose(out: Path, name: str | None) -> Artifact:
    """--artifact, else the one artifact this environment can serve; ConfigError naming them otherwise."""
    from trainer.serve.runtimes import missing

    found = artifacts(out)
    if not found:
        raise ConfigError(f"serve: {nothing_servable(out)}")
    if name is not None:
        artifact = named(found, name, out, "serve")
    else:
        fitting = [a for a in found if missing(a.runtime, "serve") is None] or found
        if len(fitting) > 1:
            listed = "; ".join(f"--artifact {a.name}: {a.shown} ({a.runtime})" for a in fitting)
            raise ConfigError(f"serve {out}: it holds several servable artifacts; pick one: {listed}")
        artifact = fitting[0]
    problem = missing(artifact.runtime, f"serve {out} ({artifact.describe()})")
    if problem:
        raise ConfigError(problem)
    return artifact


def adapter_base(artifact: Artifact, given: str | None) -> Path | None:
    """An adapter's base model folder (--base, else adapter_config.json's), which must be here."""
    if artifact.name != ADAPTER:
        return None
    base = given or artifact.base
    if not base or not (Path(base) / "config.json").is_file():
        raise ConfigError(f"serve {artifact.path}: the adapter's base model {base or '(none named)'} is not a model "
                          "folder here; give it with --base FOLDER (vLLM loads the adapter on it)")  # fmt: skip
    return Path(base).resolve()


def shown_url(host: str, port: int) -> str:
    reachable = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    return f"http://{reachable}:{port}/v1"


def curl_line(url: str, name: str, chat: bool) -> str:
    if chat:
        path, body = "chat/completions", {"model": name, "messages": [{"role": "user", "content": "Hello"}]}
    else:
        path, body = "completions", {"model": name, "prompt": "Hello"}
    return f"curl -s {url}/{path} -H 'Content-Type: application/json' -d {shlex.quote(json.dumps(body))}"


def _has_chat_template(out: Path) -> bool:
    config = out / "tokenizer_config.json"
    return (out / "chat_template.jinja").is_file() or (config.is_file() and "chat_template" in json.loads(
        config.read_text()))  # fmt: skip


def main(args: argparse.Namespace) -> int:
    from trainer.serve import process, runtimes

    out = export_folder(Path(args.out), "serve")
    artifact = choose(out, args.artifact)
    base = adapter_base(artifact, args.base)
    extra = shlex.split(args.server_args)
    process.check_port(args.host, args.port)
    name = artifact.served_name(out)
    argv = runtimes.command(artifact, name, args.host, args.port, base, extra)
    url = shown_url(args.host, args.port)
    raise_on_stop_signals()
    print(f"serve: starting {runtime_name(artifact)} on {artifact.shown} of {out}: {shlex.join(argv)}", flush=True)
    server = process.start(argv)
    try:
        seconds = process.wait_ready(server, url, args.ready_timeout)
        announce(out, artifact, name, url, args.host, seconds)
        print(f"serve: the server exited by itself with code {server.wait()}", file=sys.stderr)
        return 1
    except process.ServerFailed as exc:
        print(f"error: serve: {exc}", file=sys.stderr)
        return 1
    except Interrupted as stop:
        print(f"serve: {stop} received: stopping the server", file=sys.stderr, flush=True)
        process.stop(server)
        print(f"serve: stopped; no process of the server is left (exit {stop.exit_code})", file=sys.stderr)
        return stop.exit_code
    finally:
        process.stop(server)


def runtime_name(artifact: Artifact) -> str:
    return "llama.cpp's server" if artifact.runtime == LLAMA_CPP else "vLLM's server"


def announce(out: Path, artifact: Artifact, name: str, url: str, host: str, seconds: float) -> None:
    listening = " (listening on every interface)" if host in ("0.0.0.0", "::") else ""
    lines = [f"serve: {name} ({artifact.describe()}) ready at {url}{listening} after {seconds:.1f} s",
             f"  ask it:   {curl_line(url, name, _has_chat_template(out))}",
             f"  check it: python -m trainer check {url} --against {out}"]  # fmt: skip
    if artifact.modelfile is not None:
        lines.append(f"  Ollama:   ollama create {name} -f {artifact.modelfile}")
    print("\n".join(lines), flush=True)
