"""``provisioner completion bash|zsh`` (shtab, generated from the parser) fed to a real
``bash``: the function is registered for ``provisioner`` and completes commands, a group's
commands, options and file names the way Tab would (COMP_WORDS/COMP_CWORD as bash sets
them). The zsh script is checked as text (no zsh on the test machines). And the man page's
way into the Debian package (scripts/build-deb.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}
    return subprocess.run([sys.executable, "-m", "provisioner", *args], capture_output=True,
                          text=True, timeout=60, env=env, check=False)


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    done = _cli("completion", "bash")
    assert done.returncode == 0, done.stderr
    path = tmp_path_factory.mktemp("completion") / "provisioner.bash"
    path.write_text(done.stdout)
    return path


def _complete(script: Path, *words: str, cwd: Path | None = None) -> list[str]:
    """What bash offers for the command line ``provisioner WORDS…`` (the last word is the
    one being completed)."""
    line = " ".join(["provisioner", *words])
    program = (f'source "{script}"\n'
               "COMP_WORDS=(provisioner \"$@\"); COMP_CWORD=$#\n"
               f"COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}\n"
               '"$(complete -p provisioner | sed -E "s/.* -F ([^ ]+) .*/\\1/")" '
               'provisioner "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"\n'
               'printf "%s\\n" "${COMPREPLY[@]}"\n')
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", program, "bash", *words],
                          capture_output=True, text=True, timeout=30, check=True, cwd=cwd)
    return done.stdout.split()


def test_bash_registers_a_function_for_provisioner(bash_script: Path) -> None:
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c",
                           f'source <(cat "{bash_script}"); complete -p provisioner'],
                          capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.startswith("complete ") and done.stdout.split()[-1] == "provisioner"
    assert " -F " in done.stdout


def test_bash_completes_commands_and_group_commands(bash_script: Path) -> None:
    assert _complete(bash_script, "n") == ["node"]
    assert _complete(bash_script, "fa") == ["fabric"]
    every = _complete(bash_script, "")
    assert {"serve", "node", "fabric", "events", "import", "config", "completion"} <= set(every)
    assert sorted(_complete(bash_script, "node", "re")) == ["repair", "replace"]
    assert _complete(bash_script, "config", "ch") == ["check"]
    assert _complete(bash_script, "completion", "") == ["bash", "zsh"]


def test_bash_completes_options_and_config_files(bash_script: Path, tmp_path: Path) -> None:
    assert "--dry-run" in _complete(bash_script, "import", "--d")
    assert _complete(bash_script, "serve", "--con") == ["--config"]  # after the command too
    (tmp_path / "site.toml").write_text("")
    (tmp_path / "notes.txt").write_text("")
    assert "site.toml" in _complete(bash_script, "serve", "--config", "s", cwd=tmp_path)


def test_zsh_script_names_the_commands() -> None:
    done = _cli("completion", "zsh")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#compdef provisioner")
    for command in ("serve", "node", "fabric", "events", "import", "completion"):
        assert f"{command}:" in done.stdout or f"'{command}'" in done.stdout, command


def test_unknown_shell_is_a_usage_error() -> None:
    done = _cli("completion", "fish")
    assert done.returncode == 2 and "invalid choice" in done.stderr


def test_the_debian_package_installs_the_generated_man_page() -> None:
    script = (ROOT / "scripts" / "build-deb.sh").read_text()
    assert "provisioner/_shipped/man/provisioner.1" in script
    assert "/usr/share/man/man1/provisioner.1.gz" in script
    assert "argparse-manpage" in (ROOT / "pyproject.toml").read_text()
