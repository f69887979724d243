"""The `[notices]` table and the missed-occurrence settings, through the config's one
validation path; and the alert rules, which must name what `/metrics` exports."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from anyrtd.config import CommandProgram, ConfigError, NoticeSettings, load_config
from anyrtd.control.views import metrics_text
from anyrtd.metrics import Stats

RULES = Path(__file__).parent.parent / "contrib" / "prometheus" / "anyrtd-rules.yml"


def load(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "anyrtd.toml"
    path.write_text(text)
    return load_config(str(path), env={})


def test_every_channel_is_off_by_default() -> None:
    settings = NoticeSettings()
    assert not settings.enabled and not settings.chat and settings.command is None


def test_the_notice_before_the_miss_is_off_by_default_with_a_ten_minute_lead(
    tmp_path: Path,
) -> None:
    assert not NoticeSettings().at_risk and NoticeSettings().at_risk_lead_s == 600.0
    config = load(tmp_path, "[notices]\nchat = true\nat_risk = true\nat_risk_lead_s = 900\n")
    assert config.notices.at_risk and config.notices.at_risk_lead_s == 900.0


def test_a_notices_table_with_both_channels(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        "missed_grace_s = 90\nmissed_lookback_s = 3600\n"
        '[notices]\nchat = true\nchat_id = "c1"\nper_hour = 5\nretries = 1\n'
        '[notices.command]\nargv = ["/usr/bin/mail", "-s", "anyrtd", "me"]\n'
        'env = {LANG = "C"}\n',
    )
    assert config.missed_grace_s == 90.0 and config.missed_lookback_s == 3600.0
    assert config.notices == NoticeSettings(
        chat=True,
        chat_id="c1",
        command=CommandProgram(argv=("/usr/bin/mail", "-s", "anyrtd", "me"), env={"LANG": "C"}),
        per_hour=5,
        retries=1,
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[notices]\nchat = 1\n", "config table notices: chat must be true or false, got 1"),
        ("[notices]\nmail = true\n", "config table notices: unknown key 'mail'"),
        ('[notices]\nchat_id = ""\n', "chat_id must be a chat's object id"),
        ("[notices]\nper_hour = 0\n", "per_hour must be a whole number of at least 1, got 0"),
        ("[notices]\nretries = -1\n", "retries must be a whole number of at least 0, got -1"),
        ("[notices]\nretries = true\n", "retries must be a whole number of at least 0"),
        ("[notices.command]\nargv = []\n", "config table notices.command: argv must be"),
        ("notices = 3\n", "config table notices: expected a table"),
        ("missed_grace_s = 0\n", "config key missed_grace_s: must be a number of seconds"),
        ('missed_lookback_s = "a day"\n', "config key missed_lookback_s: expected a number"),
        ('[notices]\nat_risk = "yes"\n', "at_risk must be true or false, got 'yes'"),
        ("[notices]\nat_risk_lead_s = 0\n", "at_risk_lead_s must be a number of seconds more"),
        ("[notices]\nat_risk_lead_s = 700000\n", "at most 604800 (a week)"),
        ("[notices]\nat_risk_lead_s = true\n", "at_risk_lead_s must be a number of seconds"),
    ],
)
def test_a_bad_setting_is_refused_with_what_to_change(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    message = str(caught.value)
    assert said in message and "\n" not in message


def test_the_alert_rules_name_only_metrics_the_daemon_exports() -> None:
    text = metrics_text(
        states={},
        stats=Stats(),
        outbox_depth=0,
        verdict="active",
        last_tick_age=1.0,
        peer_id="p",
        version="0",
        last_runs={"tick": 1.0},
        missed_totals={"tick": 2},
    )
    exported = {m.group(1) for m in re.finditer(r"^# TYPE (\S+) (\w+)", text, re.MULTILINE)}
    exported |= {f"{name}_bucket" for name in exported}
    named = set(re.findall(r"\banyrtd_[a-z_]+", RULES.read_text()))
    named -= {"anyrtd_rules"}  # the file's own name, in its comments
    assert named and named <= exported, named - exported
    assert 'anyrtd_missed_occurrences_total{trigger="tick"} 2' in text
    assert 'anyrtd_trigger_last_run_timestamp_seconds{trigger="tick"} 1.0' in text


def test_synced_text_reaches_the_log_with_its_control_characters_escaped() -> None:
    from anyrtd.notices import printable

    assert printable("tick\x1b[2J\nnext") == "tick\\x1b[2J\\nnext"
    assert printable("café ☕") == "café ☕"
