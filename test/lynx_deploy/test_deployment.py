"""A deployment leaving its with-block on an error leaves each server's stacks in its log; a failed
assertion (the answers were wrong, the servers were not stuck) does not."""

from __future__ import annotations

import pytest

from lynx_deploy.deployment import PDDeployment


@pytest.mark.parametrize("error,dumped", [(TimeoutError("timed out"), True), (AssertionError("wrong token"), False)])
def test_an_error_in_the_with_block_dumps_every_servers_stacks_before_stopping(tmp_path, error, dumped):
    pd = PDDeployment(tmp_path, log_dir=tmp_path, prefill_servers=2)
    reasons = []
    for server in (*pd.prefills, pd.decode):
        server.dump_stacks = lambda reason, log=server.log_path.name: reasons.append((log, reason))
    pd.__exit__(type(error), error, None)  # never started: stopping is a no-op

    expected = ["prefill.log", "prefill1.log", "decode.log"] if dumped else []
    assert [log for log, _ in reasons] == expected
    assert all(f"TimeoutError: {error}" in reason for _, reason in reasons)
