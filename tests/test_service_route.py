"""The service route as printed: where a refused install says to install anyrtd from, the
command linked on PATH, and the configuration `anyrtd doctor` reads when a service is
installed (the round trip under a real systemd is in tests/test_service_install.py)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from anyrtd.cli.service import service_config
from anyrtd.cli.shared import BadSetting, Shared
from anyrtd.config import Config, default_state_dir, load_config
from anyrtd.service_files import (
    COMMAND_LINK,
    SYSTEM_CONFIG_PATH,
    SYSTEM_STATE_DIR,
    SYSTEM_UNIT_PATH,
    Installation,
    command_link,
    install_source,
    installed_service,
)


def direct_url(url: str, **info: object) -> str:
    return json.dumps({"url": url, **info})


@pytest.mark.parametrize(
    ("written", "advice"),
    [
        # `pip install -e .` and `pip install .` from a checkout: the checkout
        (direct_url("file:///srv/anyrtd", dir_info={"editable": True}), "/srv/anyrtd"),
        (direct_url("file:///srv/anyrtd", dir_info={}), "/srv/anyrtd"),
        # `pip install anyrtd-0.1.0-py3-none-any.whl`: that wheel
        (
            direct_url("file:///srv/dl/anyrtd-0.1.0-py3-none-any.whl", archive_info={}),
            "/srv/dl/anyrtd-0.1.0-py3-none-any.whl",
        ),
        (direct_url("file:///srv/any%20rtd", dir_info={}), "/srv/any rtd"),
        # a URL pip can fetch again
        (
            direct_url("https://example.invalid/anyrtd-0.1.0.tar.gz", archive_info={}),
            "https://example.invalid/anyrtd-0.1.0.tar.gz",
        ),
        # from an index: its name there
        (None, "anyrtd"),
    ],
)
def test_a_refused_install_names_what_this_anyrtd_was_installed_from(
    written: str | None, advice: str
) -> None:
    assert install_source(written, exists=lambda p: True) == advice


@pytest.mark.parametrize("written", [direct_url("file:///gone/anyrtd"), "not json", "[1]"])
def test_a_source_that_is_gone_is_named_as_what_to_give(written: str) -> None:
    assert (
        install_source(written, exists=lambda p: False)
        == "/path/to/anyrtd (a checkout of anyrtd, or its wheel)"
    )


def test_the_command_is_linked_on_path_unless_it_is_there_already() -> None:
    assert Path("/usr/local/bin/anyrtd") == COMMAND_LINK
    opt = Installation(("/opt/anyrtd/bin/anyrtd",), ())
    assert command_link(opt) == Path("/opt/anyrtd/bin/anyrtd")
    assert command_link(Installation(("/usr/local/bin/anyrtd",), ())) is None
    assert command_link(Installation(("/usr/bin/anyrtd",), ())) is None
    python_m = Installation(("/opt/anyrtd/bin/python3", "-P", "-m", "anyrtd"), ())
    assert command_link(python_m) is None


def test_the_service_read_is_roots_system_one_and_a_users_own_first(tmp_path: Path) -> None:
    home = tmp_path / "home"
    user_unit = home / ".config/systemd/user/anyrtd.service"
    both = {SYSTEM_UNIT_PATH, user_unit}
    as_root = installed_service(root=True, env={}, home=home, exists=both.__contains__)
    assert as_root is not None
    assert (as_root.config_path, as_root.state_dir) == (SYSTEM_CONFIG_PATH, SYSTEM_STATE_DIR)
    as_me = installed_service(root=False, env={}, home=home, exists=both.__contains__)
    assert as_me is not None and as_me.whose == "your user service"
    assert as_me.config_path == home / ".config/anyrtd/anyrtd.toml"
    assert as_me.state_dir == home / ".local/state/anyrtd"
    system = {SYSTEM_UNIT_PATH}.__contains__
    only_system = installed_service(root=False, env={}, home=home, exists=system)
    assert only_system is not None and only_system.whose == "the system service"
    assert installed_service(root=True, env={}, home=home, exists=lambda p: False) is None


@pytest.fixture
def user_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A user service installed for a user who is not root; return that user's environment."""
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "XDG_STATE_HOME": str(tmp_path / "st")}
    unit = tmp_path / "cfg/systemd/user/anyrtd.service"
    unit.parent.mkdir(parents=True)
    unit.write_text("[Service]\nExecStart=/opt/anyrtd/bin/anyrtd serve\n")
    (tmp_path / "cfg/anyrtd").mkdir()
    (tmp_path / "cfg/anyrtd/anyrtd.toml").write_text('listen = "unix:/run/user/1000/x.sock"\n')
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return env


def test_the_doctor_reads_the_installed_services_configuration(
    user_service: dict[str, str], tmp_path: Path
) -> None:
    mine = load_config(None, env={})
    read, said = service_config(mine, Shared(), user_service)
    assert read.source == tmp_path / "cfg/anyrtd/anyrtd.toml"
    assert read.listen == "unix:/run/user/1000/x.sock"
    assert read.state_dir == tmp_path / "st/anyrtd"
    assert said == (
        "your user service is installed: read its configuration "
        f"({tmp_path}/cfg/anyrtd/anyrtd.toml, state in {tmp_path}/st/anyrtd)"
    )


def test_a_config_and_state_directory_given_are_kept(
    user_service: dict[str, str], tmp_path: Path
) -> None:
    given = tmp_path / "given.toml"
    given.write_text("")
    chosen = Shared(config_path=str(given), state_dir=tmp_path / "mine")
    config = Config(state_dir=tmp_path / "mine")
    assert service_config(config, chosen, user_service) == (config, "")
    # Only the state directory given: the service's file, with that state directory.
    read, _ = service_config(config, Shared(state_dir=tmp_path / "mine"), user_service)
    assert read.source == tmp_path / "cfg/anyrtd/anyrtd.toml"
    assert read.state_dir == tmp_path / "mine"
    assert read.state_dir != default_state_dir()


def test_a_bad_service_config_is_one_line(user_service: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "cfg/anyrtd/anyrtd.toml").write_text("tick_s = 0\n")
    with pytest.raises(BadSetting) as refused:
        service_config(Config(), Shared(), user_service)
    assert isinstance(refused.value, click.ClickException)
    assert refused.value.message.startswith("config key tick_s: must be a number of seconds")
