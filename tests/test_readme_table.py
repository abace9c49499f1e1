"""The README's method table is generated from the declarations (flcore/readme_table.py): every declared method
has its row, and the check names a missing one."""

from __future__ import annotations

from flcore import readme_table
from flcore.methods import MODULES
from flcore.registry import methods


def test_the_readme_method_table_is_current_and_lists_every_declared_method():
    assert readme_table.main(["--check"]) == 0, "run `python -m flcore.readme_table`"
    text = (readme_table.PROJECT_ROOT / "README.md").read_text()
    block = text[text.index(readme_table.BEGIN):text.index(readme_table.END)]
    for name in methods():
        assert f"`{name}`" in block, name


def test_the_check_names_a_missing_row(tmp_path, monkeypatch, capsys):
    text = (readme_table.PROJECT_ROOT / "README.md").read_text()
    row = readme_table.rows()[1]
    copy = tmp_path / "README.md"
    copy.write_text(text.replace(row + "\n", ""))
    monkeypatch.setattr(readme_table, "PROJECT_ROOT", tmp_path)
    assert readme_table.main(["--check"]) == 1
    assert f"missing or stale: {row}" in capsys.readouterr().out


def test_declaration_modules_are_discovered_by_name():
    import pkgutil
    from pathlib import Path

    import flcore.methods as pkg

    files = {m.name for m in pkgutil.iter_modules([str(Path(pkg.__file__).parent)]) if not m.name.startswith("_")}
    assert list(MODULES) == sorted(files)
