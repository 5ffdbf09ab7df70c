"""`--kv-type` (issue 25): the daemon's flag and a model's own setting reach its worker, the
model's setting wins, a changed setting reloads the model, and a bad value is refused by name.
Over the fake worker, which reports back the KV type it was started with."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from llmd.api.server import REGISTRY
from llmd.cli.main import main
from llmd.paths import get_paths
from llmd.store.model_store import ModelStore
from tests.unit.fake_api import MODEL, api, complete


def test_bad_kv_type_is_a_clear_cli_error() -> None:
    result = CliRunner().invoke(main, ["serve", "--kv-type", "q5_1"])
    assert result.exit_code != 0
    assert "--kv-type" in result.output and "'q5_1' is not one of 'f16', 'q8_0', 'q4_0'" in (
        result.output
    )


async def test_daemon_kv_type_reaches_the_worker_and_status(llmd_home: Path) -> None:
    async with api(llmd_home, app_options={"kv_type": "q8_0"}) as client:
        status, _ = await complete(client, prompt="hello")
        assert status == 200
        [loaded] = client.server.app[REGISTRY].loaded()
        assert loaded.worker.ready.kv_type == "q8_0"
        info = await (await client.get("/status")).json()
    assert [m["kv_type"] for m in info["models"]] == ["q8_0"]


async def test_model_setting_wins_and_a_change_reloads_the_model(llmd_home: Path) -> None:
    result = CliRunner().invoke(main, ["set", MODEL, "--kv-type", "q4_0"])
    assert result.exit_code == 0, result.output
    assert "kv_type q4_0" in result.output
    assert ModelStore(get_paths()).resolve(MODEL).kv_type == "q4_0"
    shown = CliRunner().invoke(main, ["show", MODEL]).output
    assert "kv type           q4_0" in shown
    async with api(llmd_home, app_options={"kv_type": "q8_0"}) as client:
        assert (await complete(client, prompt="hello"))[0] == 200
        [first] = client.server.app[REGISTRY].loaded()
        assert first.worker.ready.kv_type == "q4_0"
        assert CliRunner().invoke(main, ["set", MODEL, "--kv-type", "default"]).exit_code == 0
        assert (await complete(client, prompt="hello again"))[0] == 200
        [second] = client.server.app[REGISTRY].loaded()
        assert second is not first and second.worker.ready.kv_type == "q8_0"


def test_set_refuses_an_unknown_model_and_kv_type(llmd_home: Path) -> None:
    result = CliRunner().invoke(main, ["set", "no-such-model", "--kv-type", "q8_0"])
    assert result.exit_code != 0 and "not installed" in result.output
    result = CliRunner().invoke(main, ["set", MODEL, "--kv-type", "int3"])
    assert result.exit_code != 0 and "--kv-type" in result.output
