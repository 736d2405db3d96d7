"""The two-host part of docs/tutorials/split-own-tables.md, run as written across two network namespaces: host B
serves its own task on its own table, host A leads with its own; only ``FOLLOWER=...`` is replaced."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from test_docs_tutorials import blocks
from test_split_two_hosts import ADDRESS, _stop, _wait, host_homes, need_netns

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "tutorials" / "split-own-tables.md"
THIS = f"tests/{Path(__file__).name}::test_own_tables_across_two_hosts"


def _recipe() -> tuple[dict[str, str], str]:
    """Each host's block (``# host A`` / ``# host B``) and the job file the page writes (``vertical.toml``)."""
    hosts, job = {}, ""
    for lang, code, name, cover in blocks(PAGE):
        if name == "vertical.toml":
            job = code
        if cover == THIS:
            m = re.fullmatch(r"# host ([AB])", code.splitlines()[0].strip())
            assert lang == "bash" and m, code
            hosts[m.group(1)] = code
    return hosts, job


def test_recipe_blocks_are_tagged() -> None:
    hosts, job = _recipe()
    assert set(hosts) == {"A", "B"} and "factory" in job
    assert len(ADDRESS.findall(hosts["A"])) == 1 and "--role leader" in hosts["A"] and "--role follower" in hosts["B"]
    assert "rm tables/leader.csv" in hosts["B"] and "rm tables/follower-1.csv" in hosts["A"]


@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_own_tables_across_two_hosts(tmp_path: Path) -> None:
    need_netns()
    from sluice.transport.netns import NetnsPair
    hosts, job = _recipe()
    homes = host_homes(tmp_path)
    (homes["A"] / "vertical.toml").write_text(job)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    logs = {h: tmp_path / f"host{h}.log" for h in homes}
    procs: dict[str, subprocess.Popen] = {}
    with NetnsPair(rate_mbit=100, subnet="10.231.82") as net:
        code_a, n = ADDRESS.subn(f"FOLLOWER={net.addr_b}", hosts["A"])
        assert n == 1
        try:
            for h, ns, code in (("B", net.ns_b, hosts["B"]), ("A", net.ns_a, code_a)):
                with open(logs[h], "w") as out:
                    procs[h] = subprocess.Popen(net.exec_in(ns) + ["bash", "-c", "set -euo pipefail\n" + code],
                                                cwd=homes[h], env=env, stdout=out, stderr=subprocess.STDOUT,
                                                start_new_session=True)
                if h == "B":
                    _wait("host B's follower listens", lambda: "listening on" in logs["B"].read_text(),
                          [procs["B"]], [logs["B"]], 180)
            try:
                rc_a, rc_b = procs["A"].wait(420), procs["B"].wait(60)
            except subprocess.TimeoutExpired:
                pytest.fail("the two-host run did not end:\n" + logs["A"].read_text()[-4000:]
                            + logs["B"].read_text()[-4000:])
        finally:
            for proc in procs.values():
                _stop(proc)
    text_a, text_b = logs["A"].read_text(), logs["B"].read_text()
    assert rc_a == 0 and rc_b == 0, text_a[-4000:] + "\n--- host B ---\n" + text_b[-3000:]
    assert not (homes["A"] / "tables" / "follower-1.csv").exists()
    assert not (homes["B"] / "tables" / "leader.csv").exists()
    s = json.loads((homes["A"] / "runs" / "vertical-hosts" / "summary.json").read_text())
    assert 0 < s["aligned_samples"] < s["table_rows"]["leader"] and s["final_test_accuracy"] > 0.8
