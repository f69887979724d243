"""What every command shares: the options that find the server, the daemon and the state
(gathered into one `Shared` object on the click context), the config built from them, and
the one-line errors.

Only click, the config and the control API's client are imported here, so that `anyrtd
--help` and the read commands start fast; what a command needs beyond that it imports
when it runs.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import click
from click.shell_completion import CompletionItem

from anyrtd.config import Config, ConfigError, load_config
from anyrtd.escape import printable, printable_json

if TYPE_CHECKING:
    from anyrtd.cli.control import ControlClient
    from anyrtd.control.writes import Records

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class Seconds(click.FloatRange):
    """A number of seconds from a flag that is not a spec field: finite, within the range."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return number


class BadSetting(click.ClickException):
    """A flag, `ANYRTD_*` variable or config file value that cannot be used: exit status 2."""

    exit_code = 2


@dataclass
class Shared:
    """The shared options as given, on the group or the command (the command's win)."""

    config_path: str | None = None
    server: str | None = None
    space: str | None = None
    listen: str | None = None
    state_dir: Path | None = None

    def load(self, **flags: Any) -> Config:
        """Build the config from the file, `ANYRTD_*`, these options and `flags`."""
        return load_config(
            self.config_path,
            server=self.server,
            space=self.space,
            listen=self.listen,
            state_dir=self.state_dir,
            **flags,
        )

    def config(self, **flags: Any) -> Config:
        """Build the config as `load` does, or exit 2 with the one line that says why."""
        try:
            return self.load(**flags)
        except ConfigError as exc:
            raise BadSetting(str(exc)) from None


def shared(ctx: click.Context) -> Shared:
    """Return the context's `Shared`, made on first use and inherited by subcommands."""
    return ctx.ensure_object(Shared)


def _keep(name: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def keep(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None:
            setattr(shared(ctx), name, value)

    return keep


def shared_option(*decls: str, name: str, **attrs: Any) -> Callable[[F], F]:
    """Return an option whose value goes to `Shared.<name>` rather than to the command."""
    return click.option(*decls, expose_value=False, callback=_keep(name), **attrs)


CONFIG_OPTION = shared_option(
    "--config",
    name="config_path",
    type=click.Path(dir_okay=False),
    help="Config file (default: ~/.config/anyrtd/anyrtd.toml, /etc/anyrtd/anyrtd.toml).",
)
SERVER_OPTION = shared_option(
    "--server", name="server", help="URL of the any server [default: http://127.0.0.1:7001]."
)
SPACE_OPTION = shared_option("--space", name="space", help="The agent space id [default: bao].")
LISTEN_OPTION = shared_option(
    "--listen",
    name="listen",
    help="Control API address: HOST:PORT or unix:/path [default: 127.0.0.1:7010].",
)
STATE_DIR_OPTION = shared_option(
    "--state-dir",
    name="state_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the mirror lives [default: $STATE_DIRECTORY or ~/.local/state/anyrtd].",
)
SHARED_OPTIONS = (CONFIG_OPTION, SERVER_OPTION, SPACE_OPTION, LISTEN_OPTION, STATE_DIR_OPTION)


def shared_options(fn: F) -> F:
    """Accept the shared options on a command too (`anyrtd triggers list --server URL`)."""
    for option in reversed(SHARED_OPTIONS):
        fn = option(fn)
    return fn


def one_line(text: str) -> str:
    return " ".join(text.split())


def client_command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Take the shared options, pass the config first, and turn known failures into one line."""

    @shared_options
    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        config = shared(click.get_current_context()).config()
        try:
            return fn(config, **kwargs)
        except Exception as exc:
            message = failure(exc, config)
            if message is None:
                raise
            raise click.ClickException(message) from None

    return wrapper


def failure(exc: Exception, config: Config) -> str | None:
    """Return the one line that explains a known failure of a command, else None."""
    from anyrtd.address import AddressError
    from anyrtd.cli.control import ControlError, ControlUnreachable

    if isinstance(exc, ControlUnreachable):
        return str(exc)
    if isinstance(exc, ControlError):
        return one_line(exc.message)
    if isinstance(exc, AddressError):
        return one_line(str(exc))
    from anyrtd.client import ServerError, ServerUnavailable
    from anyrtd.control.writes import WriteError

    if isinstance(exc, ServerUnavailable):
        return (
            f"cannot reach the any server at {config.server}: is it running? "
            "(`anyrtd dev` starts a local one; set --server or ANYRTD_SERVER)"
        )
    if isinstance(exc, ServerError):
        return f"the any server refused: {one_line(exc.message)} ({exc.code})"
    if isinstance(exc, WriteError):
        return one_line(str(exc))
    return None


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON (stable keys).")


def echo(text: str = "", *, err: bool = False, raw_prefix: str = "", nl: bool = True) -> None:
    """Print `text` (on stderr with `err`), every control character escaped but its
    newlines and tabs: what the command line prints quotes synced data (ids, names, run
    output), which must not drive the terminal. `raw_prefix` is a control sequence of our
    own (a colour, a screen clear), written before it as it is; `nl=False` leaves the line
    open (a run's output followed as it grows)."""
    click.echo(raw_prefix + printable(text, lines=True), err=err, nl=nl)


class OneLineUsageError(click.UsageError):
    """A usage mistake said as every other error is: one line, the error and where help is
    (`Error: … (try 'anyrtd triggers create --help')`), exit status 2."""

    def show(self, file: Any = None) -> None:
        ctx = self.ctx
        hint = ""
        if ctx is not None:
            hint = f" (try '{ctx.command_path} {ctx.help_option_names[-1]}')"
        click.echo(f"Error: {self.format_message()}{hint}", err=True, file=file)


def one_line_usage(exc: click.UsageError) -> click.UsageError:
    """Return the usage error `exc` as one that shows in one line (its message escaped)."""
    if isinstance(exc, OneLineUsageError) or type(exc).__name__ == "NoArgsIsHelpError":
        return exc  # a group run bare shows its help, as click does
    return OneLineUsageError(printable(exc.format_message(), lines=True), ctx=exc.ctx)


class EscapingGroup(click.Group):
    """A group whose commands' error messages are escaped as `echo` escapes: they may quote
    synced data (an id, a name) the control API or the server sent back; a usage mistake
    shows in one line, as the other errors do."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            raise one_line_usage(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise one_line_usage(exc) from None
        except click.ClickException as exc:
            # The same error (its class, status and usage hint), its message escaped; click's
            # stubs call `message` final, so the instance's own attribute is replaced.
            vars(exc)["message"] = printable(exc.message, lines=True)
            raise


def emit_json(value: Any) -> None:
    """Print `value` as JSON, with the characters `echo` escapes as JSON escapes."""
    click.echo(printable_json(json.dumps(value, indent=2, ensure_ascii=False)))


def path_id(value: str) -> str:
    return quote(value, safe="")


def control(config: Config, timeout: float = 10.0) -> ControlClient:
    """Open a client of the daemon's control API."""
    from anyrtd.cli.control import ControlClient

    return ControlClient(config.listen, token_file=config.token_file, timeout=timeout)


def on_server(config: Config, work: Callable[[Records], Coroutine[Any, Any, T]]) -> T:
    """Run `work` with the agent space's trigger records on the configured server."""
    import asyncio

    from anyrtd.client import ServerClient
    from anyrtd.control.writes import Records

    async def main() -> T:
        async with ServerClient(config.server) as client:
            return await work(Records(client, config.space))

    return asyncio.run(main())


def _complete(path: str, key: str) -> Callable[[click.Context, click.Parameter, str], list[Any]]:
    """Return a shell-completion callback that offers ids from the daemon, if it answers."""

    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
        try:
            config = shared(ctx).config()
            with control(config, timeout=1.0) as ctl:
                items = ctl.get(path, **({"all": "true"} if path == "/triggers" else {}))
        except Exception:  # completion must never fail loudly
            return []
        ids = [str(i.get(key)) for i in items if isinstance(i, dict)]
        return [CompletionItem(i) for i in ids if i.startswith(incomplete)]

    return complete


complete_trigger = _complete("/triggers", "id")
complete_run = _complete("/runs", "runId")


def pass_config(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Take the shared options and pass the config built from them as the first argument."""

    @shared_options
    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        return fn(shared(click.get_current_context()).config(), **kwargs)

    return wrapper
