"""Secrets a job needs (`environment.secrets`): where each value comes from, where it is
kept, and where it must never appear.

```yaml
environment:
  secrets:
    WANDB_API_KEY: submit            # sent with the submission (the CLI reads it from the
                                     # submitter's environment, or --secret NAME=VALUE)
    HF_TOKEN: env:HF_TOKEN           # the server's environment, read at each launch
    S3_KEY: file:/etc/muster/s3-key  # a file on the server, read at each launch
```

A list of names means `submit` for each. The config (stored, returned by the API) holds
only the names and their sources. A submitted value is kept in
`$MUSTER_HOME/secrets/experiments/<uuid>.json` (0600, in a 0700 directory; never the
database), removed with the experiment's files. At launch every value is put into the
replicas' environment (their spec files are 0600), and the logs muster serves show each
value of `MIN_MASKED_CHARS` or more characters as `*`s of the same length, so byte offsets
stay true. A value is masked where it appears whole; muster cannot know a script printed it
split in two, or encoded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from muster.atomic import atomic_write_json
from muster.config import ExperimentConfig
from muster.config.secrets import SUBMIT, SecretSource, source_of
from muster.containment import inside
from muster.errors import ConfigError
from muster.home import Home

__all__ = ["MAX_SECRET_CHARS", "MIN_MASKED_CHARS", "SUBMIT", "SecretSource", "check_server",
           "check_submitted", "home_file_problem", "masked_values", "resolve", "save_submitted",
           "source_of", "submitted_names"]

MAX_SECRET_CHARS = 64 * 1024
MIN_MASKED_CHARS = 4  # shorter values would mask ordinary text ("1", "on")


def submitted_names(config: ExperimentConfig) -> list[str]:
    """The secrets whose values come with the submission."""
    return [name for name, text in config.environment.secrets.items()
            if source_of(text).kind == "submit"]


def check_submitted(config: ExperimentConfig, values: Mapping[str, str]) -> list[str]:
    """Problems with the submitted values: one missing or not declared, or unusable."""
    wanted = set(submitted_names(config))
    problems = [f"environment.secrets.{name}: its value was not sent; the CLI sends it from "
                f"your environment (export {name}=...) or --secret {name}=VALUE"
                for name in sorted(wanted - values.keys())]
    problems += [f"secrets: {name!r} was sent but the config declares no such secret "
                 f"`submit` (environment.secrets)" for name in sorted(values.keys() - wanted)]
    for name in sorted(wanted & values.keys()):
        value = values[name]
        if not isinstance(value, str) or "\0" in value or len(value) > MAX_SECRET_CHARS:
            problems.append(f"environment.secrets.{name}: the value must be text without a "
                            f"NUL byte, at most {MAX_SECRET_CHARS:,} characters")
    return problems


def check_server(config: ExperimentConfig, environ: Mapping[str, str], home: Path
                 ) -> list[str]:
    """Problems with the values the server reads itself, found now rather than at launch
    (whether the submitter may name them at all is `muster.services.allowances`)."""
    problems = []
    for name, text in config.environment.secrets.items():
        try:
            read_on_server(name, source_of(text), environ, home)
        except ConfigError as exc:
            problems.append(f"environment.secrets.{name}: {exc}")
    storage = config.checkpoint_storage
    for name in ("access_key", "secret_key"):
        text = getattr(storage, name)
        if text is None:
            continue
        try:
            read_on_server(name, source_of(text), environ, home)
        except ConfigError as exc:
            problems.append(f"checkpoint_storage.{name}: {exc}")
    if storage.type == "shared_fs" and storage.path is not None:
        problems += _writable_directory(storage.path)
    return problems


def _writable_directory(path: str) -> list[str]:
    """A problem when the server cannot make or write `path` (checkpoint_storage.path)."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return [f"checkpoint_storage.path: the server cannot make {path} "
                f"({exc.strerror or exc}); name a directory it can write"]
    if not os.access(path, os.W_OK | os.X_OK):
        return [f"checkpoint_storage.path: the server cannot write in {path}; name a "
                "directory it can write"]
    return []


def save_submitted(home: Home, experiment_uuid: str, values: Mapping[str, str]) -> None:
    """Keep the submitted values for the experiment's launches (0600)."""
    path = home.secrets_file(experiment_uuid)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write_json(path, dict(values), mode=0o600)


def delete_submitted(home: Home, experiment_uuid: str) -> None:
    home.secrets_file(experiment_uuid).unlink(missing_ok=True)


def resolve(config: ExperimentConfig, home: Home, experiment_uuid: str,
            environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every secret's value, for a launch.

    Raises:
        ConfigError: one that cannot be read now, naming it and its source.
    """
    environ = os.environ if environ is None else environ
    declared = config.environment.secrets
    if not declared:
        return {}
    submitted = _submitted_values(home, experiment_uuid) if submitted_names(config) else {}
    values = {}
    for name, text in declared.items():
        source = source_of(text)
        if source.kind == "submit":
            if name not in submitted:
                raise ConfigError(f"secret {name}: its submitted value is gone from "
                                  f"{home.secrets_file(experiment_uuid)}; submit the "
                                  "experiment again")
            values[name] = submitted[name]
        else:
            try:
                values[name] = read_on_server(name, source, environ, home.root)
            except ConfigError as exc:
                raise ConfigError(f"secret {name}: {exc}") from None
    return values


def masked_values(secrets: Mapping[str, str], home: Home, experiment_uuid: str
                  ) -> list[bytes]:
    """The values logs must not show (those long enough to mask), longest first, of the
    config's `environment.secrets` (name -> source); the ones that cannot be read now are
    left out (they never reached a job either)."""
    found: list[bytes] = []
    for name, text in secrets.items():
        try:
            source = source_of(str(text))
        except ValueError:
            continue
        try:
            value = (_submitted_values(home, experiment_uuid).get(name, "")
                     if source.kind == "submit"
                     else read_on_server(name, source, os.environ, home.root))
        except ConfigError:
            continue
        if len(value) >= MIN_MASKED_CHARS:
            found.append(value.encode("utf-8", "surrogateescape"))
    return sorted(set(found), key=len, reverse=True)


def _submitted_values(home: Home, experiment_uuid: str) -> dict[str, str]:
    try:
        data = json.loads(home.secrets_file(experiment_uuid).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"the submitted secrets of experiment {experiment_uuid} cannot be "
                          f"read: {exc}") from exc
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def home_file_problem(source: SecretSource, home: Path) -> str:
    """Why a `file:` source in `home` is never read ("" when it is not there)."""
    if source.kind != "file" or not inside(source.where, [str(home)]):
        return ""
    return (f"{source.where} is in the server's home ($MUSTER_HOME), whose files are "
            "never read for a job; keep the secret elsewhere, or send it with the submission")


def read_on_server(name: str, source: SecretSource, environ: Mapping[str, str],
                   home: Path) -> str:
    """The value of an `env:` or `file:` source, never a file in `home` (the server's own:
    its token, database and submitted secrets), whoever asks.

    Raises:
        ConfigError: it cannot be read, or is in `home`.
    """
    if source.kind == "submit":
        return ""
    if problem := home_file_problem(source, home):
        raise ConfigError(problem)
    if source.kind == "env":
        if source.where not in environ:
            raise ConfigError(f"the server's environment has no {source.where}; set it "
                              "where `muster up` starts, or use another source")
        return environ[source.where]
    try:
        text = Path(source.where).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"the server cannot read {source.where} ({exc}); make it readable "
                          "by the server's user, or use another source") from None
    if len(text) > MAX_SECRET_CHARS or "\0" in text:
        raise ConfigError(f"{source.where} is not a usable secret (more than "
                          f"{MAX_SECRET_CHARS:,} characters, or a NUL byte)")
    return text.removesuffix("\n")
