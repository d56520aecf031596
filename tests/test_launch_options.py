"""The mirror job's copying mode as every launcher passes it: continuous once caught up unless
told otherwise, batch after batch with ``--no-continuous``, through ``mirrorflow mirror``'s flags,
:func:`mirrorflow.runtime.launch.mirror_command` (the DAGs, the tests, the benchmarks) and the
job's own argument parser."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from mirrorflow import cli
from mirrorflow.runtime import launch

FLOW = "primary->secondary"


def job_parse(command: list[str]):
    """The job's own parse of the arguments ``command`` gives it."""
    parse_args = runpy.run_path(str(launch.MIRROR_JOB))["parse_args"]
    return parse_args(command[command.index(str(launch.MIRROR_JOB)) + 1 :])


@pytest.mark.parametrize(("continuous", "expected"), [(None, True), (True, True), (False, False)])
def test_a_job_copies_continuously_unless_a_launcher_says_no_continuous(
    tmp_path: Path, continuous: bool | None, expected: bool
):
    command = launch.mirror_command([tmp_path / "mm2.properties"], FLOW, continuous=continuous)
    assert ("--no-continuous" in command) is (continuous is False)
    assert job_parse(command).continuous is expected


@pytest.mark.parametrize(("flag", "expected"), [([], None), (["--no-continuous"], False)])
def test_mirrorflow_mirror_passes_its_copying_mode_to_the_job(
    flag: list[str], expected: bool | None
):
    parser = cli.build_parser()
    args = parser.parse_args(["mirror", "mm2.properties", "--flow", FLOW, *flag])
    assert args.continuous is expected


@pytest.mark.parametrize("once", [False, True])
def test_only_a_job_that_ends_once_copied_delays_c2_compilation(tmp_path: Path, once: bool):
    """A ``--once`` job pays every JIT compilation within its short life: its driver and
    executors compile with C2 only what runs ten times HotSpot's counts. A continuous job keeps
    HotSpot's defaults, so that at a small load its copy reaches C2's code within seconds."""
    command = launch.mirror_command([tmp_path / "mm2.properties"], FLOW, once=once)
    conf = dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf")
    assert job_parse(command).once is once
    for role in ("driver", "executor"):
        options = conf[f"spark.{role}.extraJavaOptions"].split()
        assert "-XX:+UseParallelGC" in options
        assert ("-XX:Tier4InvocationThreshold=50000" in options) is once, options
