"""Downloads through a real server: one replica's whole log, byte for byte, and an intact
checkpoint as a tar, checked file by file while it is sent.

The log comes from a real trial that writes a known log (3 MiB, bytes that are not UTF-8,
a partial last line); the checkpoint from a real trial that saves it with `muster.harness`.
Tampering is done to the checkpoint's files on disk after the server registered it.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from muster.client import Client
from muster.errors import Conflict, ServerError
from muster.supervise.ingest import ingest_trial
from tests.server.experiments import (
    attempt_dir,
    create,
    only_trial,
    submit,
    wait_ended,
    wait_trial,
    write_context,
)
from tests.servers import RunningServer, shared_server
from tests.waiting import wait_until

pytestmark = [pytest.mark.lifecycle, pytest.mark.timeout(120)]  # real servers and trials

server = shared_server()

HEAD = b"first line\nnot utf-8: \xff\xfe\xc3\x28 and gbk \xd6\xd0\xce\xc4\n"
BODY_REPEATS = 12_289  # 3 MiB and a bit: several chunks, the last one partial
TAIL = b"a partial last line, cut inside a character \xe2\x82"
LOG = HEAD + bytes(range(256)) * BODY_REPEATS + TAIL
LOG_WRITER = (f"import sys\nsys.stdout.buffer.write({HEAD!r} + bytes(range(256)) * "
              f"{BODY_REPEATS} + {TAIL!r})\n")

BIG = bytes(range(256)) * 8_200 + b"odd end"  # 2 MiB and a bit
SAVER = """import muster.harness as mh

BIG = bytes(range(256)) * 8_200 + b"odd end"
with mh.init() as ctx:
    with ctx.checkpoint.save(7, metadata={"epoch": 1}) as path:
        (path / "weights.bin").write_bytes(BIG)
        (path / "nested" / "deeper").mkdir(parents=True)
        (path / "nested" / "deeper" / "optimizer.json").write_text('{"lr": 0.1}')
        (path / "empty").write_bytes(b"")
        (path / "a name with spaces \\u00e9.txt").write_text("unicode name")
print("saved", flush=True)
"""
SAVED = {"weights.bin", "nested/deeper/optimizer.json", "empty",
         "a name with spaces \u00e9.txt"}


def get(server: RunningServer, path: str, token: str | None = None, **kw: Any) -> httpx.Response:
    token = server.token if token is None else token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{server.url}/api/v1{path}", headers=headers, timeout=60, **kw)


def assert_error(response: httpx.Response, status: int, *words: str) -> None:
    assert response.status_code == status, response.text
    message = response.json()["message"]
    assert all(word in message for word in words), message


@pytest.fixture(scope="module")
def logged(server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> int:
    """The id of a SUCCEEDED trial whose log is `LOG`."""
    context = write_context(tmp_path_factory.mktemp("logged"), ["python", "write_log.py"],
                            files={"write_log.py": LOG_WRITER})
    with server.client() as client:
        trial = only_trial(wait_ended(client, submit(client, context)["id"]))
    assert trial["state"] == "SUCCEEDED", trial
    trial_id: int = trial["id"]
    return trial_id


@pytest.fixture
def saved(server: RunningServer, tmp_path: Path) -> dict[str, Any]:
    """A fresh trial's registered checkpoint (`SAVER`), with `trial_id`."""
    context = write_context(tmp_path, ["python", "save.py"], files={"save.py": SAVER})
    with server.client() as client:
        trial = only_trial(wait_ended(client, submit(client, context)["id"]))
        assert trial["state"] == "SUCCEEDED", trial
        (checkpoint,) = wait_until(lambda: client.list_checkpoints(trial["id"]), timeout=30,
                                   what="the checkpoint to be registered")
    assert checkpoint["intact"], checkpoint
    return {**checkpoint, "trial_id": trial["id"]}


def download_path(checkpoint: dict[str, Any]) -> str:
    return f"/trials/{checkpoint['trial_id']}/checkpoints/{checkpoint['name']}/download"


def archive_files(data: bytes) -> dict[str, bytes]:
    """The regular files of a tar, by name (and that there is nothing else in it)."""
    files = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for member in archive:
            assert member.isreg(), member.name
            source = archive.extractfile(member)
            assert source is not None
            files[member.name] = source.read()
    return files


# -- one replica's whole log ----------------------------------------------------------------


def test_a_whole_log_downloads_byte_identical(server: RunningServer, logged: int) -> None:
    for query in ({}, {"attempt": 1, "rank": 0}):
        response = get(server, f"/trials/{logged}/logs/download", params=query)
        assert response.status_code == 200, response.text
        assert response.content == LOG
        assert response.headers["content-type"] == "application/octet-stream"
        assert response.headers["content-length"] == str(len(LOG))
        assert response.headers["content-disposition"] == (
            f'attachment; filename="trial-{logged}-attempt-1-rank-0.log"')
        assert response.headers["x-muster-attempt"] == "1"


def test_a_growing_log_downloads_what_it_held_when_asked(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    trial = only_trial(create(client, tmp_path, "count_until_file.py", str(release)))
    wait_until(lambda: b"line 20\n" in client.read_logs(trial["id"]).data, timeout=30,
               what="20 lines of log")
    response = get(server, f"/trials/{trial['id']}/logs/download")
    release.touch()
    ended = wait_trial(client, trial["id"], {"SUCCEEDED"})
    whole = Path(ended["attempts"][0]["replicas"][0]["log_path"]).read_bytes()
    assert int(response.headers["content-length"]) == len(response.content) < len(whole)
    assert whole.startswith(response.content)


def test_a_missing_trial_attempt_or_rank_is_a_404(server: RunningServer, logged: int) -> None:
    assert_error(get(server, "/trials/999999/logs/download"), 404, "999999")
    assert_error(get(server, f"/trials/{logged}/logs/download", params={"attempt": 2}), 404,
                 "has no attempt 2")
    assert_error(get(server, f"/trials/{logged}/logs/download", params={"rank": 3}), 404,
                 "has no rank 3", "one of its ranks: 0")


def test_a_log_not_written_yet_is_a_404_naming_when_to_come_back(
    server: RunningServer, client: Client, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    trial = only_trial(create(client, tmp_path, "wait_for_file.py", str(release)))
    wait_trial(client, trial["id"], {"RUNNING"})
    log = attempt_dir(server.home, client.get_trial(trial["id"]), 1) / "rank-0.log"
    moved = log.with_name("moved.log")
    wait_until(log.exists, timeout=30, what="the log file")
    log.rename(moved)  # as if the shim had not made it yet
    try:
        assert_error(get(server, f"/trials/{trial['id']}/logs/download"), 404,
                     "has written no log yet", "once the replica has started")
    finally:
        moved.rename(log)
        release.touch()
    wait_trial(client, trial["id"], {"SUCCEEDED"})


# -- a checkpoint ---------------------------------------------------------------------------


def test_an_intact_checkpoint_downloads_as_a_tar_of_its_files(
    server: RunningServer, saved: dict[str, Any]
) -> None:
    response = get(server, download_path(saved))
    assert response.status_code == 200, response.text
    name, folder = saved["name"], Path(saved["path"])
    assert response.headers["content-type"] == "application/x-tar"
    assert response.headers["content-disposition"] == (
        f'attachment; filename="trial-{saved["trial_id"]}-{name}.tar"')
    assert response.headers["content-length"] == str(len(response.content))
    files = archive_files(response.content)
    # metadata.json first, then the files it lists, sorted
    assert list(files) == [f"{name}/{path}" for path in ["metadata.json", *sorted(SAVED)]]
    for member, data in files.items():
        assert data == (folder / member.removeprefix(f"{name}/")).read_bytes(), member
    assert files[f"{name}/weights.bin"] == BIG
    listed = json.loads(files[f"{name}/metadata.json"])["files"]
    assert listed["weights.bin"] == hashlib.sha256(BIG).hexdigest()


def test_a_file_changed_in_place_breaks_the_download_off(
    server: RunningServer, saved: dict[str, Any]
) -> None:
    weights = Path(saved["path"]) / "weights.bin"
    changed = bytearray(BIG)
    changed[-3] ^= 0xFF  # same size: only its sha256 tells
    weights.write_bytes(bytes(changed))
    received = bytearray()
    with pytest.raises(httpx.RemoteProtocolError), httpx.stream(
        "GET", f"{server.url}/api/v1{download_path(saved)}", timeout=60,
        headers={"Authorization": f"Bearer {server.token}"},
    ) as response:
        assert response.status_code == 200
        for chunk in response.iter_bytes():
            received += chunk
    assert len(received) < int(response.headers["content-length"])
    assert bytes(changed) not in received  # the changed file never went out whole
    with server.client() as client, pytest.raises(ServerError, match="broke off"):
        b"".join(client.stream_checkpoint(saved["trial_id"], saved["name"]))
    assert "weights.bin no longer matches its sha256" in (server.home / "server.log").read_text()

    weights.write_bytes(BIG)  # put back, it downloads again
    assert get(server, download_path(saved)).status_code == 200


@pytest.mark.parametrize("change", ["append", "delete", "add", "link"])
def test_a_checkpoint_changed_since_registration_is_a_409(
    server: RunningServer, saved: dict[str, Any], change: str
) -> None:
    folder = Path(saved["path"])
    if change == "append":
        with (folder / "weights.bin").open("ab") as out:
            out.write(b"more")
        words = ["has changed since it was registered", "bytes it held when it was registered"]
    elif change == "delete":
        (folder / "empty").unlink()
        words = ["empty is missing"]
    elif change == "add":
        (folder / "extra.bin").write_bytes(b"unlisted")
        words = ["it holds 6 files"]
    else:
        (folder / "empty").unlink()
        (folder / "empty").symlink_to(folder / "weights.bin")
        words = ["empty is not a regular file"]
    response = get(server, download_path(saved))
    assert_error(response, 409, f"checkpoint {saved['name']}", *words)


def register_corrupt_copy(server: RunningServer, saved: dict[str, Any]) -> str:
    """The name of a corrupt copy of `saved`, registered as the server registers one."""
    original = Path(saved["path"])
    copy = original.with_name(".tmp-corrupt")  # published whole, like the harness does
    shutil.copytree(original, copy)
    (copy / "empty").write_bytes(b"no longer empty")
    corrupt = copy.rename(original.with_name("step-000000000008-deadbeef"))
    with server.store() as store:
        ingest_trial(store, saved["trial_id"])
    return corrupt.name


def test_a_checkpoint_registered_corrupt_is_a_409_with_its_problem(
    server: RunningServer, saved: dict[str, Any]
) -> None:
    corrupt = register_corrupt_copy(server, saved)
    response = get(server, f"/trials/{saved['trial_id']}/checkpoints/{corrupt}/download")
    assert_error(response, 409, "is not intact",
                 "empty does not match its sha256 in metadata.json",
                 "only an intact checkpoint can be downloaded")
    with server.client() as client, pytest.raises(Conflict, match="is not intact"):
        list(client.stream_checkpoint(saved["trial_id"], corrupt))


def test_the_trial_page_links_the_intact_checkpoints_and_the_log(
    server: RunningServer, saved: dict[str, Any]
) -> None:
    corrupt = register_corrupt_copy(server, saved)
    trial_id = saved["trial_id"]
    page = httpx.get(f"{server.url}/trials/{trial_id}", timeout=30,
                     headers={"Authorization": f"Bearer {server.token}"})
    assert page.status_code == 200, page.text
    assert f'href="/api/v1/checkpoints/{saved["id"]}/download" download>' in page.text
    assert corrupt in page.text and page.text.count('href="/api/v1/checkpoints/') == 1
    assert f'id="log-download" href="/api/v1/trials/{trial_id}/logs/download"' in page.text


def test_an_unknown_checkpoint_or_trial_is_a_404(
    server: RunningServer, saved: dict[str, Any]
) -> None:
    assert_error(get(server, f"/trials/{saved['trial_id']}/checkpoints/step-9/download"), 404,
                 "has no checkpoint 'step-9'", f"muster checkpoint list {saved['trial_id']}")
    assert_error(get(server, f"/trials/999999/checkpoints/{saved['name']}/download"), 404,
                 "999999")


# -- who may ----------------------------------------------------------------------------------


def test_a_viewer_may_download_and_no_credential_may_not(
    server: RunningServer, client: Client, logged: int, saved: dict[str, Any]
) -> None:
    viewer = client.create_user("viewer-downloads", "viewer")["token"]
    for path in (f"/trials/{logged}/logs/download", download_path(saved)):
        assert get(server, path, token=viewer).status_code == 200, path
        refused = get(server, path, token="")
        assert refused.status_code == 401, path
        assert refused.json()["error"] == "Unauthorized"
        assert "content-disposition" not in refused.headers
