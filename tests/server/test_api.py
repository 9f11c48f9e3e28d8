"""The HTTP API's contract: auth, error shapes, OpenAPI, and the describe JSON."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster.client import Client
from muster.errors import Unauthorized
from muster.home import Home
from tests.server.experiments import (
    config_text,
    make_context,
    only_trial,
    run_to_end,
)
from tests.servers import RunningServer, shared_server

pytestmark = pytest.mark.lifecycle  # starts real processes

API = "/api/v1"
EXPERIMENT_KEYS = {"id", "name", "state", "trials"}
TRIAL_KEYS = {"id", "state", "restarts", "attempts"}
ATTEMPT_KEYS = {"number", "state", "replicas"}
REPLICA_KEYS = {"rank", "exit_code", "signal", "reason", "message", "log_path"}


server = shared_server()


@pytest.fixture
def http(server: RunningServer) -> Any:
    with httpx.Client(base_url=server.url, timeout=30) as raw:
        yield raw


def token_header(server: RunningServer) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.token}"}


def assert_error(response: httpx.Response, status: int, kind: str) -> str:
    """The response is `{error, message}` JSON with `status`, and no traceback; its message."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error", "message"}, body
    assert body["error"] == kind
    assert body["message"] and "Traceback" not in response.text
    assert 'File "' not in response.text
    message: str = body["message"]
    return message


PUBLIC = (f"{API}/health", f"{API}/login")


def protected_routes(http: httpx.Client) -> list[tuple[str, str]]:
    """(method, path) of every API route except /health and /login, path parameters filled
    with 1."""
    spec = http.get("/openapi.json").json()
    routes = []
    for path, operations in spec["paths"].items():
        if path in PUBLIC:
            continue
        concrete = path.replace("{experiment_id}", "1").replace("{trial_id}", "1")
        routes += [(method.upper(), concrete) for method in operations]
    return routes


def test_health_needs_no_token(http: httpx.Client, server: RunningServer) -> None:
    response = http.get(f"{API}/health")
    assert response.status_code == 200
    assert server.proc is not None
    assert response.json()["status"] == "ok"
    assert response.json()["pid"] == server.proc.pid
    body = response.json()
    assert (body["degraded"], body["last_supervisor_error"]) == (False, None)
    assert body["supervisor"]["failures_in_a_row"] == 0


def test_openapi_documents_every_response_and_the_bearer_scheme(http: httpx.Client) -> None:
    spec = http.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    error = {"$ref": "#/components/schemas/Error"}
    operations = [(path, method, op) for path, ops in spec["paths"].items()
                  for method, op in ops.items()]
    assert len(operations) >= 19
    for path, method, op in operations:
        where = f"{method.upper()} {path}"
        success = [code for code in op["responses"] if code.startswith("2")]
        assert len(success) == 1, where
        content = op["responses"][success[0]].get("content", {})
        if success[0] == "204":  # No Content (logout): nothing to describe
            assert not content, where
        else:
            assert content and all("schema" in media for media in content.values()), where
        for code, response in op["responses"].items():
            if code[0] in "45":
                assert response["content"]["application/json"]["schema"] == error, where
        if path in PUBLIC:
            assert "security" not in op
        else:
            assert op["security"] == [{"bearer": []}] and "401" in op["responses"], where
    schemas = spec["components"]["schemas"]
    assert set(schemas["ExperimentDetail"]["properties"]) >= {"id", "name", "state", "trials",
                                                              "search"}


def test_openapi_is_served_and_lists_the_routes(http: httpx.Client) -> None:
    response = http.get("/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in ("/health", "/experiments", "/experiments/{experiment_id}",
                 "/experiments/{experiment_id}/kill", "/trials/{trial_id}",
                 "/trials/{trial_id}/logs"):
        assert f"{API}{path}" in paths


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token", "Basic dXNlcjpwYXNz", "Bearer", b"Bearer \xff\xfe"],
    ids=["missing", "wrong", "other-scheme", "empty", "not-ascii"],
)
def test_every_other_route_needs_the_token(
    http: httpx.Client, authorization: str | bytes | None
) -> None:
    routes = protected_routes(http)
    assert len(routes) >= 6, routes
    headers: dict[str, Any] = {} if authorization is None else {"Authorization": authorization}
    for method, path in routes:
        response = http.request(method, path, headers=headers)
        message = assert_error(response, 401, "Unauthorized")
        assert "token" in message, (method, path)


def test_the_right_token_is_accepted(http: httpx.Client, server: RunningServer) -> None:
    response = http.get(f"{API}/experiments", headers=token_header(server))
    assert response.status_code == 200
    assert isinstance(response.json(), list)


def test_a_home_without_a_token_is_told_where_the_token_lives(
    server: RunningServer, tmp_path: Path
) -> None:
    other = Home(tmp_path / "other-home")
    with Client(url=server.url, home=other) as stranger, pytest.raises(
        Unauthorized, match=r"no API token to send .*other-home/secrets/token"
    ):
        stranger.list_experiments()


def test_the_token_file_is_private(server: RunningServer) -> None:
    token = Home(server.home).token_path
    assert token.parent == server.home / "secrets"  # under no run directory's parents
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(server.home.stat().st_mode) == 0o700
    assert len(server.token) >= 32


@pytest.mark.parametrize(
    ("path", "words"),
    [
        (f"{API}/experiments/999", "experiment 999 does not exist"),
        (f"{API}/experiments/999/kill", "experiment 999 does not exist"),
        (f"{API}/trials/999", "trial 999 does not exist"),
        (f"{API}/trials/999/logs", "trial 999 does not exist"),
        (f"{API}/trials/999/logs?follow=true", "trial 999 does not exist"),
    ],
)
def test_a_missing_record_is_a_404_with_a_helpful_message(
    http: httpx.Client, server: RunningServer, path: str, words: str
) -> None:
    method = "POST" if path.endswith("/kill") else "GET"
    response = http.request(method, path, headers=token_header(server))
    message = assert_error(response, 404, "NotFound")
    assert words in message


def test_an_unknown_route_is_a_json_404(http: httpx.Client, server: RunningServer) -> None:
    response = http.get(f"{API}/no-such-thing", headers=token_header(server))
    assert_error(response, 404, "NotFound")


def test_a_wrong_method_is_a_json_405(http: httpx.Client, server: RunningServer) -> None:
    response = http.delete(f"{API}/experiments", headers=token_header(server))
    assert_error(response, 405, "MethodNotAllowed")


def test_a_bad_parameter_is_a_json_error_naming_it(
    http: httpx.Client, server: RunningServer
) -> None:
    response = http.get(f"{API}/experiments/abc", headers=token_header(server))
    assert "experiment_id" in assert_error(response, 422, "InvalidRequest")
    response = http.get(f"{API}/trials/1/logs?attempt=0", headers=token_header(server))
    assert "attempt" in assert_error(response, 422, "InvalidRequest")


def post_config(http: httpx.Client, server: RunningServer, text: str) -> httpx.Response:
    return http.post(f"{API}/experiments", data={"config": text}, headers=token_header(server))


def test_a_bad_config_is_a_422_naming_the_key_path(
    http: httpx.Client, server: RunningServer
) -> None:
    text = config_text(["python", "t.py"], failure_policy={"trial_retries": -1})
    message = assert_error(post_config(http, server, text), 422, "ConfigError")
    assert "failure_policy.trial_retries: must be >= 0, got -1" in message


def test_an_unknown_key_is_a_422_with_its_suggestion(
    http: httpx.Client, server: RunningServer
) -> None:
    text = "name: x\nentrypoint: python t.py\nfailure_policy: {trial_retires: 1}\n"
    message = assert_error(post_config(http, server, text), 422, "ConfigError")
    assert "failure_policy.trial_retires: unknown key; did you mean 'trial_retries'?" in message


def test_a_rejected_config_stores_nothing(
    http: httpx.Client, server: RunningServer, client: Client
) -> None:
    before = (client.list_experiments(), sorted((server.home / "experiments").iterdir()))
    assert_error(post_config(http, server, "name: x\n"), 422, "ConfigError")
    assert (client.list_experiments(), sorted((server.home / "experiments").iterdir())) == before


def test_a_missing_config_field_is_a_json_error(http: httpx.Client, server: RunningServer) -> None:
    response = http.post(f"{API}/experiments", headers=token_header(server))
    assert "config" in assert_error(response, 422, "InvalidRequest")


def test_describe_follows_the_json_contract(client: Client, tmp_path: Path) -> None:
    exp = run_to_end(client, tmp_path, "kill_self.py", "SIGSEGV",
                     failure_policy={"trial_retries": 1})
    assert set(exp) >= EXPERIMENT_KEYS
    assert exp["name"] == "test" and exp["state"] == "ERROR"
    trial = only_trial(exp)
    assert set(trial) >= TRIAL_KEYS
    assert (trial["state"], trial["restarts"]) == ("FAILED", 1)
    assert [a["number"] for a in trial["attempts"]] == [1, 2]
    for attempt in trial["attempts"]:
        assert set(attempt) >= ATTEMPT_KEYS
        assert attempt["state"] == "FAILED"
        (replica,) = attempt["replicas"]
        assert set(replica) >= REPLICA_KEYS
        assert replica["rank"] == 0
        assert (replica["exit_code"], replica["signal"]) == (139, "SIGSEGV")
        assert replica["reason"] == "TRANSIENT"
        assert "non-zero status of 139 (SIGSEGV)" in replica["message"]
        assert Path(replica["log_path"]).read_bytes() == b"about to raise SIGSEGV\n"


def test_signal_is_null_when_no_signal_ended_the_replica(client: Client, tmp_path: Path) -> None:
    exp = run_to_end(client, tmp_path, "exit0.sh")
    (replica,) = only_trial(exp)["attempts"][0]["replicas"]
    assert replica["signal"] is None and replica["exit_code"] == 0


def test_create_returns_the_new_experiment(client: Client, tmp_path: Path) -> None:
    context = make_context(tmp_path, "exit0.sh")
    exp = client.create_experiment((context / "experiment.yaml").read_text(), context)
    assert set(exp) >= EXPERIMENT_KEYS
    assert exp["state"] == "ACTIVE"
    assert only_trial(exp)["state"] in {"QUEUED", "STARTING", "RUNNING", "SUCCEEDED"}
    assert client.get_experiment(exp["id"])["id"] == exp["id"]
