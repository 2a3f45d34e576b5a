"""The docs stay true to the code: every option, module and hook is documented."""

from pathlib import Path

from lynx.options import options
from lynx_patches.hooks import all_hooks

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
ARCHITECTURE = (ROOT / "docs" / "ARCHITECTURE.md").read_text()


def test_readme_documents_every_option_with_its_default():
    for opt in options():
        line = next((ln for ln in README.splitlines() if ln.startswith(f"| `{opt.flag}")), None)
        assert line is not None, f"{opt.flag} missing from README's option table"
        if not opt.is_switch:
            assert f"`{opt.default}`" in line, f"{opt.flag}: README default differs from {opt.default}"


def test_architecture_maps_every_module():
    packages = {
        "lynx": ROOT / "python" / "lynx",
        "lynx_deploy": ROOT / "python" / "lynx_deploy",
        "lynx_testing": ROOT / "testing" / "lynx_testing",
        "lynx_patches": ROOT / "lynx_patches",
        "lynx_kernels": ROOT / "kernels" / "lynx_kernels",
    }
    for name, folder in packages.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).as_posix()
            if path.name == "__init__.py" and (rel != "__init__.py" or name != "lynx_patches"):
                continue
            if path.name == "__main__.py" and (name, rel) != ("lynx_deploy", "__main__.py"):
                continue
            shown = f"{name}/{rel}" if name in ("lynx", "lynx_deploy", "lynx_testing") else rel
            assert f"`{shown}`" in ARCHITECTURE, f"{name}/{rel} missing from docs/ARCHITECTURE.md"


def test_architecture_lists_every_hook_target():
    for hook in all_hooks():
        owner, method = hook.target.rsplit(".", 2)[-2:]
        assert f"{owner}.{method}" in ARCHITECTURE, hook.target


def test_product_packages_never_import_the_harness():
    for folder in (ROOT / "python", ROOT / "lynx_patches", ROOT / "kernels" / "lynx_kernels"):
        for path in folder.rglob("*.py"):
            assert "lynx_testing" not in path.read_text(), f"{path.relative_to(ROOT)} imports the test harness"


def test_every_generated_block_of_the_docs_matches_its_committed_json():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "doc_tables.py"), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_product_file_over_300_lines_is_named_in_architecture_with_why():
    paragraph = next(p for p in ARCHITECTURE.split("\n\n") if "over 300 lines" in p)
    for folder in ("python/lynx", "python/lynx_deploy", "lynx_patches", "kernels/lynx_kernels"):
        for path in (ROOT / folder).rglob("*.py"):
            lines = len(path.read_text().splitlines())
            shown = path.relative_to(ROOT / ("python" if folder.startswith("python") else folder)).as_posix()
            assert lines <= 300 or f"`{shown}`" in paragraph, f"{folder}/{path.name}: {lines} lines, not in ARCHITECTURE"
