"""Generated docs: the README's method table (flcore/readme_table.py) and docs/METHODS.md (flcore/methods_doc.py) follow
the declarations: every declared method has its row and its entry, and the checks name what is missing."""

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


def test_methods_md_is_generated_from_the_declarations_and_lists_every_page():
    from flcore import methods_doc

    text = (methods_doc.ROOT / "docs" / "METHODS.md").read_text()
    assert text == methods_doc.render(), "run `python -m flcore.methods_doc > docs/METHODS.md`"
    for page in sorted(methods_doc.PAGES.glob("*.md")):
        assert f"(methods/{page.name})" in text
    for name, decl in methods().items():  # every method, each recipe value with its source
        assert f"- `{name}`:" in text
        for key in decl.recipe:
            assert f"recipe `{key} = " in text
