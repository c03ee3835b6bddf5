"""The site key on the device: checked at configuration time, rotating every release, its id in every template."""

from __future__ import annotations

import os

import numpy as np
import pytest
from peep.core.sitekey import SiteKey
from peep.core.wire import decode_template, template_values
from peep.edge.agent import Agent
from peep.edge.capture import VideoSource
from peep.edge.cli import main
from peep.edge.config import load_config
from peep.edge.errors import ConfigError


def _released(agent: Agent, path: str) -> list:
    pipeline = agent.open()
    src = VideoSource(path, kind="file")
    while (frame := src.read()) is not None:
        pipeline.process(frame)
    src.close()
    assert agent.spool is not None
    return [decode_template(it.payload) for it in agent.spool.peek("mqtt", 10_000)]


PRIVUNIT = {"mechanism": "privunit", "epsilon": 400.0, "track_budget": 1e6, "window_seconds": 1.0}


@pytest.mark.slow
def test_a_keyed_device_releases_rotated_templates_carrying_the_key_id(make_config, one_person_video, tmp_path):
    key = SiteKey.generate()
    key_file = key.write(tmp_path / "site.key")
    out = {}
    for name, privacy in (("plain", PRIVUNIT), ("keyed", {**PRIVUNIT, "site_key": str(key_file)})):
        agent = Agent(load_config(make_config(f"{name}.toml", privacy=privacy,
                                              device={"state_dir": str(tmp_path / name)})), environ={})  # fmt: skip
        try:
            out[name] = _released(agent, one_person_video["path"])
        finally:
            agent.shutdown(drain_timeout=0)
    plain, keyed = out["plain"], out["keyed"]
    assert plain and keyed
    assert {m.key_id for m in plain} == {""} and {m.key_id for m in keyed} == {key.key_id}
    # Same mechanism and ε in every template: the key changes the direction, not the guarantee.
    assert {(m.mechanism.epsilon_vector, m.mechanism.kind) for m in keyed} == {
        (m.mechanism.epsilon_vector, m.mechanism.kind) for m in plain
    }
    # At ε = 400 the releases sit close to the (unit) projection: undoing the key's rotation brings the keyed
    # ones onto the unkeyed ones of the same person; without undoing it they point elsewhere.
    p = np.mean([template_values(m) for m in plain], axis=0)
    k = np.mean([template_values(m) for m in keyed], axis=0)
    q = key.rotation(p.size)
    cos = lambda a, b: float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))  # noqa: E731
    assert cos(k @ q, p) > 0.9 and abs(cos(k, p)) < 0.5


def test_a_key_with_a_mechanism_a_rotation_would_clip_is_refused_at_configuration(make_config, tmp_path):
    key_file = SiteKey.generate().write(tmp_path / "site.key")
    with pytest.raises(ConfigError, match=r"privacy.*site_key: mechanism 'peep': a site key rotates"):
        load_config(make_config(privacy={"mechanism": "peep", "epsilon": 4.0, "site_key": str(key_file)}))


def test_a_key_others_may_read_stops_the_agent_naming_it(make_config, tmp_path):
    key_file = SiteKey.generate().write(tmp_path / "site.key")
    os.chmod(key_file, 0o640)
    cfg = load_config(make_config(privacy={**PRIVUNIT, "site_key": str(key_file)}))
    with pytest.raises(ConfigError, match=r"privacy.site_key: site key .*expected mode 0600.*received 0640"):
        Agent(cfg, environ={}).prepare()


def test_site_key_commands(tmp_path, capsys):
    path = tmp_path / "k" / "site.key"
    path.parent.mkdir()
    assert main(["site-key", "generate", "--out", str(path)]) == 0
    made = capsys.readouterr().out
    assert main(["site-key", "id", str(path)]) == 0
    key_id = capsys.readouterr().out.strip()
    assert key_id.startswith("sk-") and key_id in made and os.stat(path).st_mode & 0o777 == 0o600
    assert main(["site-key", "generate", "--out", str(path)]) == 2
    assert "never overwritten" in capsys.readouterr().err
