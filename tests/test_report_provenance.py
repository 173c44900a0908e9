"""The report's "What was run": a short table of the provenance record's key facts, then the whole
record as JSON inside a collapsed <details> element (HTML) / block (Markdown)."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pandas as pd
import pytest

from fbt_probe.reproduce import report
from fbt_probe.reproduce.config import ReproConfig
from fbt_probe.reproduce.part import Part, Section
from fbt_probe.reproduce.parts.contraction import trained_passes

RECORD = {
    "git_commit": "0123abcd" * 5 + "-dirty",
    "package": {"version": "9.8.7", "kind": "editable", "url": "file:///src"},
    "working_directory_commit": "feedface" * 5,
    "machine": "x86_64",
    "versions": {"python": "3.11.7", "fbt-probe": "9.8.7", "torch": "2.99.1+cpu", "transformer-lens": "4.56.7"},
    "config": {"preset": "tiny", "seed": 11, "demo": True, "model": None, "groups": {"completion": 40}},
    "seed": 11,
    "models": {"feedback": "ref:tiny-feedback (preset tiny)", "baseline": "ref:tiny-baseline (preset tiny)"},
    "checkpoints": {"feedback": "aa" * 32, "baseline": "bb" * 32},
    "stage_seconds": {"data": 1.5},
}


class _Cells(HTMLParser):
    """Table rows as lists of cell texts, and the text inside each <details> element."""

    def __init__(self):
        super().__init__()
        self.rows, self.details, self._row, self._cell, self._depth = [], [], None, None, 0

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = ""
        elif tag == "details":
            self._depth += 1
            self.details.append("")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._row is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr":
            self.rows.append(self._row)
            self._row = None
        elif tag == "details":
            self._depth -= 1

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        if self._depth:
            self.details[-1] += data


@pytest.fixture
def written(tmp_path, monkeypatch):
    """stage_report on a study whose tables are stubbed out: only the provenance section is real."""
    return _write(tmp_path, monkeypatch)


def _write(tmp_path, monkeypatch, stems=()):
    """The stubbed study's report, with an empty PNG in figures/ for each of `stems`."""
    empty = pd.DataFrame()
    stub = Part(  # one part, whose section shows every figure; every part's captions kept
        "stub",
        sections=lambda cfg, out, figs: [Section("Figures", "_(not run)_\n", list(figs))],
        captions=report.captions(),
    )
    monkeypatch.setattr(report, "PARTS", [stub])
    monkeypatch.setattr(report, "headline", lambda cfg, out: empty)
    monkeypatch.setattr(report, "spread_table", lambda cfg, out: None)
    monkeypatch.setattr(report, "findings", lambda cfg, out, seeds, own=None: [])
    monkeypatch.setattr(report, "_provenance", lambda cfg, out, times: RECORD)
    (tmp_path / "figures").mkdir()
    for stem in stems:
        (tmp_path / "figures" / f"{stem}.png").write_bytes(b"")
    report.stage_report(ReproConfig.demo_config(preset="tiny", shipped=True), tmp_path, {"data": 1.5})
    return (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()


EXPECTED = [
    ("model (feedback)", "ref:tiny-feedback (preset tiny)"),
    ("checkpoint sha256 (feedback)", "aa" * 32),
    ("model (baseline)", "ref:tiny-baseline (preset tiny)"),
    ("checkpoint sha256 (baseline)", "bb" * 32),
    ("fbt-probe commit", RECORD["git_commit"]),
    ("fbt-probe version", "9.8.7 (editable)"),
    ("working-directory commit", "feedface" * 5),
    ("torch", "2.99.1+cpu"),
    ("transformer-lens", "4.56.7"),
    ("seed", "11"),
]


def test_the_html_report_shows_the_record_as_a_table_and_the_json_collapsed(written):
    _, page = written
    section = page.split("<h2>What was run</h2>")[1]
    parsed = _Cells()
    parsed.feed(section)
    rows = {r[0]: r[1] for r in parsed.rows if r and len(r) == 2}
    for what, value in EXPECTED:
        assert rows.get(what) == value, (what, rows)
    assert rows["config"].startswith("preset=tiny, seed=11, demo=True") and "groups" not in rows["config"]
    assert len(parsed.details) == 1
    inside = parsed.details[0]
    assert json.loads(inside[inside.index("{") : inside.rindex("}") + 1]) == RECORD  # the whole record, in the details
    assert "<table>" in section.split("<details>")[0]  # the table comes first, outside the collapsed block
    assert "&lt;details&gt;" not in page  # rendered, not shown as text


def test_the_markdown_report_has_the_same_table_and_a_details_block(written):
    md, _ = written
    section = md.split("## What was run")[1]
    for what, value in EXPECTED:
        assert f"| {what} | {value} |" in section
    block = section[section.index("<details>") : section.index("</details>")]
    assert "```json" in block and json.loads(block[block.index("{") : block.rindex("}") + 1]) == RECORD
    assert section.index("| fbt-probe commit |") < section.index("<details>")


def test_a_cell_value_cannot_break_the_table_or_inject_markup():
    from fbt_probe.reproduce.report import _md_to_html, provenance_markdown

    rec = {**RECORD, "models": {"feedback": "checkpoint a|b<script>"}}
    html = _md_to_html(provenance_markdown(rec), trusted=True)
    assert "<script>" not in html and "<td>checkpoint a|b&lt;script&gt;</td>" in html


def test_the_study_records_which_model_each_checkpoint_is(tmp_path):
    from fbt_probe.loading import checkpoint_hash
    from fbt_probe.reproduce.config import model_path

    cfg = ReproConfig.demo_config(preset="tiny", shipped=True)
    rec = report._provenance(cfg, tmp_path, {"data": 2.0})
    assert rec["models"] == {
        "feedback": "ref:tiny-feedback (preset tiny)",
        "baseline": "ref:tiny-baseline (preset tiny)",
    }
    rows = dict(report.provenance_rows(rec))
    assert rows["checkpoint sha256 (baseline)"] == checkpoint_hash(model_path(cfg, tmp_path, "baseline"))
    assert rows["fbt-probe commit"] == rec["git_commit"] and rows["seed"] == str(cfg.seed)
    trained = report._model_reference(ReproConfig(preset="tiny"), "baseline")
    assert trained == "trained here: models/baseline (preset tiny)"


STUDY_FIGURES = [
    "fig3-contraction",
    "fig7a-feedback",
    "fig7b-baseline",
    "ablation-bars-feedback",
    "patching-baseline",
    "decodable-vs-used-baseline",
    "atp-heatmap-feedback",
    "atp-parity-baseline",
    "das-iia-feedback",
    "lens-baseline",
]


def test_every_figure_is_captioned_by_what_it_shows_not_by_its_file_name(tmp_path, monkeypatch):
    md, page = _write(tmp_path, monkeypatch, STUDY_FIGURES)
    captions = {}
    for stem in STUDY_FIGURES:
        line = next(ln for ln in md.splitlines() if ln.startswith(f"*{stem}* ("))
        captions[stem] = line.split("): ", 1)[1]
        assert f"<i>{stem}</i>" in page and report.figure_caption(stem).split(".")[0] in page
    for stem, caption in captions.items():
        assert caption != stem and stem not in caption and len(caption.split()) >= 20, stem
    assert captions["fig7a-feedback"].startswith("Feedback model.")
    assert captions["patching-baseline"].startswith("No-feedback baseline.")
    assert len(set(captions.values())) == len(captions)
    for stem in ("sae-swap-feedback", "sae-vs-das-feedback", "sae-features-feedback"):
        assert report.figure_caption(stem).startswith("Feedback model.")
    with pytest.raises(ValueError, match="no caption"):
        report.figure_caption("mystery-feedback")


def test_the_contraction_figure_marks_a_trained_depth_for_the_feedback_model_only():
    t = pd.DataFrame(
        {
            "run": ["feedback", "feedback", "baseline", "baseline"],
            "schedule": ["1:0.75,2:0.22,3:0.03"] * 2 + ["constant:1"] * 2,
            "pass": [1, 2, 1, 2],
        }
    )
    assert trained_passes(t) == {"feedback": 3, "baseline": 1}
