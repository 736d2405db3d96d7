"""A user's own upload compressor: ``compression.uplink = "package.module:function"`` names a function outside
the package that returns a stage chain (or a Compressor); the built-in names of ``compression.up`` are the
same chains, message for message; a bad reference or function is a one-line ConfigError."""

from __future__ import annotations

import re
import sys
import textwrap
import typing
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from sluice.compress import UPLINKS, Compressor, decode_to_dense, make_uplink
from sluice.config import load_config
from sluice.errors import ConfigError
from sluice.hfl import HFLEngine
from sluice.hfl.config import CompressionConfig, HFLConfig

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "explanation" / "compression.md"
SMALL = ["train.rounds=3", "data.num_clients=8", "model.hidden=[16]", "train.local_epochs=1"]
MODULES = ("user_uplinks", "my_uplink")

USER_UPLINKS = '''
from sluice.compress import Compressor, Stage, cast, chain, sample, to_bytes, topk

SENT = []
"""The length of every message the recording chain sent."""


def _record():
    def update(inp, state, rng):
        SENT.append(len(inp))
        return inp, state

    return Stage(lambda d: None, update)


def topk_int8(cfg):
    return chain(topk(cfg.up_ratio), cast("int8"), to_bytes(), _record())


def topk_fixed(cfg):
    return chain(topk(0.01), cast("int8"), to_bytes())


def sample_payload(cfg):
    return chain(sample(cfg.up_ratio), cast("sign"))


def compressor(cfg):
    return Compressor(chain(topk(cfg.up_ratio), cast("int8"), to_bytes()), name="mine")


def fails(cfg):
    raise ValueError("no such\\n   thing")


def plain_tuple(cfg):
    return (lambda d: None, lambda x, s, rng: (x, s))


NOT_A_FUNCTION = 3
'''


def _doc_blocks() -> tuple[str, str]:
    """The compression page's ``my_uplink.py`` and the ``sluice run`` line that uses it."""
    text = DOC.read_text(encoding="utf-8")
    module = re.search(r'```python title="my_uplink.py"\n(.*?)^```', text, re.S | re.M)
    command = re.search(r"^PYTHONPATH=\. \.venv/bin/sluice run (--set compression\.uplink=my_uplink:make.*)$", text,
                        re.M)
    assert module and command, "docs/explanation/compression.md lost its 'Your own compression chain' example"
    return module.group(1), command.group(1)


@pytest.fixture
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``user_uplinks`` and the page's ``my_uplink``, importable from a directory outside the package."""
    (tmp_path / "user_uplinks.py").write_text(textwrap.dedent(USER_UPLINKS), encoding="utf-8")
    (tmp_path / "my_uplink.py").write_text(_doc_blocks()[0], encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in MODULES:
        sys.modules.pop(name, None)
    yield tmp_path
    for name in MODULES:
        sys.modules.pop(name, None)


def _messages(comp: Compressor, d: int = 2000, n: int = 5) -> list[bytes]:
    rng = np.random.default_rng(3)
    x = np.random.default_rng(1).normal(size=d) * np.random.default_rng(2).exponential(size=d)
    state, out = comp.init(d), []
    for t in range(n):
        buf, state = comp.encode(x * (t + 1) - t, state, rng)
        out.append(buf)
    return out


def _run(sets: list[str], rounds: int = 3) -> tuple[list[int], list[float], HFLEngine, int]:
    """Bytes up and test accuracy of each round of a small default job, the engine, and the uploads made."""
    eng = HFLEngine(load_config(None, SMALL + sets, HFLConfig))
    events = [eng.iterate() for _ in range(rounds)]
    uploads = sum(int(e.metrics["participants"]) for e in events)
    return [e.bytes_up for e in events], [e.metrics["test_accuracy"] for e in events], eng, uploads


def test_a_user_chain_trains_and_every_byte_it_sent_is_counted(user_modules: Path) -> None:
    mod = __import__("user_uplinks")
    up, acc, eng, uploads = _run(['compression.uplink="user_uplinks:topk_int8"'])
    assert repr(eng.clients[0].uplink) == "Compressor(user_uplinks:topk_int8)"
    assert all(b > 0 for b in up) and sum(up) == sum(mod.SENT)
    assert len(mod.SENT) == uploads >= 3
    # the string shortcut for the same chain sends the same messages: same bytes, same model
    assert _run(['compression.up="topk"', 'compression.up_values="int8"', "compression.up_feedback=false"])[:2] \
        == (up, acc)


def test_the_documented_chain_is_the_string_shortcut_round_for_round(user_modules: Path) -> None:
    _, command = _doc_blocks()
    sets = [s for s in re.findall(r"--set (\S+)", command) if not s.startswith("train.rounds=")]
    assert sets == ["compression.uplink=my_uplink:make"]
    mine = _run(sets)
    assert mine[2].cfg.compression.weighted_uploads  # the uploads got shares of up_ratio by weight
    assert mine[:2] == _run(['compression.up="topk"', 'compression.up_values="int8"'])[:2]


@pytest.mark.parametrize(("ref", "shortcut"), [
    ("user_uplinks:topk_fixed", {"up": "topk", "up_ratio": 0.01, "up_values": "int8", "up_feedback": False}),
    ("my_uplink:make", {"up": "topk", "up_ratio": 0.05, "up_values": "int8"}),
    ("user_uplinks:sample_payload", {"up": "sample", "up_ratio": 0.05, "up_feedback": False}),
    ("user_uplinks:compressor", {"up": "topk", "up_ratio": 0.05, "up_values": "int8", "up_feedback": False}),
])
def test_a_user_chain_sends_what_its_string_shortcut_sends(user_modules: Path, ref: str,
                                                           shortcut: dict[str, object]) -> None:
    ratio = typing.cast(float, shortcut["up_ratio"])
    mine = make_uplink(CompressionConfig(uplink=ref, up_ratio=ratio))
    theirs = make_uplink(CompressionConfig(**shortcut))  # type: ignore[arg-type]
    sent = _messages(mine)
    assert sent == _messages(theirs)
    assert all(decode_to_dense(m, 2000).shape == (2000,) for m in sent)


def test_a_returned_compressor_is_used_as_it_is(user_modules: Path) -> None:
    assert repr(make_uplink(CompressionConfig(uplink="user_uplinks:compressor"))) == "Compressor(mine)"


@pytest.mark.parametrize(("ref", "message"), [
    ("no_such_module_here:make", r"^compression\.uplink 'no_such_module_here:make': cannot import "
                                 r"'no_such_module_here': No module named"),
    ("user_uplinks:missing", r"^compression\.uplink 'user_uplinks:missing': module 'user_uplinks' has no 'missing'$"),
    ("user_uplinks:NOT_A_FUNCTION", r"^compression\.uplink 'user_uplinks:NOT_A_FUNCTION' is a int, not a function$"),
    ("user_uplinks:fails", r"^compression\.uplink 'user_uplinks:fails' failed: ValueError: no such thing$"),
    ("user_uplinks:plain_tuple", r"^compression\.uplink 'user_uplinks:plain_tuple' returned tuple, not a "
                                 r"sluice\.compress Stage \(a chain of stages\) or Compressor$"),
])
def test_a_bad_uplink_is_a_one_line_config_error(user_modules: Path, ref: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        make_uplink(CompressionConfig(uplink=ref))
    assert "\n" not in str(err.value)
    eng = HFLEngine(load_config(None, [*SMALL, f'compression.uplink="{ref}"'], HFLConfig))
    with pytest.raises(ConfigError, match=message):
        eng.iterate()


def test_an_uplink_reference_names_a_module_and_a_function() -> None:
    for ref in ("my_uplink", "my_uplink:", ":make"):
        with pytest.raises(ConfigError, match=r"compression\.uplink: .*must be 'package\.module:function'"):
            load_config(None, [f'compression.uplink="{ref}"'], HFLConfig)


def test_the_names_of_up_are_the_uplink_registry() -> None:
    choices = typing.get_args(CompressionConfig.model_fields["up"].annotation)
    assert tuple(UPLINKS) == choices
