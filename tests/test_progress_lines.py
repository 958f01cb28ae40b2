"""`run`'s progress where its output is not a terminal (a CI log): a line every few seconds with done/total and the last pair."""

from __future__ import annotations

import io
import json
from pathlib import Path

from harness.cli.main import main
from harness.run import executors
from harness.run.progress import LINE_INTERVAL_S, Progress, RecordsTail
from harness.run.supervisor import RunSummary


class FakeClock:
    """Seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_progress_prints_a_line_every_interval_with_done_total_and_the_last_pair():
    clock, log = FakeClock(), io.StringIO()
    progress = Progress(40, 0, log, clock=clock)
    progress.update(0, last_pair=lambda: None)
    for done, key in ((3, "B1-S8-naive"), (5, "B1-S8-sdpa")):
        clock.now += 1.0
        progress.update(done, last_pair=lambda key=key: key)  # within the interval: nothing
    clock.now += LINE_INTERVAL_S
    progress.update(10, last_pair=lambda: "B1-S16-sdpa")
    progress.update(40, final=True, last_pair=lambda: "B1-S32-naive")
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 3, lines
    assert lines[0].startswith("progress: 0/40 pairs, 0:00 elapsed")
    assert lines[1].startswith("progress: 10/40 pairs, 0:07 elapsed, ETA 0:21") and lines[1].endswith("last: B1-S16-sdpa")
    assert lines[2] == "progress: 40/40 pairs, 0:07 elapsed, last: B1-S32-naive"


def test_the_records_tail_names_the_last_whole_line_s_pair(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    tail = RecordsTail(path)
    assert tail.count() == 0 and tail.last_key() is None
    path.write_text(json.dumps({"case_id": "B1-S8", "backend": "naive"}) + "\n" + json.dumps({"case_id": "B1-S8", "backend": "sdpa"}) + "\n"
                    + '{"case_id": "B1-S16", "back')  # a line still being written is not the last one
    assert tail.count() == 2 and tail.last_key() == "B1-S8-sdpa"


def test_run_asks_for_progress_when_stderr_is_not_a_terminal_and_not_with_quiet(tmp_path, monkeypatch, capsys):
    seen = []

    class Recorder:
        def __init__(self, config):
            seen.append(config)

        def run(self):
            return RunSummary(tmp_path, {"ok": 1}, 1, 0.0)

    monkeypatch.setattr(executors, "supervisor_for", lambda config, log=None: Recorder(config))
    assert main(["run", "--suite", "quick", "--out", str(tmp_path)]) == 0  # capsys: stderr is not a terminal
    assert main(["run", "--suite", "quick", "--out", str(tmp_path), "--quiet"]) == 0
    assert [config.progress for config in seen] == [True, False]
