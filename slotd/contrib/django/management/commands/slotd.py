"""`manage.py slotd run | status | prune_results`: slotd's worker and tools on the database
Django's TASKS backend writes to (its DATABASE alias in DATABASES), with nothing else to
configure."""

from __future__ import annotations

import argparse
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from slotd.contrib.django.worker import QUEUES_ENV
from slotd.errors import ConfigError

APP = "slotd.contrib.django.worker:registry"


def _queues(args: list[str]) -> tuple[list[str], list[str]]:
    """`--queue NAME` / `--queue=NAME` (repeatable) taken out of the arguments for slotd."""
    rest, queues = [], []
    it = iter(args)
    for arg in it:
        if arg == "--queue":
            name = next(it, None)
            if name is None:
                raise CommandError("--queue needs a queue name", returncode=2)
            queues.append(name)
        elif arg.startswith("--queue="):
            queues.append(arg.removeprefix("--queue="))
        else:
            rest.append(arg)
    return rest, queues


class Command(BaseCommand):
    help = (
        "slotd on the database in DATABASES. run [--queue NAME ...] [--slots N ...]: the "
        "worker (the options of `slotd run`; --queue, repeatable: only these queues); "
        "status [--json]: pending / running / dead per queue; prune_results: "
        "delete finished task results older than RESULT_RETENTION now."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["run", "status", "prune_results"])
        parser.add_argument("slotd_args", nargs=argparse.REMAINDER, help="passed on to slotd")

    def handle(self, *_: Any, action: str, slotd_args: list[str], **options: Any) -> None:
        args, queues = _queues(slotd_args) if action == "run" else (slotd_args, [])
        if queues:
            # Read by build_registry() in every process of the worker (slots, runners).
            os.environ[QUEUES_ENV] = ",".join(queues)
        from slotd.contrib.django import configured, database

        try:
            backends = configured.slotd_backends()
            if not backends:
                raise ConfigError("no TASKS backend is slotd.contrib.django.SlotdBackend")
            if action == "prune_results":
                self._prune(backends, args)
                return
            alias = configured.database_alias(backends)
            configured.require_migrated(alias)
            url = database.conninfo(alias)
            schema = configured.schema_of(alias)
            given = os.environ.get("SLOTD_SCHEMA", "").strip()
            if given and given != schema:
                raise ConfigError(
                    f"SLOTD_SCHEMA {given!r} is not the TASKS backends' schema {schema!r} "
                    "(OPTIONS SCHEMA): unset one of them"
                )
        except ConfigError as exc:
            raise CommandError(str(exc), returncode=2) from None
        # Every process of the worker (slots, runners) reads its schema from here.
        os.environ["SLOTD_SCHEMA"] = schema
        # An explicit SLOTD_DATABASE_URL still wins (a pooler in front, say); `slotd run`
        # warns when it names another database than DATABASES does.
        os.environ.setdefault("SLOTD_DATABASE_URL", url)
        from slotd.cli import main

        argv = ["run", "--app", APP, *args] if action == "run" else [action, *args]
        main.main(args=argv, prog_name="manage.py slotd")

    def _prune(self, backends: list[Any], args: list[str]) -> None:
        if args:
            raise ConfigError(f"prune_results takes no arguments; got {args}")
        for backend in backends:
            pruned = backend.results.prune(backend.result_retention)
            self.stdout.write(
                f"pruned {pruned} task results of TASKS[{backend.alias!r}] older than "
                f"{backend.result_retention}"
            )
