"""Configuration precedence and refusal messages."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bridge.cli import build_parser
from bridge.config import ConfigError, load_agent_config


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["agent", *argv])


def test_defaults_and_required_sink() -> None:
    with pytest.raises(ConfigError, match="at least one sink"):
        load_agent_config(parse(), {})
    config = load_agent_config(parse("--sink", "stdout:"), {})
    assert config.imds_url == "http://169.254.169.254"
    assert config.api_version == "2020-07-01"
    assert config.listen == "127.0.0.1:8710"
    assert config.poll_interval == 1.0
    assert config.outbox_max_bytes == 64 << 20


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text(
        'poll_interval = 3\nlog-level = "debug"\n[agent]\nsinks = ["file:///from/file.jsonl"]\n'
        'outbox_max_bytes = "1M"\n[approver]\nanything = 1\n'
    )
    env = {
        "SE_BRIDGE_CONFIG": str(file),
        "SE_BRIDGE_POLL_INTERVAL": "2",
        "SE_BRIDGE_SINK": "stdout: file:///x.jsonl",
    }
    config = load_agent_config(parse(), env)
    assert config.poll_interval == 2.0 and config.log_level == "debug"
    assert config.sink == ("stdout:", "file:///x.jsonl")
    assert config.outbox_max_bytes == 1 << 20
    assert config.sources["poll_interval"] == "environment variable SE_BRIDGE_POLL_INTERVAL"
    config = load_agent_config(parse("--poll-interval", "0.5", "--sink", "stdout:"), env)
    assert config.poll_interval == 0.5 and config.sink == ("stdout:",)
    assert config.sources["log_level"] == str(file)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--poll-interval", "0"], {}, "poll_interval: expected a number from 0.1 to 60 (got '0' from flag"),
        ([], {"SE_BRIDGE_API_VERSION": "2021-01-01"}, "api_version: expected one of 2017-03-01"),
        (["--imds-url", "https://169.254.169.254"], {}, "imds_url: expected http://"),
        (["--listen", "8710"], {}, "listen: expected HOST:PORT"),
        (["--outbox-max-bytes", "12"], {}, "outbox_max_bytes: expected a size"),
        (["--imds-max-rps", "50"], {}, "imds_max_rps"),
        (["--log-level", "loud"], {}, "log_level"),
    ],
)
def test_bad_values_name_the_setting_and_the_source(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_agent_config(parse("--sink", "stdout:", *argv), env)
    assert message in str(info.value)


def test_toml_typos_and_syntax_are_refused(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text("pol_interval = 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'pol_interval'"):
        load_agent_config(parse("--config", str(file), "--sink", "stdout:"), {})
    file.write_text("poll_interval = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_agent_config(parse("--config", str(file), "--sink", "stdout:"), {})
    with pytest.raises(ConfigError, match="does not exist"):
        load_agent_config(parse("--config", str(tmp_path / "missing.toml"), "--sink", "stdout:"), {})


def test_help_explains_environment_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["agent", "--help"])
    out = capsys.readouterr().out
    assert "SE_BRIDGE_POLL_INTERVAL" in out and "Default: 1.0" in out and "SIGTERM" in out
