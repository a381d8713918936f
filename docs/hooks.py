"""MkDocs hooks (`hooks:` in mkdocs.yml): pages and pictures generated when the docs build.

- `reference/cli.md`: the `--help` of `ensemble` and of every command, rendered from the
  argparse parser itself (`pipelines.options.build_parser`), so the page cannot drift from
  the CLI.
- `figures/*.png`: made by `docs/figures.py` from real small runs. They are cached under
  `.cache/docs-figures/<key>/`, the key being the sha256 of the code that makes them (the
  `ensemble` and `pipelines` sources and the script), so `mkdocs serve` does not retrain on
  every edit of a page. `ENSEMBLE_DOCS_FIGURES=DIR` uses the PNGs already in DIR instead.
"""
from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
HELP_COLUMNS = "80"  # the help's width: a terminal of 80 columns (fits the page)


def _parser():
    sys.path.insert(0, str(ROOT))
    from pipelines.cli import COMMANDS
    from pipelines.options import build_parser

    return build_parser(COMMANDS)


def _help(parser) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        parser.print_help()
    return out.getvalue().rstrip()


def cli_page() -> str:
    """The CLI reference in Markdown: the top-level help, then one section per command."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        parser = _parser()
        parts = ["# CLI reference", "",
                 "Generated from the argparse parser when the docs build (`ensemble --help` "
                 "and `ensemble COMMAND --help` in a terminal of 80 columns), so it is what "
                 "the installed command prints. The [CLI guide](cli-guide.md) explains the "
                 "shared values (`SOURCE`, `SPEC`), progress, output and exit status.", "",
                 "## ensemble", "", "```text", _help(parser), "```", ""]
        for name, sub in parser.commands.items():
            parts += [f"## ensemble {name}", "", "```text", _help(sub), "```", ""]
        return "\n".join(parts)
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved


def _figures_key() -> str:
    digest = hashlib.sha256()
    sources = sorted([*ROOT.glob("ensemble/**/*.py"), *ROOT.glob("pipelines/**/*.py"),
                      ROOT / "docs" / "figures.py"])
    for path in sources:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def figures_dir() -> Path:
    """The folder holding every figure of `docs/figures.py`, made now if not cached."""
    given = os.environ.get("ENSEMBLE_DOCS_FIGURES")
    if given:
        return Path(given)
    folder = ROOT / ".cache" / "docs-figures" / _figures_key()
    sys.path.insert(0, str(ROOT / "docs"))
    from figures import FIGURES

    if not all((folder / name).is_file() for name in FIGURES):
        subprocess.run([sys.executable, str(ROOT / "docs" / "figures.py"), str(folder)],
                       check=True, timeout=1200)
    return folder


def on_files(files, config):
    """Add the generated CLI page and the figures to the site's files."""
    files.append(File.generated(config, "reference/cli.md", content=cli_page()))
    folder = figures_dir()
    for png in sorted(folder.glob("*.png")):
        files.append(File.generated(config, f"figures/{png.name}", abs_src_path=str(png)))
    return files
