"""The ``[slurm]`` section: bad values stop the daemon naming the key; the JWT is masked."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.config import effective_config, load_settings
from provisioner.errors import ConfigError


@pytest.mark.parametrize(("text", "needle"), [
    ('restd_url = "slurm:6820"', "slurm.restd_url: Value error, expected an http(s):// URL"),
    ('nodesets = { gpu = "not valid!" }', "slurm.nodesets: Value error, gpu = 'not valid!'"),
    ('nodeset_label = "feature.node.kubernetes.io/x"', "slurm.nodeset_label"),
    ("poll_interval_s = 0", "slurm.poll_interval_s"),
    ('reason_prefix = ""', "slurm.reason_prefix"),
])
def test_bad_slurm_settings_name_the_key(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(f"[slurm]\n{text}\n")
    with pytest.raises(ConfigError, match="invalid config") as caught:
        load_settings(path)
    assert needle in str(caught.value)


def test_jwt_is_masked(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[slurm]\nenabled = true\nrestd_url = "http://ctld:6820"\n'
                    'jwt_token = "eyJsecret"\n')
    settings = load_settings(path)
    assert settings.slurm.jwt_token is not None
    assert settings.slurm.jwt_token.get_secret_value() == "eyJsecret"
    assert "eyJsecret" not in str(effective_config(settings))
