"""The `maestro` front door: --version, defaults in every help, and `maestro serve` (the predictor service)."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from maestro.cli import DefaultsFormatter, build_parser, main
from predictor_service.commands import SERVICE, serve_command
from predictor_service.local_server import LocalServer, ServerConfig


def test_version_is_the_installed_packages(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"maestro {importlib.metadata.version('maestro')}"


def test_every_help_states_the_defaults_once(capsys):
    def help_text(*command: str) -> str:
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        return " ".join(capsys.readouterr().out.split())  # argparse wraps lines

    serve = help_text("serve")
    assert "(default: 127.0.0.1)" in serve and "port to listen on (default: 3000)" in serve
    deploy = help_text("deploy")
    assert (
        "per-node reload timeout (default: 120.0)" in deploy
        and "registered model name (default: stage-length)" in deploy
    )
    assert deploy.count("(default: champion)") == 1  # its help said it already
    assert "(default: None)" not in deploy and "(default: False)" not in deploy
    subcommands = build_parser()._subparsers._group_actions[0].choices
    assert {"serve", "deploy", "gateway", "simulate", "train"} <= set(subcommands)
    formatter = DefaultsFormatter("maestro")
    for name, parser in subcommands.items():  # every option with a default set shows it, in every subcommand
        for action in parser._actions:
            if action.option_strings and action.default not in (None, False, [], argparse.SUPPRESS):
                assert "default" in formatter._get_help_string(action), (name, action.dest)


def test_serve_runs_bentoml_on_localhost_with_the_options_over_the_environment():
    args = build_parser().parse_args(["serve"])
    argv, env = serve_command(args, {"MAESTRO_MODEL": "models:/x@staging", "PATH": "/bin"})
    assert argv[1:6] == ["serve", SERVICE, "--host", "127.0.0.1", "--port"] and argv[6] == "3000"
    assert Path(argv[0]).name == "bentoml" and env["MAESTRO_MODEL"] == "models:/x@staging"
    assert env["OMP_NUM_THREADS"] == "1" and env["PATH"] == "/bin"
    args = build_parser().parse_args(
        ["serve", "--host", "0.0.0.0", "--port", "4000", "--model", "/m", "--tracking-uri", "sqlite:///r.db"]
    )
    argv, env = serve_command(args, {"MAESTRO_MODEL": "models:/x@staging", "OMP_NUM_THREADS": "4"})
    assert argv[4:7] == ["0.0.0.0", "--port", "4000"]
    assert (env["MAESTRO_MODEL"], env["MLFLOW_TRACKING_URI"], env["OMP_NUM_THREADS"]) == ("/m", "sqlite:///r.db", "4")


class MaestroServe(LocalServer):
    """`maestro serve --port P --model M`, started and stopped as LocalServer starts `bentoml serve`."""

    def __init__(self, model: str, log_path: str):
        super().__init__(ServerConfig(log_path=log_path))
        self.model = model

    def command(self) -> list[str]:
        return [
            str(Path(sys.executable).with_name("maestro")),
            "serve",
            "--port",
            str(self.port),
            "--model",
            self.model,
        ]


@pytest.mark.slow
def test_maestro_serve_answers_on_localhost_only(model_dir, tmp_path):
    with MaestroServe(str(model_dir), str(tmp_path / "serve.log")) as server:
        assert httpx.get(f"{server.url}/readyz", timeout=5).status_code == 200
        stage = {"workflow_id": "w", "stage_id": "s", "role": "planner", "prompt": "Plan a trip."}
        answer = httpx.post(f"{server.url}/predict", json={"stages": [stage]}, timeout=30)
        assert answer.status_code == 200 and answer.json()[0]["tokens_pred"] > 0, answer.text
        listening = {
            c.laddr.ip
            for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == server.port
        }
        assert listening == {"127.0.0.1"}
