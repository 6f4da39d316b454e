"""Which DVC remotes can hang `dvc push` / `dvc pull` (issue 36 item 5).

DVC sets no network timeout of its own: an S3 endpoint that accepts the connection and never answers
held `dvc push` (which `make run` ends with) for more than 300 s; dvc-ssh waits 1800 s by default.
`parity check` names every configured network remote that lacks the timeout options DVC offers for
its scheme, with the one command that sets them (docs/sharing.md, "Timeouts"). A directory remote
(what `make setup` adds) has nothing to time out.
"""
from __future__ import annotations

import os
from urllib.parse import urlparse

# the timeout options DVC's config schema (dvc/config_schema.py) accepts per scheme, and a value to suggest
TIMEOUTS = {
    "s3": {"connect_timeout": 10, "read_timeout": 60},
    "http": {"connect_timeout": 10, "read_timeout": 60},
    "https": {"connect_timeout": 10, "read_timeout": 60},
    "ssh": {"timeout": 30},
    "webdav": {"timeout": 60},
    "webdavs": {"timeout": 60},
    "azure": {"connection_timeout": 10, "read_timeout": 60},
}


def missing_timeouts(remotes: dict) -> list[str]:
    """One line per remote whose scheme has timeout options DVC knows and that sets none of some;
    `remotes` maps a remote's name to its config section (url + options)."""
    lines = []
    for name in sorted(remotes):
        section = remotes[name]
        scheme = urlparse(str(section.get("url", ""))).scheme.lower()
        wanted = TIMEOUTS.get(scheme, {})
        unset = [k for k in wanted if k not in section]
        if not unset:
            continue
        fix = " && ".join(f"dvc remote modify {name} {k} {wanted[k]}" for k in unset)
        lines.append(f"parity: warning: DVC remote '{name}' ({scheme}) sets no {' or '.join(unset)}: an endpoint "
                     f"that accepts and never answers holds `dvc push`/`dvc pull` for minutes; set it: {fix} "
                     "(docs/sharing.md, 'Timeouts')")
    return lines


def remote_warnings(root: str = ".") -> list[str]:
    """The warnings for the DVC repo at `root` (repo, local, global and system config merged as DVC
    merges them); none when `root` is not a DVC repo or its config cannot be read (DVC says why itself)."""
    from dvc.config import Config, ConfigError  # lazy: `parity check` only; dvc.config +0.2 s

    dvc_dir = os.path.join(root, ".dvc")
    if not os.path.isdir(dvc_dir):
        return []
    try:
        remotes = Config(dvc_dir=dvc_dir)["remote"]
    except ConfigError:
        return []
    return missing_timeouts({k: dict(v) for k, v in remotes.items()})
