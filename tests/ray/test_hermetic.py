"""The Ray test cluster keeps to its own home: a token left by another cluster does not reach it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.ray.conftest import UNRELATED_TOKEN


def test_a_token_in_the_users_home_neither_reaches_nor_changes_the_cluster(ray_cluster, user_home):
    # The cluster started (its second node joined) on behalf of a user whose
    # ~/.ray/auth_token belongs to another cluster: a head reading it would
    # have refused that node with InvalidAuthToken.
    done = ray_cluster.driver("homes")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    home, tmp = ray_cluster.env["HOME"], ray_cluster.env["TMPDIR"]
    assert Path(home).parent == Path(tmp).parent  # one folder, deleted at teardown
    assert result["driver"] == [home, tmp]
    assert len(result["nodes"]) == 2
    for worker_home, worker_tmp, child_home, child_tmp in result["nodes"]:
        assert (worker_home, worker_tmp, child_home, child_tmp) == (home, tmp, home, tmp)
    assert home not in (str(user_home), os.environ.get("HOME"))
    assert not any(k.startswith("RAY_") for k in ray_cluster.env if k != "RAY_USAGE_STATS_ENABLED")
    # The user's home is left as it was.
    assert sorted(p.relative_to(user_home).as_posix() for p in user_home.rglob("*")) == [".ray", ".ray/auth_token"]
    assert (user_home / ".ray" / "auth_token").read_text() == UNRELATED_TOKEN
    assert not (Path(home) / ".ray" / "auth_token").exists()  # no token auth: none was generated either
