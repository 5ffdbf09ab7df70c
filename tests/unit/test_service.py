"""`llmd service`: the launchd plist and systemd unit it writes, and install/status/uninstall
in a temp HOME. The service manager is never called for real: `_run` is replaced by a
recorder (see the autouse fixture), so the host's launchd/systemd is left alone."""

from __future__ import annotations

import os
import plistlib
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmd.cli import service as service_mod
from llmd.cli.service import LABEL, render, service

Calls = list[list[str]]


@pytest.fixture(autouse=True)
def manager(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """Record service-manager commands instead of running them; each succeeds, with the
    answer `is-active` gives for an active unit."""
    calls: Calls = []

    def fake_run(argv: list[str]) -> tuple[int, str] | None:
        calls.append(argv)
        return 0, "active" if "is-active" in argv else ""

    monkeypatch.setattr(service_mod, "_run", fake_run)
    yield calls


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, llmd_home: Path) -> Path:
    """A temp HOME and XDG_CONFIG_HOME (plus conftest's LLMD_HOME)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(service, list(args))
    return result.exit_code, result.output


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit as section -> key -> values (keys such as Environment= repeat, which
    configparser cannot hold)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"line {n} is not Key=value: {raw!r}"
        key, value = line.split("=", 1)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def unit_words(value: str, exec_line: bool = True) -> list[str]:
    """An ExecStart/Environment value split and unescaped as systemd does: quotes, then %%
    (and $$ in ExecStart). A lone % or $ left over is one systemd would expand, so the
    word would not reach the daemon as written: fail on it."""
    words = []
    for word in shlex.split(value):
        specials = "%$" if exec_line else "%"
        for c in specials:
            assert c not in word.replace(c + c, ""), f"{c} left to systemd's expansion: {word}"
            word = word.replace(c + c, c)
        words.append(word)
    return words


def test_plist_runs_serve_with_restart_on_failure_and_logs(llmd_home: Path) -> None:
    plist = plistlib.loads(render("launchd", ("--port", "7500")).encode())
    assert plist["Label"] == LABEL
    args = plist["ProgramArguments"]
    assert args[0] == str(Path(sys.executable).absolute()) and Path(args[0]).exists()
    assert args[1:4] == ["-m", "llmd", "serve"]
    assert args[4:] == ["--port", "7500", "--log-file", str(llmd_home / "logs" / "llmd.log")]
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}  # restart after a crash only
    assert plist["ThrottleInterval"] > 0
    assert plist["StandardOutPath"] == plist["StandardErrorPath"]
    assert Path(plist["StandardOutPath"]).parent == llmd_home / "logs"
    env = plist["EnvironmentVariables"]
    assert env["LLMD_HOME"] == str(llmd_home)
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).absolute().parent)


def test_plist_escapes_odd_paths_and_passes_plutil(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = tmp_path / "a <b> & 'c' $d %e"
    monkeypatch.setenv("LLMD_HOME", str(home))
    text = render("launchd")
    plist = plistlib.loads(text.encode())
    assert plist["EnvironmentVariables"]["LLMD_HOME"] == str(home)
    assert plist["StandardOutPath"] == str(home / "logs" / "llmd.out")
    if shutil.which("plutil"):  # macOS
        f = tmp_path / f"{LABEL}.plist"
        f.write_text(text)
        subprocess.run(["plutil", "-lint", str(f)], check=True, capture_output=True)


def test_without_llmd_home_the_service_uses_the_default_home(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LLMD_HOME", raising=False)
    assert "LLMD_HOME" not in plistlib.loads(render("launchd").encode())["EnvironmentVariables"]
    assert "LLMD_HOME" not in render("systemd")


def test_a_source_checkout_passes_its_pythonpath_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run from the source tree (PYTHONPATH=daemon), `python -m llmd` under the manager finds
    llmd only through PYTHONPATH; an installed llmd needs none."""
    source_root = str(Path(service_mod.__file__).resolve().parents[2])  # daemon/, above llmd/
    monkeypatch.setenv("PYTHONPATH", source_root)
    assert service_mod.service_env()["PYTHONPATH"] == source_root
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert "PYTHONPATH" not in service_mod.service_env()


def test_systemd_unit_parses_with_restart_on_failure_and_logs(llmd_home: Path) -> None:
    unit = parse_unit(render("systemd", ("--host", "127.0.0.1", "--port", "7500")))
    assert set(unit) == {"Unit", "Service", "Install"}
    svc = unit["Service"]
    assert svc["Restart"] == ["on-failure"]
    assert float(svc["RestartSec"][0]) > 0
    assert svc["Type"][0] in ("simple", "exec")  # foreground: systemd owns the process
    (exec_start,) = svc["ExecStart"]
    argv = unit_words(exec_start)
    assert Path(argv[0]).is_absolute() and os.access(argv[0], os.X_OK)
    assert argv[1:] == [
        "-m",
        "llmd",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "7500",
        "--log-file",
        str(llmd_home / "logs" / "llmd.log"),
    ]
    out = str(llmd_home / "logs" / "llmd.out")
    assert svc["StandardOutput"] == [f"append:{out}"] and svc["StandardError"] == [f"append:{out}"]
    env = dict(w.split("=", 1) for v in svc["Environment"] for w in unit_words(v, False))
    assert env["LLMD_HOME"] == str(llmd_home)
    assert unit["Install"]["WantedBy"] == ["default.target"]


def test_systemd_unit_quotes_paths_with_spaces_and_specials(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = tmp_path / 'my "llm" home 100% $HOME'
    monkeypatch.setenv("LLMD_HOME", str(home))
    svc = parse_unit(render("systemd"))["Service"]
    assert unit_words(svc["ExecStart"][0])[-1] == str(home / "logs" / "llmd.log")
    # Environment= expands % specifiers but not $: only % is doubled there.
    assert unit_words(svc["Environment"][0], exec_line=False) == [f"LLMD_HOME={home}"]
    assert svc["StandardOutput"] == [f"append:{home}/logs/llmd.out".replace("%", "%%")]


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is absent")
@pytest.mark.parametrize("odd_home", [False, True])
def test_systemd_analyze_verify_accepts_the_unit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, llmd_home: Path, odd_home: bool
) -> None:
    if odd_home:
        monkeypatch.setenv("LLMD_HOME", str(tmp_path / "odd home 100% $x"))
    unit = tmp_path / "llmd.service"
    unit.write_text(render("systemd", ("--port", "7500")))
    env = dict(os.environ)
    runtime = tmp_path / "runtime"  # --user needs one; containers often have none
    runtime.mkdir(mode=0o700)
    env.setdefault("XDG_RUNTIME_DIR", str(runtime))
    proc = subprocess.run(
        ["systemd-analyze", "--user", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    # verify exits 0 even for settings it ignores, and names the file in each complaint.
    complaints = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "llmd.service" in ln]
    if proc.returncode != 0 and not complaints and "manager" in proc.stderr:
        pytest.skip(f"systemd-analyze cannot run here: {proc.stderr.strip()}")
    assert proc.returncode == 0 and not complaints, proc.stdout + proc.stderr


@pytest.mark.parametrize("platform", ["systemd", "launchd"])
def test_install_status_uninstall_roundtrip(home: Path, platform: str, manager: Calls) -> None:
    path = (
        home / "config" / "systemd" / "user" / "llmd.service"
        if platform == "systemd"
        else home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    )
    code, out = invoke("status", "--platform", platform)
    assert code == 0 and "not installed" in out

    code, out = invoke("install", "--platform", platform, "--no-start", "--port", "7500")
    assert code == 0, out
    assert path.read_text() == render(platform, ("--port", "7500"))
    assert str(path) in out and "not started" in out
    assert manager == []  # --no-start: the service manager is not touched
    assert (Path(os.environ["LLMD_HOME"]) / "logs").is_dir()  # neither manager creates it

    code, out = invoke("status", "--platform", platform)
    assert code == 0 and f"installed at {path}" in out
    if platform == "systemd":
        assert "state: active" in out

    code, out = invoke("uninstall", "--platform", platform)
    assert code == 0 and f"removed {path}" in out
    assert not path.exists()
    stops = {"systemd": ["systemctl", "--user", "disable", "--now"], "launchd": ["launchctl"]}
    assert any(c[: len(stops[platform])] == stops[platform] for c in manager)

    code, out = invoke("uninstall", "--platform", platform)
    assert code == 0 and "not installed" in out
    code, out = invoke("status", "--platform", platform)
    assert "not installed" in out


def test_install_starts_the_unit_and_restarts_it_after_a_change(home: Path, manager: Calls) -> None:
    code, out = invoke("install", "--platform", "systemd")
    assert code == 0 and "started" in out
    assert manager == [
        ["systemctl", "--user", "daemon-reload"],
        ["systemctl", "--user", "enable", "--now", "llmd.service"],
    ]
    manager.clear()
    code, out = invoke("install", "--platform", "systemd", "--force", "--port", "7600")
    assert code == 0 and "replaced" in out
    assert manager[-1] == ["systemctl", "--user", "restart", "llmd.service"]


def test_launchd_install_bootstraps_the_agent(
    home: Path, manager: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake_run(argv: list[str]) -> tuple[int, str] | None:
        manager.append(argv)
        return (113, "Could not find service") if argv[1] == "print" else (0, "")

    monkeypatch.setattr(service_mod, "_run", fake_run)
    code, out = invoke("install", "--platform", "launchd")
    assert code == 0, out
    plist = home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    assert ["launchctl", "bootstrap", f"gui/{os.getuid()}", str(plist)] in manager


def test_install_without_a_service_manager_keeps_the_file_and_says_what_to_run(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        service_mod, "_run", lambda argv: (1, "Failed to connect to bus: No medium found")
    )
    result = CliRunner().invoke(service, ["install", "--platform", "systemd"])
    assert result.exit_code == 0
    assert (home / "config" / "systemd" / "user" / "llmd.service").exists()
    assert "not started" in result.output and "Failed to connect to bus" in result.output
    assert "systemctl --user enable --now llmd.service" in result.output
    code, out = invoke("status", "--platform", "systemd")
    assert "installed at" in out and "state: unknown (Failed to connect to bus" in out

    # Enabled earlier (with a bus), uninstalled now without one: the file and the
    # enablement link both go, and the advice does not need the removed file.
    unit_dir = home / "config" / "systemd" / "user"
    (unit_dir / "default.target.wants").mkdir()
    (unit_dir / "default.target.wants" / "llmd.service").symlink_to(unit_dir / "llmd.service")
    monkeypatch.setattr(service_mod, "_run", lambda argv: None)  # systemctl not installed
    code, out = invoke("uninstall", "--platform", "systemd")
    assert code == 0 and "removed" in out and "systemctl is not installed" in out
    assert "systemctl --user stop llmd.service" in out
    assert not (unit_dir / "llmd.service").exists()
    assert not (unit_dir / "default.target.wants" / "llmd.service").is_symlink()


def test_install_refuses_to_overwrite_a_different_file_without_force(home: Path) -> None:
    path = home / "config" / "systemd" / "user" / "llmd.service"
    assert invoke("install", "--platform", "systemd", "--no-start")[0] == 0
    first = path.read_text()

    code, out = invoke("install", "--platform", "systemd", "--no-start")  # same setup: fine
    assert code == 0 and "already up to date" in out and path.read_text() == first

    code, out = invoke("install", "--platform", "systemd", "--no-start", "--port", "7600")
    assert code == 1 and "--force" in out
    assert path.read_text() == first  # untouched

    code, out = invoke(
        "install", "--platform", "systemd", "--no-start", "--force", "--port", "7600"
    )
    assert code == 0 and "replaced" in out
    assert '"--port" "7600"' in path.read_text()


def test_install_rejects_bad_serve_options_before_writing(home: Path) -> None:
    code, out = invoke("install", "--platform", "systemd", "--no-start", "--prot", "7500")
    assert code == 2 and "--prot" in out
    assert not (home / "config" / "systemd" / "user" / "llmd.service").exists()
    code, out = invoke("install", "--platform", "systemd", "--log-file", "rel.log")
    assert code == 2 and "absolute" in out
    assert not (home / "config" / "systemd" / "user" / "llmd.service").exists()


def test_help_describes_the_commands() -> None:
    code, out = invoke("--help")
    assert code == 0 and all(c in out for c in ("install", "uninstall", "status"))
    code, out = invoke("install", "--help")
    assert code == 0 and "--force" in out and "--no-start" in out and "SERVE_ARGS" in out
