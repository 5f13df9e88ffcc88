"""Configuration precedence, refusal messages, and every setting declared once (on its dataclass)."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

import pytest

import bridge.agent.config as agent_config
import bridge.approver.config as approver_config
from bridge.agent.config import AgentConfig, load_agent_config
from bridge.approver.config import ApproverConfig, load_approver_config
from bridge.azure.config import AzureChannelConfig, load_azure_channel_config
from bridge.cli import build_parser
from bridge.settings import ConfigBase, ConfigError, Setting, settings_of


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


COMMANDS = {AgentConfig: "agent", ApproverConfig: "approver", AzureChannelConfig: "azure-channel"}


@pytest.mark.parametrize("config_class", list(COMMANDS))
def test_every_setting_is_declared_once_on_its_dataclass(config_class: type[ConfigBase]) -> None:
    """Issue 10: each field carries its own metadata; the flags, variables, TOML keys and tables are
    derived from it, so no setting (nor its default) is declared a second time anywhere."""
    names = [f.name for f in fields(config_class) if f.name != "sources"]
    settings = settings_of(config_class)
    assert [s.name for s in settings] == names
    for s in settings:
        assert s.flag == "--" + s.name.replace("_", "-")
        assert s.env == config_class.env_prefix + s.name.upper() and s.env.startswith("SE_BRIDGE_")
        assert s.toml_key == s.name
        assert s.help and s.metavar
        assert s.multiple == isinstance(s.default, tuple)
    for attribute in ("flag", "env", "toml_key"):
        assert len({getattr(s, attribute) for s in settings}) == len(settings), attribute
    # The defaults are the dataclass's: a config built from nothing holds exactly them.
    built = config_class()
    assert {s.name: s.default for s in settings} == {name: getattr(built, name) for name in names}
    # The command line offers exactly these flags, each with its variable named in --help.
    command = COMMANDS[config_class]
    sub = next(a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction))
    actions = {a.dest: a for a in sub.choices[command]._actions if a.dest not in ("help", "config")}
    assert list(actions) == names
    for s in settings:
        assert actions[s.name].option_strings == [s.flag]
        assert f"Env: {s.env}." in (actions[s.name].help or "")


def test_the_tables_are_derived_not_declared() -> None:
    assert settings_of(AgentConfig) is agent_config.AGENT_SETTINGS
    assert settings_of(ApproverConfig) is approver_config.APPROVER_SETTINGS
    for module, table in (
        (agent_config, agent_config.AGENT_SETTINGS),
        (approver_config, approver_config.APPROVER_SETTINGS),
    ):
        tables = [
            v for v in vars(module).values() if isinstance(v, tuple) and v and isinstance(v[0], Setting)
        ]
        assert tables == [table]
    # A field declared without setting(...) is a bug caught at once, not a setting without a flag.
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Undeclared(ConfigBase):
        plain: int = 1

    with pytest.raises(TypeError, match=r"Undeclared\.plain is not declared with setting"):
        settings_of(Undeclared)


def test_every_setting_can_come_from_each_source(tmp_path: Path) -> None:
    """The derived flag, variable and TOML key of every setting reach the loader (one sample value)."""
    samples = {"sink": "stdout:", "source": "stdin:", "state_dir": str(tmp_path)}
    for config_class, loader, command in (
        (AgentConfig, load_agent_config, "agent"),
        (ApproverConfig, load_approver_config, "approver"),
    ):
        required = [("--sink", "stdout:")] + ([("--source", "stdin:")] if command == "approver" else [])
        base = [arg for pair in required for arg in pair]
        for s in settings_of(config_class):
            value = samples.get(s.name) or _sample(s)
            file = tmp_path / "c.toml"
            section = f"[{config_class.toml_section}]\n"
            file.write_text(f"{section}{s.toml_key} = {_toml(s, value)}\n")
            from_file = loader(build_parser(command).parse_args([command, "--config", str(file), *base]), {})
            from_env = loader(build_parser(command).parse_args([command, *base]), {s.env: value})
            from_flag = loader(build_parser(command).parse_args([command, *base, s.flag, value]), {})
            if s.name not in ("sink", "source"):  # given as a flag by every call above
                assert from_file.sources[s.name] == str(file)
                assert from_env.sources[s.name] == f"environment variable {s.env}"
            assert from_flag.sources[s.name] == f"flag {s.flag}"


def test_the_azure_channel_checks_its_subscriptions_and_needs_a_source_and_a_sink() -> None:
    def channel(*argv: str) -> argparse.Namespace:
        return build_parser("azure-channel").parse_args(["azure-channel", *argv])

    with pytest.raises(ConfigError, match=r"^source: a source is required"):
        load_azure_channel_config(channel(), {})
    with pytest.raises(ConfigError, match=r"graph_subscription.*subscription id"):
        bad = channel("--source", "file:///x", "--sink", "stdout:", "--graph-subscription", "../other")
        load_azure_channel_config(bad, {})
    loaded = load_azure_channel_config(
        channel("--source", "file:///x", "--sink", "stdout:"),
        {
            "SE_BRIDGE_AZURE_GRAPH_SUBSCRIPTION": "0F8FAD5B-D9CB-469F-A165-70867728950E",
            "SE_BRIDGE_AZURE_GRACE": "30",
        },
    )
    assert loaded.graph_subscription == ("0f8fad5b-d9cb-469f-a165-70867728950e",) and loaded.grace == 30


def test_approver_refuses_missing_source_and_sink_like_the_agent_its_sink() -> None:
    def approver(*argv: str) -> argparse.Namespace:
        return build_parser("approver").parse_args(["approver", *argv])

    with pytest.raises(ConfigError, match=r"^source: a decisions source is required"):
        load_approver_config(approver(), {})
    with pytest.raises(ConfigError, match=r"^sink: at least one sink for audit records is required"):
        load_approver_config(approver("--source", "stdin:"), {})
    config_ = load_approver_config(approver("--source", "stdin:"), {"SE_BRIDGE_APPROVER_SINK": "stdout:"})
    assert config_.sink == ("stdout:",) and config_.mode == "local"


#: Settings whose valid values follow from their name, not their kind.
SAMPLES_BY_NAME = {
    "api_version": "2019-08-01",
    "imds_url": "http://127.0.0.1:8080",
    "relay": "http://127.0.0.1:8080",
    "listen": "127.0.0.1:0",
    "arm": "fallback",
    "arm_endpoint": "https://management.usgovcloudapi.net",
    "arm_credential": "default",
    "peer": "vm-b=http://10.0.0.5:8710",
    "coordinate_on_deadline": "approve",
    "arm_scope": "/subscriptions/8d10da13-8125-4ba9-a717-bf7490507b3d/resourceGroups/rg-fleet",
}


def _sample(s: Setting) -> str:
    """A valid value for ``s``, different from its default where it matters little."""
    if s.metavar == "KEYID=PATH":
        return "k1=/etc/se-bridge/k1.key"
    if s.metavar == "RULE":
        return "source=User"
    if s.metavar == "BOOL":
        return "true"
    if s.metavar == "SIZE":
        return "1M"
    if s.name in SAMPLES_BY_NAME:
        return SAMPLES_BY_NAME[s.name]
    if s.metavar == "MODE":
        return "fleet"
    if s.metavar == "LEVEL":
        return "debug"
    if s.metavar in ("SECONDS", "N"):
        return "2"
    return "value"


def _toml(s: Setting, value: str) -> str:
    quoted = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"[{quoted}]" if s.multiple else quoted


def test_the_installer_gives_the_agent_the_approvers_public_decision_keys_only(capsys) -> None:  # type: ignore[no-untyped-def]
    """Issue 31: the agent proves every relayed decision with public keys; an approver key given as
    a PEM public key goes to the agent too, a shared (HMAC) one never (it could sign for every VM)."""
    from bridge.commands.install_config import give_agent_the_public_decision_keys
    from bridge.decisions import generate_key_pair

    _, public = generate_key_pair()
    secrets = {"approverKeys": {"ops-2027": public.decode(), "ops-2026": "s" * 40}}
    specs = ["ops-2026=/etc/se-bridge/keys/ops-2026.key", "ops-2027=/etc/se-bridge/keys/ops-2027.key"]
    agent: dict[str, object] = {}
    give_agent_the_public_decision_keys(agent, secrets, specs)
    assert agent["decision_key"] == ["ops-2027=/etc/se-bridge/keys/ops-2027.key"]
    hmac_only: dict[str, object] = {}
    give_agent_the_public_decision_keys(hmac_only, {"approverKeys": {"ops-2026": "s" * 40}}, specs[:1])
    assert "decision_key" not in hmac_only
    assert "acts only on decisions signed with Ed25519" in capsys.readouterr().err


def test_what_a_config_file_enables_is_decided_in_one_place() -> None:
    """The installer's result (which units it starts) and its health wait read the same rule: the
    agent unless the file is a central VM's, the approver and Azure's channel when sourced."""
    from bridge.commands.install_config import enabled

    assert enabled({"agent": {"sink": ["stdout:"]}}) == {"agent"}
    assert enabled({"agent": {}, "approver": {"source": "file:///d.jsonl"}}) == {"agent", "approver"}
    assert enabled({"agent": {}, "approver": {}}) == {"agent"}  # no source: no approver
    central = {"approver": {"source": "kafka://b/d"}, "azure_channel": {"source": ["file:///g.jsonl"]}}
    assert enabled(central) == {"approver", "azure_channel"}
    assert enabled({"azure_channel": {"sink": ["stdout:"]}}) == set()  # a central file with nothing to run
    assert enabled({}) == {"agent"}  # an empty file: the agent with its defaults
