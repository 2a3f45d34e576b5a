"""scripts/debian_mirror.sh finds the Debian mirror in apt's own sources, in both formats, or fails saying so."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def mirror(apt: Path, suite: str = "bookworm") -> subprocess.CompletedProcess:
    command = ["bash", str(ROOT / "scripts" / "debian_mirror.sh"), suite, str(apt)]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def apt_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "sources.list.d").mkdir()
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def test_one_line_sources_skip_comments_options_source_packages_and_other_suites(tmp_path):
    apt = apt_dir(tmp_path, {"sources.list": """\
        # deb http://commented.example/debian bookworm main
        deb-src http://src.example/debian bookworm main
        deb http://security.example/debian-security bookworm-security main
        deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://one.example/debian/ bookworm main contrib
        """})
    result = mirror(apt)
    assert result.returncode == 0 and result.stdout == "http://one.example/debian\n"


def test_deb822_sources_with_continuation_lines_and_disabled_stanzas(tmp_path):
    apt = apt_dir(tmp_path, {"sources.list.d/debian.sources": """\
        Types: deb-src
        URIs: http://src.example/debian
        Suites: bookworm

        Types: deb
        URIs: http://off.example/debian
        Suites: bookworm
        Enabled: no

        # a comment inside a stanza
        Types: deb deb-src
        URIs:
         http://first.example/debian
         http://second.example/debian
        Suites: bookworm-updates
         bookworm
        Components: main
        """})
    assert mirror(apt).stdout == "http://first.example/debian\n"
    assert mirror(apt, "bookworm-updates").stdout == "http://first.example/debian\n"


def test_apt_order_sources_list_first_then_the_folder_by_name_and_only_list_or_sources_files(tmp_path):
    apt = apt_dir(tmp_path, {
        "sources.list.d/b.list": "deb http://b.example/debian bookworm main\n",
        "sources.list.d/a.sources": "Types: deb\nURIs: http://a.example/debian\nSuites: bookworm\n",
        "sources.list.d/0.list.disabled": "deb http://disabled.example/debian bookworm main\n",
    })
    assert mirror(apt).stdout == "http://a.example/debian\n"
    (apt / "sources.list").write_text("deb http://main.example/debian bookworm main\n")
    assert mirror(apt).stdout == "http://main.example/debian\n"


def test_no_mirror_for_the_suite_is_an_error_with_no_fallback(tmp_path):
    apt = apt_dir(tmp_path, {"sources.list.d/node.sources": "Types: deb\nURIs: https://node.example\nSuites: nodistro\n"})
    result = mirror(apt)
    assert result.returncode == 1 and result.stdout == ""
    assert "no Debian mirror for 'bookworm' in apt's sources" in result.stderr
    assert mirror(tmp_path / "missing").returncode == 1
