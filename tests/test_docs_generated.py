"""docs/columns.md and docs/cli.md are what scripts/gen_docs.py makes from the code now: a column or a flag added
without regenerating them fails here (`python scripts/gen_docs.py` rewrites both)."""

from __future__ import annotations

import importlib
import re
import textwrap

from harness.results import record
from scripts import gen_docs
from tests.cli_runs import ROOT


def test_the_committed_pages_are_what_the_code_makes_now(capsys):
    # The backends page (the capability matrix, seconds to make) has its own test in tests/test_backend_matrix.py.
    for path, make in ((gen_docs.COLUMNS_PAGE, gen_docs.columns_markdown), (gen_docs.CLI_PAGE, gen_docs.cli_markdown)):
        assert (ROOT / path).read_text() == make(), f"run `python scripts/gen_docs.py` and commit {path}"


def test_the_columns_page_lists_every_column_of_a_row_in_csv_order():
    text = (ROOT / gen_docs.COLUMNS_PAGE).read_text()
    listed = re.findall(r"^\| `(\w+)` \|", text, re.MULTILINE)
    # The flat columns in the CSV's order, then the raw samples (JSONL only) and the carrier of unknown columns.
    assert listed == [*record.COLUMNS, *record.RAW_COLUMNS, "extra"]


def test_a_field_comment_and_its_section_are_read_from_the_source():
    text = gen_docs.columns_markdown()
    assert "| `drift_pct` | float \\| None | The last third of the samples' median against the first third's, in %; None under 18 samples. |" in text
    assert "| `time_energy_s` | float \\| None | **The machine's state and energy (harness.telemetry.gpu_state, " in text
    assert "| `status` | Status: `ok`, `unsupported`, `oom`, `error`, `crashed`, `timeout`, `skipped` |" in text


def test_a_field_added_to_the_record_makes_the_check_fail_naming_the_columns_page(tmp_path, monkeypatch, capsys):
    (tmp_path / "record_with_an_added_column.py").write_text(textwrap.dedent('''
        from dataclasses import dataclass

        from harness.results.record import Record as Base


        @dataclass
        class Record(Base):
            #: A column added without regenerating the docs.
            added_column: int | None = None
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(gen_docs, "Record", importlib.import_module("record_with_an_added_column").Record)
    assert gen_docs.stale_pages(ROOT) == [gen_docs.COLUMNS_PAGE]
    assert "| `added_column` | int \\| None | A column added without regenerating the docs. |" in gen_docs.columns_markdown()
    assert gen_docs.main(["--check"]) == 1
    assert "docs/columns.md is stale" in capsys.readouterr().err


def test_a_flag_added_to_the_parser_makes_the_check_fail_naming_the_cli_page(monkeypatch, capsys):
    real_parser = gen_docs.build_parser

    def parser_with_an_added_flag():
        """The real parser, its `run` given one more flag."""
        parser = real_parser()
        run = next(sub for name, _, sub in gen_docs.subcommands(parser) if name == "run")
        run.add_argument("--added-flag", metavar="N", help="a flag added without regenerating the docs")
        return parser

    monkeypatch.setattr(gen_docs, "build_parser", parser_with_an_added_flag)
    assert gen_docs.stale_pages(ROOT) == [gen_docs.CLI_PAGE]
    assert "| `--added-flag N` |  | a flag added without regenerating the docs |" in gen_docs.cli_markdown()
    assert gen_docs.main(["--check"]) == 1
    assert "docs/cli.md is stale" in capsys.readouterr().err


def test_the_cli_page_has_a_section_for_every_subcommand_and_names_every_flag():
    text = (ROOT / gen_docs.CLI_PAGE).read_text()
    parser = gen_docs.build_parser()
    for name, _, sub in gen_docs.subcommands(parser):
        assert f"## `attnbench {name}`" in text, name
        for action in sub._actions:
            for flag in action.option_strings:
                assert flag in ("-h", "--help") or f"`{flag}" in text, (name, flag)


def test_every_column_and_every_flag_says_what_it_is():
    # A new field or flag without words would leave an empty cell in the generated pages.
    import dataclasses

    comments = gen_docs.comments_of(record.Record)
    assert [f.name for f in dataclasses.fields(record.Record) if not comments.get(f.name, ([], ""))[1].strip()] == []
    rows = [line for line in gen_docs.cli_markdown().splitlines() if line.startswith("| `")]
    assert rows and [row for row in rows if not row.rstrip("|").rsplit("|", 1)[1].strip()] == []
