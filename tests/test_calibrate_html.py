"""The HTML report: self-contained (no script, no network) and rendered by a real headless
Chromium with its charts and tables, without console errors."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from planted_fleet import LIVE, run_fleet
from synthetic import SMALL, records
from turnguard._calibrate.corpus import corpus_turn
from turnguard._calibrate.engine import Calibrator
from turnguard._calibrate.grid import GridSpec, build_grid, dedupe
from turnguard._calibrate.html import render
from turnguard._calibrate.inputs import read_turns
from turnguard._calibrate.results import late_results
from turnguard._config import GuardConfig

CHARTS = ("chart-halts", "chart-saved", "chart-asks", "chart-positions", "chart-distribution")


@pytest.fixture(scope="module")
def page() -> tuple[str, int]:
    policies = build_grid(GridSpec(soft_caps=(5, 20, 100), stuck_repeats=(3, 6), explicit_caps=(15, 100)))
    stats = Calibrator(policies).add_all(corpus_turn(r, "gen", i, print)
                                         for i, r in enumerate(records(150, seed=8, mix=SMALL)))
    return render(stats), len(policies)


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def parse(text: str) -> list[tuple[str, dict[str, str | None]]]:
    collector = _Collect()
    collector.feed(text)
    return collector.tags


def test_page_is_self_contained(page: tuple[str, int]) -> None:
    text, _ = page
    tags = parse(text)
    assert not [t for t, _ in tags if t in ("script", "link", "img", "iframe", "object")]
    urls = [v for _, attrs in tags for k, v in attrs.items() if k in ("src", "href") and v]
    assert urls == []
    assert "Content-Security-Policy" in text and "default-src 'none'" in text


def test_page_has_every_chart_and_a_row_per_policy(page: tuple[str, int]) -> None:
    text, n = page
    tags = parse(text)
    ids = {a.get("id") for t, a in tags if t == "svg"}
    assert set(CHARTS) <= ids
    assert sum(1 for t, a in tags if t == "tr") == n + 1
    thresholds = [a for t, a in tags if t == "line" and a.get("class") == "threshold"]
    # Soft caps 5, 20, 100; each with the backstops of 5 multipliers; explicit caps 15 and 100.
    assert len(thresholds) == 3 + 3 * 5 + 2


def _chromium() -> str | None:
    found = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    if found is None:
        if os.environ.get("CI"):  # as conftest.corpus_files: any CI value, not only "true"
            pytest.fail("chromium is required under CI (Debian package 'chromium')")
        pytest.skip("chromium not installed")
    return found


@pytest.mark.chromium
def test_headless_chromium_renders_charts_and_tables_without_errors(page: tuple[str, int], tmp_path: Path) -> None:
    chromium = _chromium()
    text, n = page
    html_path = tmp_path / "report.html"
    html_path.write_text(text, encoding="utf-8")
    profile = tmp_path / "profile"
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([*flags, "--dump-dom", html_path.as_uri()], capture_output=True, text=True, timeout=90)
    assert dom.returncode == 0, dom.stderr[-2000:]
    tags = parse(dom.stdout)
    svgs = {a.get("id"): a for t, a in tags if t == "svg"}
    assert set(CHARTS) <= set(svgs)
    assert sum(1 for t, a in tags if t == "rect" and a.get("class") == "bar") > n
    assert sum(1 for t, a in tags if t == "tr") == n + 1
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line or "Refused to" in line
               or "Uncaught" in line]
    assert console == []
    shot = tmp_path / "shot.png"
    done = subprocess.run([*flags, "--window-size=1200,2400", f"--screenshot={shot}", html_path.as_uri()],
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0 and shot.stat().st_size > 20_000, done.stderr[-2000:]
    assert not re.search(r"(Uncaught|Refused to)", done.stderr)


LAYOUT_PROBE = """<script>
addEventListener("load", () => {
  const problems = [];
  for (const svg of document.querySelectorAll("svg.chart")) {
    const [, , w, h] = svg.getAttribute("viewBox").split(" ").map(Number);
    const boxes = [...svg.querySelectorAll("text")].map(t => [t, t.getBBox()]).filter(([, b]) => b.width > 0);
    for (const [t, b] of boxes) {
      if (b.x < -0.5 || b.y < -0.5 || b.x + b.width > w + 0.5 || b.y + b.height > h + 0.5)
        problems.push(`${svg.id}: '${t.textContent}' leaves the chart`);
    }
    for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
      const [a, p] = boxes[i], [c, q] = boxes[j];
      const dx = Math.min(p.x + p.width, q.x + q.width) - Math.max(p.x, q.x);
      const dy = Math.min(p.y + p.height, q.y + q.height) - Math.max(p.y, q.y);
      if (dx > 0.5 && dy > 1.5) problems.push(`${svg.id}: '${a.textContent}' overlaps '${c.textContent}'`);
    }
  }
  const out = document.createElement("pre");
  out.id = "layout-problems";
  out.textContent = JSON.stringify(problems);
  document.body.append(out);
});
</script>"""


@pytest.fixture(scope="module")
def crowded_page() -> str:
    """Many caps close together on the log axis, several at one value, long policy names."""
    policies = build_grid(GridSpec(soft_caps=(20, 50, 100), multipliers=(2, 3, 5, 10, 20), explicit_caps=(30, 50, 100),
                                   cycle_caps=(0, 50)))
    policies = dedupe(policies + build_grid(GridSpec(cross=True, soft_caps=(20,), multipliers=(2,), stuck_repeats=(3,),
                                                     streaks=((3, 5),), explicit_caps=(), cycle_caps=(50,))))
    stats = Calibrator(policies).add_all(corpus_turn(r, "gen", i, print)
                                         for i, r in enumerate(records(300, seed=3, mix=SMALL)))
    return render(stats)


@pytest.mark.chromium
def test_in_chromium_no_chart_label_overlaps_another_or_leaves_its_chart(crowded_page: str, tmp_path: Path) -> None:
    """Measured by the browser's own layout (``getBBox`` of every text in every chart), on a copy
    of the page with a measuring script (the report itself runs none); the screenshot of the page
    is kept next to it for a person to look at (``REPORT_SCREENSHOT=path.png`` keeps it there)."""
    chromium = _chromium()
    probe = tmp_path / "probe.html"
    page = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", crowded_page)
    probe.write_text(page.replace("</body>", LAYOUT_PROBE + "</body>"), encoding="utf-8")
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000"]
    dom = subprocess.run([*flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=90)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="layout-problems">(.*?)</pre>', dom.stdout, re.S)
    assert found, "the measuring script did not run"
    assert json.loads(html.unescape(found.group(1))) == []
    shown = tmp_path / "report.html"
    shown.write_text(crowded_page, encoding="utf-8")
    shot = Path(os.environ.get("REPORT_SCREENSHOT", tmp_path / "report.png"))
    done = subprocess.run([*flags, "--window-size=1300,3000", f"--screenshot={shot}", shown.as_uri()],
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0 and shot.stat().st_size > 20_000, done.stderr[-2000:]


@pytest.fixture(scope="module")
def survival_page(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fleet with live halts at its backstop and a probe past it: the survival chart is drawn."""

    fleet = run_fleet(tmp_path_factory.mktemp("survival") / "turns.jsonl")
    policies = build_grid(GridSpec(soft_caps=(20,), multipliers=(10, 20), stuck_repeats=(6,), streaks=((5, 8),),
                                   explicit_caps=(), key_modes=("canonical",), base=GuardConfig(**LIVE)))
    stats = Calibrator(policies, results=late_results([fleet.path], print)).add_all(read_turns([fleet.path], print))
    return render(stats)


def test_the_survival_chart_has_its_curve_band_and_both_caps(survival_page: str) -> None:
    tags = parse(survival_page)
    assert any(t == "svg" and a.get("id") == "chart-survival" for t, a in tags)
    assert sum(1 for t, a in tags if t == "polygon" and a.get("class") == "band") == 1
    assert sum(1 for t, a in tags if t == "polyline" and a.get("class") == "curve") == 1
    caps = [a for t, a in tags if t == "line" and a.get("class") == "cap"]
    assert len(caps) == 2
    assert "live cap 200" in survival_page and "probe cap 400" in survival_page
    assert "not estimable: past the highest cap turns ran under (400 calls)" in survival_page


@pytest.mark.chromium
def test_in_chromium_the_survival_chart_renders_and_no_label_overlaps(survival_page: str, tmp_path: Path) -> None:
    chromium = _chromium()
    probe = tmp_path / "probe.html"
    page = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", survival_page)
    probe.write_text(page.replace("</body>", LAYOUT_PROBE + "</body>"), encoding="utf-8")
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000"]
    dom = subprocess.run([*flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=90)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="layout-problems">(.*?)</pre>', dom.stdout, re.S)
    assert found, "the measuring script did not run"
    assert json.loads(html.unescape(found.group(1))) == []
    rendered = parse(dom.stdout)
    assert any(t == "svg" and a.get("id") == "chart-survival" for t, a in rendered)
    assert sum(1 for t, a in rendered if t == "line" and a.get("class") == "cap") == 2
    shown = tmp_path / "report.html"
    shown.write_text(survival_page, encoding="utf-8")
    shot = tmp_path / "survival.png"
    done = subprocess.run([*flags, "--window-size=1300,4000", f"--screenshot={shot}", shown.as_uri()],
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0 and shot.stat().st_size > 20_000, done.stderr[-2000:]


LIMITS: dict[str, dict[str, object] | None] = {
    "unrecorded": None,
    "disabled": {"cap_mode": "disabled", "soft_cap": None, "hard_cap": None},
    "explicit": {"cap_mode": "explicit", "soft_cap": None, "hard_cap": 40},
    "adaptive": {"cap_mode": "adaptive", "soft_cap": 10, "hard_cap": 30},
}
"""The limits a cohort's turns can record: none (older lines), the cap disabled, or a finite cap."""


def _capped_line(i: int, cohort: str, limits: dict[str, object] | None, ended_by: str, calls: int) -> str:
    line: dict[str, object] = {"id": f"{cohort}{i}", "cohort": cohort, "ended_by": ended_by, "resolved": i % 2 == 0,
                               "calls": [{"tool": "t", "args": str(j % 3), "outcome": "ok"} for j in range(calls)]}
    if limits is not None:
        line["policy"] = cohort
        line["limits"] = {**limits, "stuck_repeat_threshold": 6, "streak_warn_at": 5, "streak_stop_at": 8,
                          "max_cycles": 0, "stateful_tools": [], "streak_exempt_tools": []}
    return json.dumps(line) + "\n"


@pytest.mark.parametrize("live", sorted(LIMITS))
@pytest.mark.parametrize("probe", [None, *sorted(LIMITS)])
def test_html_and_merge_html_draw_censored_turns_whatever_caps_were_recorded(
        live: str, probe: str | None, tmp_path: Path) -> None:
    """A censored turn draws the survival chart; its x range must not need a finite cap, since
    older lines record none and a guard may run with the cap disabled."""
    from turnguard._cli import main

    ends = ["completed", "streak", "cancelled", "soft_stuck", "error", "completed"]
    text = "".join(_capped_line(i, "live", LIMITS[live], ends[i % len(ends)], 3 + 5 * i) for i in range(12))
    if probe is not None:
        text += "".join(_capped_line(i, "probe", LIMITS[probe], ends[(i + 1) % len(ends)], 4 + 7 * i) for i in range(6))
    (tmp_path / "turns.jsonl").write_text(text)
    common = ["calibrate", str(tmp_path / "turns.jsonl"), "--progress", "never", "--no-peers", "--soft-caps", "5",
              "--multipliers", "2"]
    assert main([*common, "--html", str(tmp_path / "one.html"), "--json", str(tmp_path / "one.json")]) == 0
    assert main(["calibrate", "merge", str(tmp_path / "one.json"), "--html", str(tmp_path / "merged.html")]) == 0
    caps = [c for c in (LIMITS[live], LIMITS.get(probe or "")) if c and c["hard_cap"]]
    for page in (tmp_path / "one.html", tmp_path / "merged.html"):
        tags = parse(page.read_text())
        assert any(t == "svg" and a.get("id") == "chart-survival" for t, a in tags)
        assert sum(1 for t, a in tags if t == "line" and a.get("class") == "cap") == len(caps)


@pytest.mark.parametrize("seed", range(5))
def test_halts_are_listed_in_the_thresholds_declared_order_in_text_and_html(seed: int) -> None:
    """Every built-in threshold, a new one included, has its place before the failing plugin's and any
    third party's (sorted after them), in the text report and the HTML chart alike."""
    import random

    from turnguard._calibrate.html import halts_chart
    from turnguard._calibrate.report import thresholds_text
    from turnguard._model import PLUGIN_ERROR_THRESHOLD, Threshold

    declared = [t.value for t in Threshold] + [PLUGIN_ERROR_THRESHOLD]
    names = [*declared, "zz_third_party", "aa_third_party"]
    random.Random(seed).shuffle(names)
    by = {name: i + 1 for i, name in enumerate(names)}
    listed = [item.split(":")[0] for item in thresholds_text(by).split()]
    assert listed == [*declared, "aa_third_party", "zz_third_party"]
    chart = halts_chart([{"name": "p", "by_threshold": {k: by[k] for k in declared}, "censored": 0, "halted": 1,
                          "halted_resolved": 0, "default": False}])
    drawn = re.findall(r"<title>p: ([a-z_]+) [0-9]", chart)
    assert list(dict.fromkeys(drawn)) == declared
