"""The trial page's log viewer (static/log.js) in Chromium against a real server and real
trials: only the lines on screen are in the page, every line of a log is reached once by
scrolling (the first of a million-line log too), a followed log loses and doubles nothing,
and find searches the whole log on the server, steps through the matches and scrolls each
into view, marked."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from muster.config import load_config
from muster.store import Trial
from tests.server.experiments import only_trial
from tests.server.rank_logs import RankFiles, add_trial_with_ranks
from tests.ui.conftest import Team

pytestmark = pytest.mark.lifecycle  # a real server, real trials, a real browser

# Prints `count` numbered lines, padded so that they fill many 64 KiB pieces of the log.
NUMBERED = ("import sys, time\ncount, pause = int(sys.argv[1]), float(sys.argv[2])\n"
            "for i in range(count):\n"
            "    sys.stdout.write(f'line {i:07d} ' + 'x' * 40 + '\\n')\n"
            "    if pause and i % 500 == 499:\n"
            "        sys.stdout.flush(); time.sleep(pause)\n")

# Walks the log from its first line to its last, a screen less a line at a time as the
# wheel does (a wheel event, then the scroll it makes), and answers every row it saw:
# [offset, text].
WALK_JS = """async () => {
  const log = document.getElementById("log");
  const settled = (before) => new Promise((done) => {
    const look = () => (log.dataset.anchor !== before && !log.hasAttribute("data-busy"))
      ? done() : requestAnimationFrame(look);
    requestAnimationFrame(look);
  });
  const seen = [];
  const rows = () => [...log.querySelectorAll(".log-row[data-offset]")]
    .map((row) => [Number(row.dataset.offset), row.textContent]);
  let before = log.dataset.anchor;
  log.scrollTop = 0;
  await settled(before === "0" ? "none" : before);
  for (let i = 0; i < 100000; i += 1) {
    seen.push(...rows());
    if (log.scrollTop >= log.scrollHeight - log.clientHeight - 1) { break; }
    const step = Math.floor(log.clientHeight / 18) - 1;
    before = log.dataset.anchor;
    log.dispatchEvent(new WheelEvent("wheel", {deltaY: step * 18}));
    log.scrollTop += step * 18;
    await settled(before);
  }
  return seen;
}"""


TWO_RANKS = "name: two-ranks\nentrypoint: python train.py\nresources: {replicas: 2}\n"


def numbered(i: int) -> str:
    return f"line {i:07d} " + "x" * 40


def run_numbered(team: Team, tmp_path: Path, count: int, pause: float = 0) -> int:
    """A trial that printed `count` numbered lines and ended; its id."""
    context = tmp_path / f"numbered-{count}"
    context.mkdir()
    (context / "numbered.py").write_text(NUMBERED)
    ended = team.run_to_the_end(
        f"name: numbered\nentrypoint: python numbered.py {count} {pause}\n", context)
    return int(only_trial(ended)["id"])


def first_row(page: Any) -> str:
    text: str = page.locator("#log .log-row[data-offset]").first.text_content()
    return text


def test_the_page_comes_with_its_log_s_last_lines(page_of: Any, team: Team,
                                                 tmp_path: Path) -> None:
    """The trial page's HTML holds the last 1,000 lines (shown before any script runs);
    log.js takes them over without asking for the tail, and reads the rest as scrolled."""
    count = 3000
    trial_id = run_numbered(team, tmp_path, count)
    html = httpx.get(f"{team.server.url}/trials/{trial_id}", timeout=30,
                     headers={"Authorization": f"Bearer {team.tokens['vera']}"}).text
    early = re.search(r'<div class="log-early"[^>]*><div>(.*?)</div></div>', html, re.S)
    assert early is not None
    assert early[1].splitlines() == [numbered(i) for i in range(count - 1000, count)]
    page = page_of("vera")
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    page.goto(f"{team.server.url}/trials/{trial_id}")
    log = page.locator("#log")
    expect(log.locator(".log-row[data-offset]").last).to_have_text(numbered(count - 1))
    assert not [url for url in asked if "/logs?" in url and "tail=" in url]
    page.evaluate("document.getElementById('log').scrollTop = 0")
    expect(log.locator(".log-row[data-offset]").first).to_have_text(numbered(0))


def test_a_log_a_page_cannot_hold_as_text_is_read_by_the_script(
        page_of: Any, team: Team, tmp_path: Path) -> None:
    """CRLF line ends (an HTML parser makes them LF) and bytes that are not UTF-8: the page
    comes without them, and log.js reads the tail from the API, bytes as they are."""
    context = tmp_path / "crlf"
    context.mkdir()
    (context / "crlf.py").write_text(
        "import sys\nfor i in range(50):\n"
        "    sys.stdout.buffer.write(b'crlf line %d\\r\\n' % i)\n"
        "sys.stdout.buffer.write(b'latin \\xe9 end\\n')\n")
    ended = team.run_to_the_end("name: crlf\nentrypoint: python crlf.py\n", context)
    trial_id = int(only_trial(ended)["id"])
    html = httpx.get(f"{team.server.url}/trials/{trial_id}", timeout=30,
                     headers={"Authorization": f"Bearer {team.tokens['vera']}"}).text
    assert 'class="log-early"' not in html
    page = page_of("vera")
    page.goto(f"{team.server.url}/trials/{trial_id}")
    rows = page.locator("#log .log-row[data-offset]")
    expect(rows.last).to_have_text("latin \ufffd end")
    expect(rows.nth(-2)).to_contain_text("crlf line 49")


def test_every_line_is_reached_once_by_scrolling(page_of: Any, team: Team,
                                                 tmp_path: Path) -> None:
    count = 6000  # 330 kB: the tail of 1,000 lines first, the rest read as it is scrolled to
    trial_id = run_numbered(team, tmp_path, count)
    page = page_of("vera")
    page.goto(f"{team.server.url}/trials/{trial_id}")
    log = page.locator("#log")
    expect(log.locator(".log-row[data-offset]").last).to_have_text(numbered(count - 1))
    assert log.locator(".log-row").count() < 40  # the rows on screen, not the log
    seen = dict(page.evaluate(WALK_JS))
    assert [seen[offset] for offset in sorted(seen)] == [numbered(i) for i in range(count)]


def test_the_first_line_of_a_million_line_log_is_reached(page_of: Any, team: Team,
                                                         tmp_path: Path) -> None:
    """53 MB, past what a browser lets an element be tall at a pixel a line: the scrollbar
    stands for the bytes, its top is the first line, its middle the middle, and the wheel
    goes on line by line from there."""
    count = 1_000_000
    trial_id = run_numbered(team, tmp_path, count)
    page = page_of("vera")
    page.goto(f"{team.server.url}/trials/{trial_id}")
    log = page.locator("#log")
    expect(log.locator(".log-row[data-offset]").last).to_have_text(numbered(count - 1))
    page.evaluate("document.getElementById('log').scrollTop = 0")
    expect(log.locator(".log-row[data-offset]").first).to_have_text(numbered(0))
    page.evaluate("(l => { l.scrollTop = (l.scrollHeight - l.clientHeight) / 2; })"
                  "(document.getElementById('log'))")
    expect(log).not_to_contain_text(numbered(0))
    middle = int(first_row(page).split()[1])
    assert abs(middle - count // 2) < count // 20, middle  # lines are alike: bytes ~ lines
    log.hover()
    page.mouse.wheel(0, 18 * 10)
    expect(log.locator(".log-row[data-offset]").first).not_to_have_text(numbered(middle))
    moved = int(first_row(page).split()[1])
    assert 0 < moved - middle <= 10, (middle, moved)  # line by line, none skipped
    page.evaluate("(l => { l.scrollTop = l.scrollHeight; })(document.getElementById('log'))")
    expect(log).to_contain_text(numbered(count - 1))


def test_find_searches_the_whole_log_and_steps_through_the_matches(
        page_of: Any, team: Team, tmp_path: Path) -> None:
    count = 200_000  # 10 MB: line 1,500 is far from the tail the page opens on
    trial_id = run_numbered(team, tmp_path, count)
    page = page_of("vera")
    page.goto(f"{team.server.url}/trials/{trial_id}")
    log = page.locator("#log")
    expect(log.locator(".log-row[data-offset]").last).to_have_text(numbered(count - 1))
    page.get_by_label("Find").fill("line 0001500")  # none below the view: searched back
    expect(page.locator("#log-found")).to_have_text("match 1 of 1")
    expect(log.locator("mark")).to_have_text("line 0001500")
    expect(log.locator("mark")).to_be_in_viewport()
    page.get_by_label("regex").check()
    page.get_by_label("Find").fill("line 0(0015|1999)00")
    # From the view's top down: the matches above it are not known yet ("+").
    expect(page.locator("#log-found")).to_have_text("match 1 of 2+")
    expect(log.locator("mark")).to_have_count(1)
    page.get_by_label("Find").press("Enter")
    page.get_by_label("Find").press("Enter")
    expect(page.locator("#log-found")).to_have_text("match 1 of 2")  # past the last: the
    # first, searched from the log's start, so every match is known
    expect(log.locator("mark")).to_have_text("line 0001500")
    page.get_by_label("Find").press("Shift+Enter")
    expect(page.locator("#log-found")).to_have_text("match 2 of 2")
    expect(log.locator("mark")).to_have_text("line 0199900")
    page.get_by_role("button", name="previous").click()
    expect(log.locator("mark")).to_have_text("line 0001500")
    page.get_by_label("Find").fill("line (")
    expect(page.locator("#log-found")).to_contain_text("find: ")  # the server's 422, said


def test_a_followed_log_loses_and_doubles_no_line(page_of: Any, team: Team,
                                                  tmp_path: Path) -> None:
    """Lines come in bursts of 500 while the page follows; at the end the view is at the
    last line, and scrolling from the first shows each line once."""
    count = 8000
    context = tmp_path / "bursts"
    context.mkdir()
    (context / "numbered.py").write_text(NUMBERED)
    gate = tmp_path / "go"
    (context / "wait.py").write_text(
        "import os, runpy, sys, time\n"
        f"while not os.path.exists({str(gate)!r}):\n    time.sleep(0.05)\n"
        "print('ready', flush=True)\n"
        f"sys.argv = ['numbered.py', '{count}', '0.05']\nrunpy.run_path('numbered.py')\n")
    with team.client("alice") as alice:
        exp = alice.create_experiment("name: bursts\nentrypoint: python wait.py\n", context)
    page = page_of("vera")
    page.goto(f"{team.server.url}/trials/{only_trial(exp)['id']}")
    expect(page.locator("#log-status")).to_contain_text("following attempt 1")
    gate.touch()
    log = page.locator("#log")
    expect(log).to_contain_text(numbered(count - 1), timeout=60_000)
    expect(page.locator("#log-status")).to_have_text(re.compile("^(SUCCEEDED|SUSPECT)$"),
                                                     timeout=30_000)
    expect(log.locator(".log-row[data-offset]").last).to_have_text(numbered(count - 1))
    seen = dict(page.evaluate(WALK_JS))
    texts = [seen[offset] for offset in sorted(seen)]
    assert texts == ["ready"] + [numbered(i) for i in range(count)]


def test_a_restart_is_followed_under_a_marker_line(page_of: Any, team: Team,
                                                   tmp_path: Path) -> None:
    """Attempt 1 crashes (SIGSEGV: a transient failure, restarted) while the page follows
    it; the page goes on to attempt 2 under a line that says why attempt 1 ended."""
    context = tmp_path / "crash"
    context.mkdir()
    gate = tmp_path / "crash-now"
    (context / "crash.py").write_text(
        "import os, signal, time\nattempt = os.environ['MUSTER_ATTEMPT']\n"
        "print(f'attempt {attempt} starts', flush=True)\n"
        f"while attempt == '1' and not os.path.exists({str(gate)!r}):\n    time.sleep(0.05)\n"
        "if attempt == '1':\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
        "print(f'attempt {attempt} done', flush=True)\n")
    with team.client("alice") as alice:
        exp = alice.create_experiment("name: crash-once\nentrypoint: python crash.py\n",
                                      context)
    page = page_of("vera")
    page.goto(f"{team.server.url}/trials/{only_trial(exp)['id']}")
    log = page.locator("#log")
    expect(log).to_contain_text("attempt 1 starts")
    gate.touch()
    expect(log.locator(".log-row.marker")).to_contain_text(
        "── attempt 2 (after attempt 1 ended", timeout=60_000)
    expect(log).to_contain_text("attempt 2 done")
    expect(page.get_by_label("Attempt")).to_have_value("2")
    page.get_by_label("Attempt").select_option("1")  # the first attempt is one select away
    expect(log).to_contain_text("attempt 1 starts")
    expect(log).not_to_contain_text("attempt 2")


def test_two_ranks_merged_and_each_alone(page_of: Any, team: Team, tmp_path: Path) -> None:
    """Every rank merged (no byte offsets: its tail, searched where it is held), and one
    rank picked: its own bytes, scrolled to its first line."""
    run_dir = tmp_path / "attempt-1"
    with team.server.store() as store:
        trial_id = add_trial_with_ranks(store, [run_dir], 2)
        with store.session_scope() as s:  # a config the page can show
            s.get_one(Trial, trial_id).experiment.config = load_config(TWO_RANKS).to_json_dict()
    for rank in (0, 1):
        RankFiles(run_dir, rank).append(*((1000.0 + i + rank / 2,
                                           f"rank{rank} step {i:05d}\n".encode())
                                          for i in range(3000)))
    page = page_of("vera")
    page.goto(f"{team.server.url}/trials/{trial_id}")
    log = page.locator("#log")
    expect(log.locator(".log-row").last).to_have_text("[rank 1] rank1 step 02999")
    page.get_by_label("Find").fill("step 02900")  # none below the view: the nearest above
    expect(page.locator("#log-found")).to_have_text("match 2 of 2")
    expect(log.locator(".log-row", has=page.locator("mark"))).to_have_text(
        "[rank 1] rank1 step 02900")
    page.get_by_role("button", name="next").click()  # past the last: the first
    expect(page.locator("#log-found")).to_have_text("match 1 of 2")
    expect(log.locator(".log-row", has=page.locator("mark"))).to_have_text(
        "[rank 0] rank0 step 02900")
    page.get_by_label("Rank").select_option("1")
    expect(log.locator(".log-row").last).to_have_text("rank1 step 02999")
    expect(page.locator("#log-download")).to_have_text("download rank 1 (raw)")
    page.evaluate("document.getElementById('log').scrollTop = 0")
    expect(log.locator(".log-row").first).to_have_text("rank1 step 00000")
