"""The ``parley`` command: one entry point, one module per subcommand.

Each subcommand lives in the module that owns the concept and exposes
``add_arguments(parser)`` and ``run(args) -> int``; this file only dispatches,
importing a module when its command is used so ``parley status`` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("infra.local.stack_cli", "start the local stack (Kafka, Cassandra, Redis) and the service"),
    "down": ("infra.local.stack_cli", "stop every process that `parley up` started"),
    "status": ("infra.local.stack_cli", "show each service's address and version; exit 0 only when all answer"),
    "topics": ("infra.local.topology", "create missing topics and correct partitions/retention"),
    "migrate": ("infra.stores.cql.cli", "apply the versioned CQL migrations"),
    "user": ("infra.stores.accounts_cli", "manage accounts: `parley user create --plan free|paid` prints a token"),
    "token": ("infra.stores.tokens_cli", "API tokens: `parley token list --user U`, `parley token revoke ID`"),
    "worker": ("infra.local.worker_cli", "run one generation worker for a model pool"),
    "stages": ("infra.local.stages_cli", "run the pipeline stages (admission, prompt, scheduler, persistence, ...)"),
    "gateway": ("producers.gateway.cli", "run one HTTP gateway"),
    "supervise": ("infra.local.supervisor", "run one service process, restarting it when it exits (`up` uses it)"),
    "chat": ("producers.chat_cli", "a terminal chat client: stream a reply, Ctrl-C stops it"),
    "capacity": ("infra.planning.capacity", "the seed's capacity model, with your own inputs"),
    "lab": ("infra.planning.lab.cli", "the batching lab: simulate one replica and the fleet spike"),
    "report": ("infra.local.report", "a PNG of the last minutes from Prometheus: TTFT, tokens/s, queue, KV use"),
    "loadtest": ("infra.local.loadtest_cli", "play the seeds' traffic over HTTP/SSE and measure it (--scenario: sim)"),
    "billing": ("streams.billing", "`parley billing replay --since ISO [--until ISO]`: audit usage against the stores"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="parley", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    argv = sys.argv[1:] if argv is None else argv
    wanted = argv[0] if argv else None
    for name, (module_name, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text)
        cmd.set_defaults(_module=module_name)
        if name == wanted:  # import only the module that will run
            importlib.import_module(module_name).add_arguments(cmd, name)
    args = parser.parse_args(argv)
    module = importlib.import_module(args._module)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
