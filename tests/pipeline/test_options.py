"""A run's options, declared once: ``tickwheel run`` and the Spark engine's spark-submit
application take the same flags, ranges, defaults and help."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from tickwheel.cli import app
from tickwheel.cli.run import ClockKind
from tickwheel.pipeline.contract.options import (
    CLOCK,
    CLOCKS,
    RUN_OPTIONS,
    TRIGGER_MS,
    OptionSpec,
    follow_only_problem,
)
from tickwheel.pipeline.spark import job as spark_job

runner = CliRunner()
RANGED = [spec for spec in RUN_OPTIONS if spec.kind == "int"]


def _words(text: str) -> str:
    return " ".join(text.split())


def _run_params() -> dict[str, typer.core.TyperOption]:
    command = typer.main.get_command(app).commands["run"]
    return {param.opts[0]: param for param in command.params}


def test_the_spark_job_takes_every_run_option_with_its_default_and_help() -> None:
    parser = spark_job._parser()
    parsed = parser.parse_args([])
    text = _words(parser.format_help())
    for spec in RUN_OPTIONS:
        assert getattr(parsed, spec.dest) == spec.default, spec.flag
        assert _words(spec.help) in text, spec.flag


def test_run_takes_every_option_with_its_range_default_and_help() -> None:
    params = _run_params()
    for spec in RUN_OPTIONS:
        param = params[spec.flag]
        default = param.default.value if isinstance(param.default, ClockKind) else param.default
        assert default == spec.default, spec.flag
        assert (param.min, param.max) == (spec.minimum, spec.maximum), spec.flag
        assert param.help is not None and param.help.endswith(spec.help), spec.flag
        assert param.help.startswith(f"{spec.engine}: ") == (spec.engine is not None)
    assert params[TRIGGER_MS.flag].required is False
    assert [kind.value for kind in ClockKind] == list(CLOCKS)


def test_flags_take_their_no_form_at_both_front_doors() -> None:
    params = _run_params()
    parser = spark_job._parser()
    for spec in RUN_OPTIONS:
        if spec.kind == "flag":
            assert params[spec.flag].secondary_opts == ["--no-" + spec.flag[2:]]
            parsed = parser.parse_args(["--no-" + spec.flag[2:]])
            assert getattr(parsed, spec.dest) is False


@pytest.mark.parametrize("spec", RANGED, ids=[spec.flag for spec in RANGED])
@pytest.mark.parametrize("side", ["below", "above"])
def test_a_value_out_of_range_is_refused_by_both_front_doors_naming_the_flag(
        spec: OptionSpec[object], side: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert spec.minimum is not None and spec.maximum is not None
    value = str(spec.minimum - 1 if side == "below" else spec.maximum + 1)
    base = ["--input", str(tmp_path), "--output", str(tmp_path / "out")]
    if spec.flag == TRIGGER_MS.flag:
        base.append("--follow")
    result = runner.invoke(app, ["run", *base, spec.flag, value])
    assert result.exit_code == 2
    assert spec.flag in result.output
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "1")  # only the arguments stand in the way
    with pytest.raises(SystemExit) as exit:
        spark_job.main([*base, spec.flag, value])
    assert exit.value.code == 2
    bound = spec.minimum if side == "below" else spec.maximum
    assert re.search(rf"argument {spec.flag}: must be at (least|most) {bound}, got {value}",
                     capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_options_of_a_service_given_to_a_batch_are_named() -> None:
    assert follow_only_problem(follow=False, final=True, trigger_ms=TRIGGER_MS.default,
                               clock=CLOCK.default) is None
    assert follow_only_problem(follow=False, final=True, trigger_ms=5,
                               clock=CLOCK.default) == (
        "--trigger-ms and --clock apply to --follow only")
    assert follow_only_problem(follow=False, final=True, trigger_ms=TRIGGER_MS.default,
                               clock="wall") is not None
    problem = follow_only_problem(follow=True, final=False, trigger_ms=TRIGGER_MS.default,
                                  clock=CLOCK.default)
    assert problem is not None and problem.startswith("--no-final")


def test_a_metrics_port_given_to_a_batch_run_is_refused(tmp_path: Path) -> None:
    result = runner.invoke(app, ["run", "--input", str(tmp_path), "--output",
                                 str(tmp_path / "out"), "--metrics-port", "0"])
    assert result.exit_code == 2
    assert "--metrics-port applies to --follow only" in result.output
