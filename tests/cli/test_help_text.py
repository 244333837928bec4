"""`--help` shows what the code says: typer renders help through rich markup, which silently drops a
bracketed word (`run`'s "a config with only [generate] runs SD generation" printed "only  runs"), and keeps
the line breaks inside a docstring's paragraph."""

from __future__ import annotations

import inspect

import typer
from rich.markup import render
from typer.testing import CliRunner

from autospec.cli import app


def _commands():
    root = typer.main.get_command(app)
    return [root, *root.commands.values()]


def test_no_help_text_is_eaten_as_rich_markup():
    eaten = [f"{command.name} {name}: {text!r}" for command in _commands()
             for name, text in [("help", command.help), *((p.name, getattr(p, "help", None)) for p in command.params)]
             if text and render(text).plain != text]
    assert not eaten


def test_every_help_paragraph_is_one_source_line():
    """Typer keeps a docstring's line breaks (in the command list, and in `--help` after the first
    paragraph), so a paragraph wrapped in the source prints wrapped at the source's column."""
    wrapped = [command.name for command in _commands()
               if any("\n" in paragraph for paragraph in inspect.cleandoc(command.help or "").split("\n\n"))]
    assert not wrapped


def test_the_run_help_shows_its_generate_table():
    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "a config with only a `generate` table runs SD generation" in result.output
