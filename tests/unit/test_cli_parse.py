"""The CLI's argument parsing, exit codes and output formatting (in process; no sockets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import provisioner.config
from provisioner import __version__, cli
from provisioner.cli import client, formatting
from provisioner.config import Settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("PROVISIONER_URL", "PROVISIONER_TOKEN", "PROVISIONER_DATABASE_URL",
                 "PROVISIONER_STATE_DIR", "PROVISIONER_API__LISTEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(provisioner.config, "DEFAULT_CONFIG_PATH", tmp_path / "absent.toml")


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "provisioner.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["db"],
        ["node"],
        ["node", "list", "--limit", "0"],
        ["node", "list", "--limit", "ten"],
        ["node", "list", "--maintenance", "--bogus"],
        ["node", "show"],
        ["node", "action", "n1", "explode"],
        ["node", "enroll", "--hostname", "h1"],  # no --mac
        ["node", "enroll", "--mac", "52:54:00:00:00:01", "--bmc-driver", "telnet"],
        ["node", "enroll", "--mac", "52:54:00:00:00:01", "--bmc-port", "70000"],
        ["node", "list", "--token", "t", "--token-file", "f"],
        ["node", "list", "--lim", "5"],  # no abbreviations
        ["token", "create", "--role", "root", "--name", "x"],
        ["token", "create", "--role", "agent", "--name", "x"],
        ["token", "create", "--role", "admin"],
    ],
    ids=lambda argv: " ".join(argv) or "(nothing)",
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "usage:" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["--bmc-password", "hunter2"],
    ["--bmc-password=hunter2"],
    ["--bmc-password"],
], ids=["separate", "equals", "no-value"])
def test_bmc_password_on_command_line_is_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["node", "enroll", "--mac", "52:54:00:00:00:01", "--bmc-driver", "fake",
                     "--bmc-address", "SIM1", *argv])
    assert code == 2
    out, err = capsys.readouterr()
    assert "--bmc-password-file" in err
    assert "hunter2" not in out + err


def test_bmc_options_without_driver_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["node", "enroll", "--mac", "52:54:00:00:00:01",
                     "--bmc-address", "10.0.0.1", "--url", "http://127.0.0.1:1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "provisioner: error: --bmc-* options need --bmc-driver")


def test_unreadable_password_file_exit_2(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["node", "enroll", "--mac", "52:54:00:00:00:01", "--bmc-driver", "ipmi",
                     "--bmc-address", "10.0.0.1", "--bmc-password-file",
                     str(tmp_path / "missing"), "--url", "http://127.0.0.1:1"])
    assert code == 2
    assert "--bmc-password-file" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["nodes.txt", "nodes", "nodes.yaml"])
def test_import_needs_csv_or_json(tmp_path: Path, name: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / name
    path.write_text("serial\nS1\n")
    assert cli.main(["import", str(path), "--url", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert ".csv, .json" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"provisioner {__version__}"


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["node", "enroll", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--bmc-password-file" in out
    assert "--bmc-password " not in out


def test_missing_explicit_config_exit_2(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.toml"
    assert cli.main(["--config", str(missing), "config", "show"]) == 2
    err = capsys.readouterr().err
    assert err == f"provisioner: config error: config file {missing} does not exist\n"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[api]\nlisten = "no-port"\n', "api.listen"),
        ("[lifecycle]\nmax_inspecting = 0\n", "lifecycle.max_inspecting"),
        ("[api]\nlisen = '127.0.0.1:1'\n", "api.lisen"),
        ("state_dir = [\n", "not valid TOML"),
    ],
    ids=["bad-listen", "out-of-range", "unknown-key", "bad-toml"],
)
def test_invalid_config_names_the_key(tmp_path: Path, text: str, key: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, text)
    assert cli.main(["--config", str(path), "db", "upgrade"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("provisioner: config error: ")
    assert key in err
    assert err.count("\n") == 1


def test_invalid_config_also_fails_api_commands_that_need_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_config(tmp_path, '[api]\nlisten = "no-port"\n')
    assert cli.main(["--config", str(path), "node", "list"]) == 2
    assert "api.listen" in capsys.readouterr().err


def test_config_show_masks_database_password(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, f'state_dir = "{tmp_path}"\n'
                                  'database_url = "postgresql+psycopg://prov:s3cret@db:5432/p"\n')
    assert cli.main(["--config", str(path), "config", "show"]) == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out
    assert 'database_url = "postgresql+psycopg://prov:***@db:5432/p"' in out
    assert f'state_dir = "{tmp_path}"' in out
    assert "[api]" in out
    assert 'listen = "127.0.0.1:8700"' in out

    assert cli.main(["--config", str(path), "config", "show", "--json"]) == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out
    assert '"database_url": "postgresql+psycopg://prov:***@db:5432/p"' in out


def test_config_show_without_a_config_file_uses_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["config", "show"]) == 0
    out = capsys.readouterr().out
    assert 'state_dir = "/var/lib/provisioner"' in out
    assert "# database_url = (unset)" in out


@pytest.mark.parametrize(
    ("listen", "url"),
    [
        ("127.0.0.1:8700", "http://127.0.0.1:8700"),
        ("0.0.0.0:9000", "http://127.0.0.1:9000"),
        ("[::]:9000", "http://127.0.0.1:9000"),
        ("[fd00::1]:9000", "http://[fd00::1]:9000"),
        ("prov.example.org:80", "http://prov.example.org:80"),
    ],
)
def test_default_url_from_api_listen(listen: str, url: str) -> None:
    settings = Settings.model_validate({"api": {"listen": listen}})
    assert client.default_url(settings) == url


def test_explicit_url_wins_and_api_suffix_is_dropped(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    args = cli.build_parser().parse_args(
        ["--config", str(tmp_path / "missing.toml"), "node", "list",
         "--url", "http://h:1/api/v1/"])
    assert client.api_client(args).base_url == "http://h:1"  # the config was never read
    monkeypatch.setenv("PROVISIONER_URL", "http://env:2")
    args = cli.build_parser().parse_args(["node", "list"])
    assert client.api_client(args).base_url == "http://env:2"


def test_token_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("pvt_fromfile\n")
    parse = cli.build_parser().parse_args
    monkeypatch.setenv("PROVISIONER_TOKEN", "pvt_fromenv")
    assert client.bearer_token(parse(["node", "list"])) == "pvt_fromenv"
    assert client.bearer_token(parse(["node", "list", "--token", "pvt_flag"])) == "pvt_flag"
    from_file = parse(["node", "list", "--token-file", str(token_file)])
    assert client.bearer_token(from_file) == "pvt_fromfile"
    api = client.api_client(parse(["node", "list", "--url", "http://h:1"]))
    assert "pvt_" not in repr(api)


# -- client error parsing ------------------------------------------------------------------


def test_problem_document_becomes_api_error() -> None:
    body = (b'{"title": "Conflict", "status": 409, "detail": "event \'deploy\' is not allowed '
            b'in state \'enrolled\'", "state": "enrolled", "allowed_events": ["inspect"]}')
    exc = client._api_error(409, "Conflict", body)
    assert exc.status == 409
    assert exc.detail == "event 'deploy' is not allowed in state 'enrolled'"
    assert exc.problem["allowed_events"] == ["inspect"]


def test_problem_with_errors_lists_them_on_one_line() -> None:
    body = (b'{"title": "Unprocessable Content", "status": 422, "detail": "invalid request: '
            b'macs.0: invalid MAC", "errors": [{"loc": "macs.0", "msg": "invalid MAC", '
            b'"type": "value_error"}, {"loc": "bmc.port", "msg": "too big", "type": "x"}]}')
    exc = client._api_error(422, "Unprocessable Content", body)
    assert exc.detail == "invalid request: macs.0: invalid MAC; bmc.port: too big"


def test_import_problem_lists_rows() -> None:
    errors = [{"loc": "serial", "msg": "missing", "type": "missing", "row": n}
              for n in range(1, 9)]
    body = json.dumps({"title": "Unprocessable Content", "status": 422,
                       "detail": "8 error(s) in the import, nothing imported; first: row 1: "
                                 "serial: missing", "errors": errors}).encode()
    detail = client._api_error(422, "Unprocessable Content", body).detail
    assert detail.startswith("8 error(s) in the import, nothing imported; first: row 1: "
                             "serial: missing; row 2: serial: missing; ")
    assert detail.endswith("row 6: serial: missing; and 2 more")
    assert "\n" not in detail


def test_non_json_error_body() -> None:
    exc = client._api_error(502, "Bad Gateway", b"<html>\nproxy down\n</html>")
    assert exc.detail == "HTTP 502: <html>"
    assert client._api_error(500, "Internal Server Error", b"").detail == (
        "HTTP 500: Internal Server Error")


def test_api_reason_adds_state_and_auth_hint() -> None:
    assert formatting.api_reason(409, "not allowed", {"state": "inspecting"}) == (
        "not allowed (state inspecting)")
    assert "PROVISIONER_TOKEN" in formatting.api_reason(401, "missing bearer token", {})


def test_query_string() -> None:
    assert client._query({"state": "active", "maintenance": False, "rack": None,
                          "limit": 5}) == "?state=active&maintenance=false&limit=5"
    assert client._query({"q": None}) == ""


# -- formatting ----------------------------------------------------------------------------

NODE = {
    "id": "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "hostname": "gpu-001", "serial": "SER1",
    "macs": ["52:54:00:00:00:01"], "state": "inspected", "maintenance": True,
    "maintenance_reason": "fan", "profile": None, "rack": "r1", "position": "12",
    "step_status": None, "last_error": "",
    "bmc": {"driver": "fake", "address": "SIM1", "port": None, "username": "admin",
            "password_set": True},
    "created_at": "2024-05-01T12:00:00.123456+00:00", "updated_at": "2024-05-01T12:00:01Z",
    "facts": {"cpu": {"model": "Grace", "cores": 72}, "gpus": [{"uuid": "a"}, {"uuid": "b"}],
              "memory_gib": 480},
    "checkpoint": [], "allowed_actions": ["inspect", "deploy"],
    "history": [{"seq": 1, "event": "enroll", "from_state": "", "to_state": "enrolled",
                 "actor": "cli", "reason": "", "at": "2024-05-01T12:00:00Z"}],
}


def test_node_table_is_aligned() -> None:
    lines = formatting.node_table([NODE, {**NODE, "id": "x", "hostname": "h"}]).splitlines()
    assert lines[0].split() == [name.upper() for name in formatting.DEFAULT_COLUMNS]
    assert lines[1].split() == ["0f1e2d3c", "gpu-001", "SER1", "inspected", "-", "yes", "-",
                                "r1", "-", "-", "-"]
    assert lines[0].index("STATE") == lines[1].index("inspected") == lines[2].index("inspected")


def test_node_table_columns_and_sort() -> None:
    nodes = [{**NODE, "hostname": "gpu-10", "power_state": "on", "last_error": "bmc\nlost"},
             {**NODE, "hostname": "gpu-2", "power_state": "off"},
             {**NODE, "hostname": None}]
    ordered = formatting.sort_nodes(nodes, "hostname")
    out = formatting.node_table(ordered, ("hostname", "power", "error")).splitlines()
    assert [line.split() for line in out] == [["HOSTNAME", "POWER", "ERROR"],
                                              ["gpu-2", "off", "-"],
                                              ["gpu-10", "on", "bmc", "lost"], ["-", "-", "-"]]
    assert [n["hostname"] for n in formatting.sort_nodes(nodes, "-hostname")] == \
        ["gpu-10", "gpu-2", None]


def test_node_detail_summarises_facts_and_history() -> None:
    out = formatting.node_detail(NODE)
    assert "bmc:" in out and "fake SIM1 (user admin, password set)" in out
    assert "cpu:        model=Grace, cores=72" in out
    assert "gpus:       2 items" in out
    assert "created_at:" in out and "2024-05-01 12:00:00" in out
    assert "SEQ  AT" in out and "enrolled" in out
