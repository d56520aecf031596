"""``mirrorflow validate|explain|plan|convert``: MirrorMaker 2 flow files, checked and explained.

FILE arguments are MM2 ``.properties`` files or mirrorflow YAML files (``.yaml``/``.yml``),
merged in order as one configuration. Secrets never appear in the output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from mirrorflow.config import flowfiles, mm1, validation
from mirrorflow.config.topology import Flow, Role, Setting, load_topology
from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2 import configdefs

_EXIT_CODES = "exit codes: 0 no findings, 1 warnings only, 2 errors (or a file that cannot be read)"


def register(commands: argparse._SubParsersAction) -> None:
    validate = commands.add_parser(
        "validate",
        help="check flow files offline; one line per finding",
        description="Check MirrorMaker 2 flow files as a whole before anything runs.",
        epilog=_EXIT_CODES,
    )
    _files(validate)
    _clusters(validate)
    _json(validate)
    validate.set_defaults(handler=_validate)

    explain = commands.add_parser(
        "explain",
        help="show a flow's effective settings and the layer each comes from",
        description="Show every effective setting of one flow, layered as MirrorMaker 2 does.",
    )
    _files(explain)
    explain.add_argument("flow", metavar="SOURCE->TARGET", help="the flow, e.g. primary->backup")
    explain.add_argument(
        "--master",
        default="local[*]",
        help="the Spark master the job would run on, for its Spark security settings "
        "(default local[*])",
    )
    _json(explain)
    explain.set_defaults(handler=_explain)

    plan = commands.add_parser(
        "plan",
        help="connect to the clusters and show what each enabled flow would replicate",
        description="Per enabled flow: each source topic with its remote name, partitions and "
        "whether the remote exists; each consumer group; everything left out and why.",
    )
    _files(plan)
    _clusters(plan)
    plan.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for a cluster (default 10)"
    )
    _json(plan)
    plan.set_defaults(handler=_plan)

    convert = commands.add_parser(
        "convert",
        help="turn a properties flow file into YAML or back, or MirrorMaker 1's command into "
        "a flow file",
        description="Convert between MM2 properties and mirrorflow's YAML form, or MirrorMaker "
        "1's command line (--consumer.config, --producer.config, --include or --whitelist) "
        "into a flow file.\n\n"
        + (flowfiles.__doc__ or "").split("\n\n", 1)[1]
        + "\n"
        + (mm1.__doc__ or "").split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    convert.add_argument("file", metavar="FILE", type=Path, nargs="?")
    one = convert.add_argument_group("MirrorMaker 1 (kafka-mirror-maker.sh's options)")
    one.add_argument("--consumer.config", dest="consumer_config", type=Path, metavar="FILE")
    one.add_argument("--producer.config", dest="producer_config", type=Path, metavar="FILE")
    one.add_argument("--include", metavar="REGEX", help="the topics (a Java regex; ',' for '|')")
    one.add_argument("--whitelist", metavar="REGEX", help="--include's old name")
    one.add_argument("--num.streams", dest="num_streams", type=int, metavar="N")
    one.add_argument(
        "--offset.commit.interval.ms", dest="offset_commit_interval_ms", type=int, metavar="MS"
    )
    one.add_argument("--abort.on.send.failure", dest="abort_on_send_failure", metavar="BOOL")
    one.add_argument("--source", default="source", help="the source cluster's name in the flow")
    one.add_argument("--target", default="target", help="the target cluster's name in the flow")
    convert.add_argument(
        "--to", choices=("yaml", "properties"), help="target syntax (default: the other one)"
    )
    convert.add_argument(
        "--include-secrets",
        action="store_true",
        help="write secret values as they are (default: masked, with a note on stderr)",
    )
    convert.set_defaults(handler=_convert)


def _files(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", metavar="FILE", nargs="+", type=Path, help="flow files")


def _clusters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--clusters",
        nargs="+",
        metavar="ALIAS",
        help="nearby target clusters, as MM2's --clusters: only flows into them",
    )


def _json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _print_json(data: object) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _validate(args: argparse.Namespace) -> int:
    topology = load_topology(args.files, args.clusters)
    findings = validation.validate(topology)
    errors = sum(f.severity == "error" for f in findings)
    notes = validation.notes(topology) if not errors else []
    if args.json:
        _print_json(
            {
                "findings": [f.to_dict() for f in findings],
                "errors": errors,
                "warnings": len(findings) - errors,
                "flows": [f.name for f in topology.flows],
                "notes": notes,
            }
        )
    else:
        for finding in findings:
            print(finding)
        for note in notes:
            print(f"note: {note}")
        flows = ", ".join(f.name for f in topology.flows) or "none"
        print(f"{errors} errors, {len(findings) - errors} warnings; flows that replicate: {flows}")
    return validation.exit_code(findings)


def _explain(args: argparse.Namespace) -> int:
    from mirrorflow.runtime import spark_security

    flow = load_topology(args.files).flow(args.flow)
    security = spark_security.for_master(args.master)
    clients = {role: flow.client_settings(role) for role in _ROLES}
    settings = {
        k: s for k, s in sorted(flow.config.items()) if not k.startswith(("source.", "target."))
    }
    if args.json:
        _print_json(
            {
                "flow": flow.name,
                "replicates": flow.enabled,
                "settings": {k: _setting_json(k, s) for k, s in settings.items()},
                "clients": {
                    role: {k: _setting_json(k, s) for k, s in sorted(items.items())}
                    for role, items in clients.items()
                },
                "spark": {
                    "master": security.master,
                    "settings": security.conf,
                    "properties_file": str(security.properties_file or "") or None,
                    "exposes": security.exposes,
                },
            }
        )
        return 0
    state = "replicates" if flow.enabled else "does not replicate"
    print(f"flow {flow.name} {state} ({_why(flow)})")
    print(f"(defaults are those of MirrorMaker 2 {configdefs.kafka_version()})")
    _print_settings("connector settings", settings)
    for role, items in clients.items():
        _print_settings(f"{role} client", dict(sorted(items.items())))
    _print_spark(security)
    return 0


def _print_spark(security) -> None:
    print(f"spark security (master {security.master}):")
    extra = {"--properties-file": str(security.properties_file)} if security.properties_file else {}
    settings = {**extra, **security.conf}
    width = max(len(k) for k in settings)
    for key, value in settings.items():
        print(f"  {key:<{width}} = {value}")
    for line in security.exposes:
        print(f"  exposes: {line}")


_ROLES: tuple[Role, ...] = (
    "source.consumer",
    "source.admin",
    "source.producer",
    "target.producer",
    "target.admin",
    "target.consumer",
)


def _why(flow: Flow) -> str:
    if flow.name not in flow.topology.herder_pairs:
        return "MM2 starts no herder for it: neither enabled nor emitting heartbeats"
    return f"enabled = {configdefs.redact('enabled', flow.config['enabled'].value)}"


def _setting_json(key: str, setting: Setting) -> dict[str, object]:
    return {
        "value": configdefs.redact(key, setting.value),
        "layer": setting.layer,
        "location": str(setting.location) if setting.location else None,
        "key": setting.source_key,
    }


def _print_settings(title: str, settings: dict[str, Setting]) -> None:
    print(f"{title}:")
    width = max((len(k) for k in settings), default=0)
    for key, setting in settings.items():
        value = configdefs.redact(key, setting.value) or '""'
        print(f"  {key:<{width}} = {value}    <- {setting.describe()}")


def _plan(args: argparse.Namespace) -> int:
    from mirrorflow.replication.plan import build_plan

    plan = build_plan(load_topology(args.files, args.clusters), timeout=args.timeout)
    if args.json:
        _print_json(plan.to_dict())
    else:
        sys.stdout.write(plan.render())
    return 0


def _convert(args: argparse.Namespace) -> int:
    mirror_maker_1 = args.consumer_config or args.producer_config or args.include or args.whitelist
    if mirror_maker_1:
        return _convert_mirror_maker_1(args)
    if args.file is None:
        raise MirrorflowError(
            "convert needs a flow file, or MirrorMaker 1's --consumer.config, "
            "--producer.config and --include",
            "see mirrorflow convert --help",
        )
    source_is_yaml = args.file.suffix in flowfiles.YAML_SUFFIXES
    target = args.to or ("properties" if source_is_yaml else "yaml")
    topology = load_topology([args.file])
    definitions = topology.definitions
    if not args.include_secrets:
        masked = [d for d in definitions if configdefs.redact(d.key, d.value) != d.value]
        definitions = [
            dataclasses.replace(d, value=configdefs.redact(d.key, d.value)) for d in definitions
        ]
        if masked:
            keys = ", ".join(dict.fromkeys(d.key for d in masked))
            print(
                f"mirrorflow: note: secret values masked ({keys}); move them to a config "
                "provider (${file:...}, ${env:...}) or pass --include-secrets",
                file=sys.stderr,
            )
    write = flowfiles.to_yaml if target == "yaml" else flowfiles.to_properties
    sys.stdout.write(write(definitions, topology.aliases))
    return 0


def _convert_mirror_maker_1(args: argparse.Namespace) -> int:
    """MirrorMaker 1's options as a flow file on stdout (properties unless ``--to yaml``), each
    note on stderr."""
    if args.file is not None:
        raise MirrorflowError(
            f"convert takes a flow file ({args.file}) or MirrorMaker 1's options, not both",
            "drop one",
        )
    missing = [
        flag
        for flag, value in (
            ("--consumer.config", args.consumer_config),
            ("--producer.config", args.producer_config),
        )
        if value is None
    ]
    if missing:
        raise MirrorflowError(
            f"MirrorMaker 1's {' and '.join(missing)} missing",
            "give the files kafka-mirror-maker.sh ran with",
        )
    command = mm1.Mm1Command(
        consumer_config=args.consumer_config,
        producer_config=args.producer_config,
        include=args.include,
        whitelist=args.whitelist,
        num_streams=args.num_streams,
        offset_commit_interval_ms=args.offset_commit_interval_ms,
        abort_on_send_failure=args.abort_on_send_failure,
    )
    converted = mm1.convert(command, args.source, args.target)
    for note in converted.notes:
        print(f"mirrorflow: note: {note}", file=sys.stderr)
    write = flowfiles.to_yaml if args.to == "yaml" else flowfiles.to_properties
    sys.stdout.write(write(converted.definitions, converted.aliases))
    return 0
