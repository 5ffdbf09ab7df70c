"""`llmd service install|uninstall|status`: run llmd at login under the OS service manager.

On macOS a launchd user agent (``~/Library/LaunchAgents/dev.llmd.daemon.plist``), on Linux a
systemd user unit (``$XDG_CONFIG_HOME/systemd/user/llmd.service``), both rendered from the
templates in ``launchd/`` and ``systemd/`` (shipped as ``llmd/service_templates/``). The
daemon runs in the foreground (``python -m llmd serve``) so the manager supervises the process
itself and restarts it only after a failure; it logs to ``llmd.log`` in llmd's log dir (rotated,
as with ``llmd start``) and anything printed before logging starts goes to ``llmd.out``.

The file is what install guarantees: when the manager is missing or refuses (no user bus in a
container, CI, an ssh session without lingering), the file stays written and the command says
what to run by hand.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from string import Template
from xml.sax.saxutils import escape

import click

from llmd.cli.serve import serve
from llmd.paths import get_paths

LABEL = "dev.llmd.daemon"  # launchd label and plist name (reverse-DNS, as launchd expects)
UNIT = "llmd.service"
PLATFORMS = ("launchd", "systemd")
_MANAGER_TIMEOUT = 30.0  # seconds: a hung bus must not hang the CLI
_STOP_GRACE = 30  # seconds the manager waits beyond serve's --drain-timeout before SIGKILL


@dataclass(frozen=True)
class Target:
    """Where one platform's service file lives and which template renders it."""

    platform: str
    path: Path
    template_dir: str  # the repo dir holding the template (launchd/ or systemd/)
    template_name: str


def detect_platform() -> str:
    if sys.platform == "darwin":
        return "launchd"
    if sys.platform.startswith("linux"):
        return "systemd"
    raise click.ClickException(f"llmd service supports macOS and Linux, not {sys.platform}")


def target(platform: str) -> Target:
    """The service file's path, from $HOME / $XDG_CONFIG_HOME at call time (tests relocate
    both)."""
    if platform == "launchd":
        path = Path.home() / "Library" / "LaunchAgents" / f"{LABEL}.plist"
        return Target(platform, path, "launchd", f"{LABEL}.plist")
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Target(platform, Path(config) / "systemd" / "user" / UNIT, "systemd", UNIT)


def _template(t: Target) -> Template:
    """The installed wheel's copy first, then the source tree's (running with
    PYTHONPATH=daemon), as catalog.json is found."""
    package = Path(__file__).resolve().parents[1]  # llmd/
    for candidate in (
        package / "service_templates" / t.template_name,
        package.parents[1] / t.template_dir / t.template_name,
    ):
        if candidate.exists():
            return Template(candidate.read_text())
    raise click.ClickException(f"the {t.platform} template ({t.template_name}) is missing")


def serve_argv(serve_args: tuple[str, ...]) -> tuple[list[str], float]:
    """The daemon's command line and its --drain-timeout. The options are checked now, as
    `llmd start` does, rather than discovered in a crash loop. The interpreter is this one,
    unresolved: a venv's python is a symlink whose target lacks the venv's packages."""
    try:
        params = serve.make_context("llmd serve", list(serve_args)).params
    except click.exceptions.Exit as exc:  # --help among SERVE_ARGS
        raise click.UsageError("SERVE_ARGS are `llmd serve` options; --help is not one") from exc
    if params.get("log_file") and not Path(params["log_file"]).is_absolute():
        # The manager starts it in / or $HOME, not here: a relative path would move.
        raise click.BadParameter("give an absolute path", param_hint="--log-file")
    argv = [str(Path(sys.executable).absolute()), "-m", "llmd", "serve", *serve_args]
    if params.get("log_file") is None:
        argv += ["--log-file", str(get_paths().logs / "llmd.log")]
    return argv, float(params["drain_timeout"])


def service_env() -> dict[str, str]:
    """What the service needs from this shell: LLMD_HOME (the same home as this CLI), and
    PYTHONPATH when llmd itself is found through it (a source checkout, PYTHONPATH=daemon)."""
    env: dict[str, str] = {}
    if os.environ.get("LLMD_HOME"):
        env["LLMD_HOME"] = str(get_paths().data.parent)  # resolved, as get_paths() does
    package_root = str(Path(__file__).resolve().parents[2])  # the directory holding llmd/
    pythonpath = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if any(p and Path(p).resolve() == Path(package_root) for p in pythonpath):
        env["PYTHONPATH"] = package_root
    return env


def _systemd_quote(word: str, exec_line: bool = True) -> str:
    """One ExecStart or Environment word, quoted: systemd splits on spaces, unescapes C-style
    and expands % specifiers in both, and $VARIABLES in ExecStart only."""
    word = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    if exec_line:
        word = word.replace("$", "$$")
    return f'"{word}"'


def render(platform: str, serve_args: tuple[str, ...] = ()) -> str:
    """The service file's text. It depends only on the arguments, the interpreter and the
    environment named in `service_env` (not on this shell's PATH), so reinstalling from the
    same setup writes the same bytes and is not refused as an overwrite."""
    argv, drain_timeout = serve_argv(serve_args)
    env = service_env()
    out_log = str(get_paths().logs / "llmd.out")
    stop_timeout = int(drain_timeout) + _STOP_GRACE
    t = target(platform)
    if platform == "launchd":
        # launchd's own PATH is /usr/bin:/bin:/usr/sbin:/sbin; put the venv's bin dir first.
        env["PATH"] = os.pathsep.join(
            [str(Path(argv[0]).parent), "/opt/homebrew/bin", "/usr/local/bin"]
            + ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
        )
        return _template(t).substitute(
            label=LABEL,
            program_arguments="\n".join(f"\t\t<string>{escape(a)}</string>" for a in argv),
            environment="\n".join(
                f"\t\t<key>{escape(k)}</key>\n\t\t<string>{escape(v)}</string>"
                for k, v in sorted(env.items())
            ),
            out_log=escape(out_log),
            stop_timeout=stop_timeout,
        )
    return _template(t).substitute(
        exec_start=" ".join(_systemd_quote(a) for a in argv),
        environment="\n".join(
            f"Environment={_systemd_quote(f'{k}={v}', exec_line=False)}"
            for k, v in sorted(env.items())
        ),
        out_log=out_log.replace("%", "%%"),
        stop_timeout=stop_timeout,
    )


def _run(argv: list[str]) -> tuple[int, str] | None:
    """Run one service-manager command: (exit status, stdout + stderr), or None when the
    manager is not installed. Tests replace this function so they never touch the host's
    launchd or systemd."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=_MANAGER_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, str(exc)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _manager(platform: str, *args: str) -> list[str]:
    if platform == "launchd":
        return ["launchctl", *args]
    return ["systemctl", "--user", *args]


def _domain() -> str:
    return f"gui/{os.getuid()}"


def _start_commands(platform: str, path: Path, changed: bool) -> list[list[str]]:
    if platform == "launchd":
        # bootstrap refuses a label that is already loaded, so unload it first (an error
        # there just means it was not loaded). Unchanged and loaded: leave it running.
        boot = [_manager(platform, "bootout", f"{_domain()}/{LABEL}")] if changed else []
        return [*boot, _manager(platform, "bootstrap", _domain(), str(path))]
    cmds = [_manager(platform, "daemon-reload"), _manager(platform, "enable", "--now", UNIT)]
    if changed:  # enable --now leaves a running daemon on the old command line
        cmds.append(_manager(platform, "restart", UNIT))
    return cmds


def _stop_commands(platform: str) -> list[list[str]]:
    if platform == "launchd":
        return [_manager(platform, "bootout", f"{_domain()}/{LABEL}")]
    return [_manager(platform, "disable", "--now", UNIT)]


def _launchd_loaded() -> bool:
    result = _run(_manager("launchd", "print", f"{_domain()}/{LABEL}"))
    return result is not None and result[0] == 0


def _run_all(cmds: list[list[str]], tolerate_first: bool = False) -> str | None:
    """Run `cmds` in order; the first failure's reason, or None when all succeeded.
    `tolerate_first`: the first command may fail (launchd bootout of an unloaded agent)."""
    for i, cmd in enumerate(cmds):
        result = _run(cmd)
        if result is None:
            return f"{cmd[0]} is not installed"
        code, output = result
        if code != 0 and not (tolerate_first and i == 0):
            return f"`{shlex.join(cmd)}` failed ({code}): {output or 'no output'}"
    return None


def _by_hand(cmds: list[list[str]]) -> str:
    return "\n".join("  " + shlex.join(cmd) for cmd in cmds)


platform_option = click.option(
    "--platform",
    type=click.Choice(PLATFORMS),
    default=None,
    help="Service manager (default: launchd on macOS, systemd on Linux).",
)


@click.group()
def service() -> None:
    """Run llmd at login under launchd (macOS) or systemd (Linux).

    \b
    llmd service install [SERVE_ARGS]   write the user service and start it
    llmd service status                 is it installed, is it running
    llmd service uninstall              stop it and remove the file

    The service runs `llmd serve` in the foreground, restarted after a crash; logs
    go to llmd's log dir (llmd.log, and llmd.out for early output).
    """


@service.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@platform_option
@click.option("--force", is_flag=True, help="Replace a different existing service file.")
@click.option("--no-start", is_flag=True, help="Only write the file; start nothing.")
@click.argument("serve_args", nargs=-1, type=click.UNPROCESSED)
def install(platform: str | None, force: bool, no_start: bool, serve_args: tuple[str, ...]) -> None:
    """Write the user service file and start it (enabled at login).

    \b
    SERVE_ARGS are `llmd serve` options, after this command's own, e.g.:
      llmd service install --port 7500 --preload smollm2-135m
    LLMD_HOME, when set, is written into the service too. Reinstalling the
    same setup is harmless; a different existing file needs --force.
    """
    platform = platform or detect_platform()
    t = target(platform)
    text = render(platform, serve_args)
    old = t.path.read_text() if t.path.exists() else None
    if old is not None and old != text and not force:
        raise click.ClickException(
            f"{t.path} exists with different content (another setup or an older llmd); "
            "`llmd service install --force` replaces it"
        )
    get_paths().logs.mkdir(parents=True, exist_ok=True)  # neither manager creates the dir
    if old != text:
        t.path.parent.mkdir(parents=True, exist_ok=True)
        t.path.write_text(text)
        click.echo(f"{'replaced' if old is not None else 'wrote'} {t.path}")
    else:
        click.echo(f"{t.path} is already up to date")
    changed = old is not None and old != text
    cmds = _start_commands(platform, t.path, changed)
    if no_start:
        click.echo("not started (--no-start); to start it:\n" + _by_hand(cmds))
        return
    if platform == "launchd" and not changed and _launchd_loaded():
        click.echo(f"llmd service is already loaded ({LABEL})")  # this very plist: leave it
        return
    problem = _run_all(cmds, tolerate_first=platform == "launchd" and changed)
    if problem:
        click.secho(
            f"installed, but not started: {problem}\nTo start it by hand:\n" + _by_hand(cmds),
            fg="yellow",
            err=True,
        )
        return
    click.echo(f"llmd service started ({platform}); logs in {get_paths().logs}")


@service.command()
@platform_option
def uninstall(platform: str | None) -> None:
    """Stop the service, disable it at login and remove its file."""
    platform = platform or detect_platform()
    t = target(platform)
    if not t.path.exists():
        click.echo(f"llmd service is not installed (no {t.path})")
        return
    cmds = _stop_commands(platform)
    if platform == "launchd" and not _launchd_loaded():
        cmds = []  # bootout of an agent that is not loaded only fails
    problem = _run_all(cmds)
    t.path.unlink()
    click.echo(f"removed {t.path}")
    if platform == "systemd":
        # What `disable` would have removed: a dangling link makes systemd warn at login.
        wants = t.path.parent / "default.target.wants" / UNIT
        if problem and wants.is_symlink():
            wants.unlink()
        _run(_manager(platform, "daemon-reload"))  # forget the unit; harmless if it fails
    if problem:
        # The file is gone, so only the commands that work without it are worth advising.
        if platform == "systemd":
            cmds = [_manager(platform, "stop", UNIT), _manager(platform, "daemon-reload")]
        click.secho(
            f"the service manager did not confirm the stop: {problem}\n"
            "If it is still running, stop it by hand:\n" + _by_hand(cmds),
            fg="yellow",
            err=True,
        )


@service.command()
@platform_option
def status(platform: str | None) -> None:
    """Show whether the service is installed (and where) and running."""
    platform = platform or detect_platform()
    t = target(platform)
    if not t.path.exists():
        click.echo(f"llmd service ({platform}): not installed (would be {t.path})")
        return
    click.echo(f"llmd service ({platform}): installed at {t.path}")
    if platform == "launchd":
        result = _run(_manager(platform, "print", f"{_domain()}/{LABEL}"))
        if result is None:
            state = "unknown (launchctl is not installed)"
        elif result[0] != 0:
            state = "not loaded"
        else:
            lines = [ln.strip() for ln in result[1].splitlines()]
            state = next(
                (ln.split("=", 1)[1].strip() for ln in lines if ln.startswith("state =")),
                "loaded",
            )
    else:
        result = _run(_manager(platform, "is-active", UNIT))
        if result is None:
            state = "unknown (systemctl is not installed)"
        elif result[1] and " " not in result[1]:  # one word: active, inactive, failed, ...
            state = result[1]
        else:  # e.g. "Failed to connect to bus": no user manager to ask
            state = f"unknown ({result[1] or 'systemctl gave no answer'})"
    click.echo(f"state: {state}")
    click.echo(f"logs: {get_paths().logs}")
