"""The web console in a real browser: Debian's Chromium driven by Playwright.

Run by tests/tests/e2e/console.rs against an in-process stack (it starts the
services, two priced agents and the budgets, then this script). Everything
it needs comes from the environment:

  SY_BASE      the gateway's HTTP door, http://127.0.0.1:PORT
  SY_ALICE     alice's API key (submitter)
  SY_BOB       bob's API key (approver)
  SY_CAROL     carol's API key (approver and submitter)
  SY_VIEWER    vera's API key (viewer)
  SY_JOB       the job document alice submits (tests/console/release_notes.yaml)
  SY_CHROMIUM  the Chromium binary (Debian's; never `playwright install`)
  SY_SHOTS     directory for the screenshots (docs/console with `make screenshots`)

Every wait is bounded (Playwright's timeouts); on failure the script exits
non-zero with the step that failed. The last line of its output is a JSON
summary the Rust side checks against the services.
"""

import json
import os
import re
import sys
import time
import urllib.error
import urllib.request

from playwright.sync_api import expect, sync_playwright

BASE = os.environ["SY_BASE"]
TOKENS = {n: os.environ["SY_" + n.upper()] for n in ("alice", "bob", "carol", "viewer", "admin")}
JOB = open(os.environ["SY_JOB"], encoding="utf-8").read()
SHOTS = os.environ["SY_SHOTS"]
TIMEOUT_MS = 30_000

# A job whose one step asks bob (not its submitter) for a number.
ASKS_BOB = """plan_description: a step that asks bob
tasks:
  - id: ask
    input:
      prompt: "How many replicas for web?"
      schema: {type: object, required: [size], properties: {size: {type: integer, minimum: 1, maximum: 20}}}
      answerers: {subjects: [bob]}
"""

summary = {}


def step(msg):
    print(f"[console] {msg}", flush=True)


def sign_in(browser, who, viewport=None):
    """A fresh browser context signed in as `who` through the sign-in form."""
    ctx = browser.new_context(viewport=viewport or {"width": 1280, "height": 900})
    ctx.set_default_timeout(TIMEOUT_MS)
    page = ctx.new_page()
    page.goto(BASE + "/ui/jobs")
    # No session: sent to sign-in, and back to the page asked for after.
    expect(page).to_have_url(re.compile(r"/ui/sign-in\?next=%2Fui%2Fjobs$"))
    page.get_by_label("API key or token").fill(TOKENS[who])
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(BASE + "/ui/jobs")
    expect(page.locator("#whoami")).to_contain_text(who if who != "viewer" else "vera")
    return ctx, page


def submit(page, document):
    """Submits `document` through the console's form: the new job's id."""
    page.goto(BASE + "/ui/submit")
    page.get_by_label("Job document").fill(document)
    page.get_by_role("button", name="Submit").click()
    expect(page).to_have_url(re.compile(r"/ui/jobs/[0-9a-f-]+$"))
    return page.url.rsplit("/", 1)[1]


def rest_status(token):
    """The HTTP status of a REST read (of a task no one has: 404 once the
    bearer authenticates) made with `token`."""
    req = urllib.request.Request(
        BASE + "/aitp/tasks/no-such-task", headers={"authorization": "Bearer " + token}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def csrf(page):
    return page.locator("input[name=csrf]").first.get_attribute("value")


def forced_post(page, path, fields):
    """Submits a form the page did not offer (as a person could with the
    developer tools): the server must refuse it and the page say why."""
    page.evaluate(
        """([path, fields]) => {
            const f = document.createElement('form');
            f.method = 'post';
            f.action = path;
            for (const [k, v] of Object.entries(fields)) {
                const i = document.createElement('input');
                i.type = 'hidden'; i.name = k; i.value = v;
                f.append(i);
            }
            document.body.append(f);
            f.submit();
        }""",
        [path, fields],
    )
    page.wait_for_url(BASE + path)


def main():
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=os.environ["SY_CHROMIUM"],
            args=["--no-sandbox", "--disable-dev-shm-usage"],
        )

        step("a page with no session redirects to sign-in; a wrong key is refused")
        anon = browser.new_context()
        page = anon.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(BASE + "/ui/budgets")
        expect(page).to_have_url(BASE + "/ui/sign-in?next=%2Fui%2Fbudgets")
        page.get_by_label("API key or token").fill("syk_000000000000_not-a-key")
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("#problem")).to_contain_text("not signed in")
        anon.close()

        step("alice signs in and submits a job that needs approval")
        alice_ctx, alice = sign_in(browser, "alice")
        # Keyboard: the first Tab reaches the skip link.
        alice.keyboard.press("Tab")
        assert alice.evaluate("document.activeElement.textContent") == "Skip to content"
        alice.get_by_role("link", name="Submit").click()
        expect(alice).to_have_url(BASE + "/ui/submit")
        job_id = submit(alice, JOB)
        summary["job_id"] = job_id
        expect(alice.locator("#job-state")).to_have_text("pending")
        for task in ("stats", "links", "summary"):
            expect(alice.locator(f'tr[data-task="{task}"] .state')).to_have_text("waiting")
            expect(alice.locator(f'g.node[data-task="{task}"] .state-text')).to_have_text("waiting")
        # The plan is drawn: summary in the column after stats and links.
        assert alice.locator("figure.dag path.edge").count() == 2
        # The timeline is live: the submission's events arrive over SSE.
        expect(alice.locator("#timeline li[data-kind='approval.requested']")).to_have_count(1)
        run_id = "run-" + job_id

        step("alice cannot approve her own run: the server refuses and the page says why")
        assert alice.locator("button.approve").count() == 0
        alice.goto(BASE + "/ui/jobs/" + job_id)
        forced_post(alice, f"/ui/runs/{run_id}/approve", {"csrf": csrf(alice), "comment": "mine"})
        expect(alice.locator("#problem")).to_contain_text("permission run.decide is needed")
        expect(alice.locator("h1")).to_have_text("Forbidden")

        step("bob sees it in his inbox with its estimate and budget")
        bob_ctx, bob = sign_in(browser, "bob")
        bob.get_by_role("link", name="Approvals").click()
        card = bob.locator(f'article[id="run-{run_id}"]')
        expect(card).to_be_visible()
        expect(card.locator(".submitter")).to_have_text("alice")
        expect(card).to_contain_text("word statistics of the 2.4 release note")
        estimate = card.locator(".estimate .money")
        estimate_text = estimate.inner_text()
        summary["estimate_text"] = estimate_text
        summary["estimate_title"] = estimate.get_attribute("title")
        expect(card.locator(".budget-chain")).to_contain_text("acme/docs")
        expect(card.locator(".budget-chain")).to_contain_text("job-" + job_id)
        expect(card.locator("table.plan")).to_contain_text("text_stats")
        bob.screenshot(path=os.path.join(SHOTS, "console-inbox.png"), full_page=True)

        step("alice keeps the job page open; bob approves; the steps turn green live")
        alice.goto(BASE + "/ui/jobs/" + job_id)
        expect(alice.locator("#live")).to_have_text("(live)")
        alice.evaluate("window.__not_reloaded = true")
        card.get_by_label("Comment").fill("fine for the release")
        card.get_by_role("button", name="Approve").click()
        expect(bob.locator(".notice")).to_contain_text(f"run {run_id} approved")
        for task in ("stats", "links", "summary"):
            expect(alice.locator(f'tr[data-task="{task}"] .state')).to_have_text("succeeded")
            expect(alice.locator(f'tr[data-task="{task}"] .state')).to_have_class(re.compile(r"\bok\b"))
            expect(alice.locator(f'g.node[data-task="{task}"]')).to_have_class(re.compile(r"\bok\b"))
        expect(alice.locator("#job-state")).to_have_text("completed")
        expect(alice.locator("#live")).to_have_text("(finished)")
        assert alice.evaluate("window.__not_reloaded === true"), "the job page reloaded"
        expect(alice.locator("#outputs")).to_contain_text("words, links extracted")
        summary["timeline_events"] = alice.locator("#timeline li").count()

        step("the finished job shows when each step ran, the waterfall, the decision and sentences")
        # The page's finished figures come from the server once the stream ends.
        expect(alice.locator("#job-decision")).to_contain_text("by bob")
        expect(alice.locator("#job-decision .comment")).to_have_text("fine for the release")
        for task in ("stats", "links", "summary"):
            expect(alice.locator(f'#waterfall tr[data-task="{task}"] rect.bar')).not_to_have_count(0)
            took = alice.locator(f'tr[data-task="{task}"] td.took').inner_text()
            assert took.endswith(" ms") or took.endswith(" s"), f"{task} took {took!r}"
        expect(alice.locator("#timeline li[data-kind='job.state']").last).to_contain_text("The job completed.")
        first_time = alice.locator("#timeline li time").first.inner_text()
        assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3}Z", first_time), first_time
        assert "=" not in alice.locator("#timeline li[data-kind='task.state']").first.inner_text()
        expect(alice.locator(".dag path.edge[marker-end]")).not_to_have_count(0)
        summary["waterfall_title"] = alice.locator('#waterfall tr[data-task="stats"] rect.bar title').first.text_content()
        # Under each step, the agent calls it made, from the job's events.
        expect(alice.locator("#waterfall tr.call", has_text="agent text_stats")).to_have_count(1)
        summary["call_title"] = alice.locator("#waterfall tr.call", has_text="agent text_stats").locator("title").text_content()
        alice.screenshot(path=os.path.join(SHOTS, "console-job.png"), full_page=True)

        step("reloaded, the finished job tells its story: who approved it, what it cost, its journal verifies")
        alice.reload()
        story = alice.get_by_role("region", name="Story")
        expect(story.locator("tbody tr", has_text="The run was approved by bob")).to_have_count(1)
        expect(story.locator("tbody tr", has_text="routed text.stats to text_stats")).to_have_count(1)
        expect(alice.locator("#journal")).to_contain_text("verifies")
        expect(story.locator("p", has_text="By agent:")).to_contain_text("text_stats $0.03 (0 tokens, 1 call)")
        summary["story_lines"] = story.locator("tbody tr").count()

        step("bob opens the job's budget: ledger entries and the spend chart")
        bob.goto(BASE + "/ui/jobs/" + job_id)
        bob.get_by_role("link", name="job-" + job_id).click()
        expect(bob.locator("#selected")).to_be_visible()
        entries = bob.locator("#selected tr.entry")
        expect(entries).to_have_count(2)
        summary["entries"] = entries.count()
        summary["entry_agents"] = sorted(
            entries.nth(i).locator("td").nth(3).inner_text() for i in range(entries.count())
        )
        # All of it spent within a second or two: one bar, not a flat line.
        expect(bob.locator("#spend-chart rect.bar")).to_have_count(1)
        # The tree: tenant budget → project → job, nested.
        expect(bob.locator("table.tree tr.depth-0", has_text="acme")).to_have_count(1)
        expect(bob.locator("table.tree tr.depth-2", has_text="job-" + job_id)).to_have_count(1)

        step("spend rolls up: acme shows its closed job's entries; the report by person names alice")
        bob.goto(BASE + "/ui/budgets?budget=acme&since=1h&by=person")
        expect(bob.locator("#selected tr.entry")).to_have_count(2)
        summary["acme_entries"] = bob.locator("#selected tr.entry").count()
        person = bob.locator("#spend-groups tr.group")
        expect(person).to_have_count(1)
        expect(person.first).to_have_attribute("data-key", "alice")
        summary["alice_spent_title"] = person.first.locator(".money").get_attribute("title")
        summary["acme_spent_title"] = bob.locator("table.tree tr.depth-0", has_text="acme").locator("td").nth(3).locator(".money").get_attribute("title")
        bob.screenshot(path=os.path.join(SHOTS, "console-budgets.png"), full_page=True)
        bob.goto(BASE + "/ui/budgets?by=sideways")
        expect(bob.locator("#problem")).to_contain_text("sum by one of project, person")

        step("bob ranks agents for a capability: per-factor scores")
        bob.get_by_role("link", name="Agents").click()
        bob.get_by_label("Route this capability").fill("text.stats")
        bob.get_by_role("button", name="Rank agents").click()
        expect(bob.locator("table.candidates tr.candidate").first).to_contain_text("text_stats")
        expect(bob.locator("#agent-text_stats")).to_contain_text("available")
        bob.screenshot(path=os.path.join(SHOTS, "console-agents.png"), full_page=True)

        step("bob keeps the job list open; alice submits; the row and the inbox count appear live")
        bob.goto(BASE + "/ui/jobs")
        expect(bob.locator("#inbox-count")).to_be_hidden()
        bob.evaluate("window.__not_reloaded = true")
        second = submit(alice, JOB.replace("plan_id: release-notes", "plan_id: release-notes-2"))
        expect(bob.locator(f'#jobs-list tr[id="job-{second}"]')).to_be_visible()
        expect(bob.locator("#inbox-count")).to_have_text("1")
        expect(bob).to_have_title(re.compile(r"^\(1\) Jobs"))
        assert bob.evaluate("window.__not_reloaded === true"), "the job list reloaded"
        bob.screenshot(path=os.path.join(SHOTS, "console-live-jobs.png"), full_page=True)

        step("a viewer sees the inbox without buttons, and the endpoint refuses them")
        summary["second_job_id"] = second
        viewer_ctx, viewer = sign_in(browser, "viewer")
        viewer.goto(BASE + "/ui/")
        vcard = viewer.locator(f'article[id="run-run-{second}"]')
        expect(vcard).to_be_visible()
        assert vcard.locator("button").count() == 0, "a viewer got a decision button"
        forced_post(viewer, f"/ui/runs/run-{second}/approve", {"csrf": csrf(viewer), "comment": "x"})
        expect(viewer.locator("#problem")).to_contain_text("permission run.decide is needed")

        step("carol (approver and submitter) may not approve the run she proposed")
        carol_ctx, carol = sign_in(browser, "carol")
        third = submit(carol, JOB.replace("plan_id: release-notes", "plan_id: release-notes-3"))
        summary["third_job_id"] = third
        carol.goto(BASE + "/ui/")
        ccard = carol.locator(f'article[id="run-run-{third}"]')
        expect(ccard).to_contain_text("You proposed this run")
        assert ccard.locator("button.approve").count() == 0
        forced_post(carol, f"/ui/runs/run-{third}/approve", {"csrf": csrf(carol), "comment": "mine"})
        expect(carol.locator("#problem")).to_be_visible()
        summary["separation_of_duties"] = carol.locator("#problem").inner_text()

        step("alice's job asks bob; bob answers in his inbox and the job goes on")
        asked = submit(alice, ASKS_BOB)
        summary["asks_bob_job_id"] = asked
        expect(alice.locator('tr[data-task="ask"] .state')).to_have_text("input_required")
        # alice may not answer it: her inbox lists nothing to answer.
        alice.goto(BASE + "/ui/")
        expect(alice.locator(f'article[id="input-{asked}-ask"]')).to_have_count(0)
        bob.goto(BASE + "/ui/")
        card = bob.locator(f'article[id="input-{asked}-ask"]')
        expect(card).to_contain_text("How many replicas for web?")
        expect(card).to_contain_text("submitted by alice")
        card.scroll_into_view_if_needed()
        bob.screenshot(path=os.path.join(SHOTS, "console-input.png"), full_page=True)
        # A bad answer comes back with the schema's reason; the step waits on.
        card.get_by_label("Answer (JSON, or plain text)").fill('{"size": 50}')
        card.get_by_role("button", name="Send answer").click()
        expect(bob.locator("#problem")).to_contain_text("answer_schema")
        bob.goto(BASE + "/ui/")
        card = bob.locator(f'article[id="input-{asked}-ask"]')
        card.get_by_label("Answer (JSON, or plain text)").fill('{"size": 3}')
        card.get_by_role("button", name="Send answer").click()
        expect(bob).to_have_url(re.compile(r"/ui/\?answered="))
        expect(bob.locator(f'article[id="input-{asked}-ask"]')).to_have_count(0)
        alice.goto(BASE + f"/ui/jobs/{asked}")
        expect(alice.locator("#job-state")).to_have_text("completed")

        step("alice runs the finished job again from its page: a new job of hers, linked to it")
        # Completed: nothing to resume, only a fresh run is offered.
        expect(alice.get_by_role("button", name="Resume from where it stopped")).to_have_count(0)
        alice.get_by_role("button", name="Run again").click()
        expect(alice).to_have_url(re.compile(r"/ui/jobs/[0-9a-f-]+$"))
        rerun = alice.url.rsplit("/", 1)[1]
        assert rerun != asked, "the page shows the new job"
        expect(alice.locator("#job-rerun-of")).to_have_text(asked)
        expect(alice.locator('tr[data-task="ask"] .state')).to_have_text("input_required")
        summary["rerun_job_id"] = rerun
        # A viewer is offered no button, and the endpoint refuses them.
        viewer.goto(BASE + f"/ui/jobs/{asked}")
        expect(viewer.locator("#job-state")).to_have_text("completed")
        assert viewer.locator("form.rerun").count() == 0, "a viewer was offered a re-run"
        forced_post(viewer, f"/ui/jobs/{asked}/rerun", {"csrf": csrf(viewer), "mode": "fresh"})
        expect(viewer.locator("#problem")).to_contain_text("permission job.submit is needed")

        step("alice pauses and resumes her schedule on the schedules page; a viewer may only look")
        alice.goto(BASE + "/ui/schedules")
        sched = alice.locator('article[id="schedule-nightly-notes"]')
        expect(sched).to_have_attribute("data-state", "active")
        expect(sched.locator("code.cron")).to_have_text("0 2 * * *")
        expect(sched).to_contain_text("Europe/Berlin")
        sched.get_by_label("Why").fill("release freeze")
        sched.get_by_role("button", name="Pause").click()
        sched = alice.locator('article[id="schedule-nightly-notes"]')
        expect(sched).to_have_attribute("data-state", "paused")
        expect(sched.locator(".pause-note")).to_have_text("release freeze")
        summary["schedule_paused_note"] = sched.locator(".pause-note").inner_text()
        viewer.goto(BASE + "/ui/schedules")
        expect(viewer.locator('article[id="schedule-nightly-notes"]')).to_have_attribute("data-state", "paused")
        assert viewer.locator("form.resume").count() == 0, "a viewer was offered to resume"
        forced_post(viewer, "/ui/schedules/nightly-notes/resume", {"csrf": csrf(viewer)})
        expect(viewer.locator("#problem")).to_contain_text("permission job.cancel is needed")
        alice.goto(BASE + "/ui/schedules")
        alice.locator('article[id="schedule-nightly-notes"]').get_by_role("button", name="Resume").click()
        expect(alice.locator('article[id="schedule-nightly-notes"]')).to_have_attribute("data-state", "active")

        step("an admin sends a dead-lettered notification again; a viewer has no such page")
        admin_ctx, admin = sign_in(browser, "admin")
        admin.goto(BASE + "/ui/notifications")
        dead = admin.locator('tr.delivery[data-webhook="pager"][data-state="dead"]').first
        expect(dead).to_contain_text("job.completed")
        expect(dead).to_contain_text("could not be reached")
        dead.get_by_role("button", name="Send again").click()
        expect(admin.locator("#retried")).to_contain_text("pager/")
        summary["notification_retried"] = admin.locator("#retried code").inner_text()
        viewer.goto(BASE + "/ui/jobs")
        assert viewer.get_by_role("link", name="Notifications").count() == 0, "a viewer was offered the page"
        forced_post(viewer, "/ui/notifications/retry", {"csrf": csrf(viewer), "delivery_id": summary["notification_retried"]})
        expect(viewer.locator("#problem")).to_contain_text("permission dead_letter.manage is needed")
        admin_ctx.close()

        step("the rate limits page shows each bucket's use and a provider's cooldown")
        viewer.goto(BASE + "/ui/limits")
        row = viewer.locator('tr.bucket[data-limit="openai"][data-scope="shared"]')
        expect(row.locator('.use[data-dimension="requests_per_minute"] .used')).to_have_text("1")
        cool = viewer.locator('tr.bucket[data-scope="key:OPENAI_API_KEY"] .cooldown')
        expect(cool).to_contain_text("answered 429")
        summary["limits_granted"] = int(row.locator(".granted").inner_text())
        viewer.screenshot(path=os.path.join(SHOTS, "console-limits.png"), full_page=True)

        step("a narrow screen: the inbox fits without sideways scrolling")
        narrow_ctx, narrow = sign_in(browser, "bob", viewport={"width": 375, "height": 740})
        narrow.goto(BASE + "/ui/")
        expect(narrow.locator(f'article[id="run-run-{second}"]')).to_be_visible()
        overflow = narrow.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the inbox is {overflow}px wider than a 375px screen"
        narrow.screenshot(path=os.path.join(SHOTS, "console-narrow.png"), full_page=True)

        step("the cookie holds a server-side session, not the pasted key")
        session = next(c["value"] for c in bob_ctx.cookies() if c["name"] == "sy_session")
        assert session != TOKENS["bob"] and TOKENS["bob"] not in session
        assert rest_status(session) == 404, "a live session authenticates as a bearer"

        step("signing out ends the session on the server, on every door")
        bob.goto(BASE + "/ui/")
        bob.get_by_role("button", name="Sign out").click()
        expect(bob).to_have_url(re.compile(r"/ui/sign-in"))
        bob.goto(BASE + "/ui/jobs")
        expect(bob).to_have_url(re.compile(r"/ui/sign-in\?next="))
        # The old cookie, replayed by hand, is refused: by the console and
        # as a bearer over REST. bob's own key still works.
        replay = browser.new_context()
        replay.add_cookies([{"name": "sy_session", "value": session, "url": BASE + "/ui/"}])
        rp = replay.new_page()
        rp.goto(BASE + "/ui/jobs")
        expect(rp).to_have_url(re.compile(r"/ui/sign-in\?next="))
        replay.close()
        assert rest_status(session) == 401, "an ended session still works over REST"
        assert rest_status(TOKENS["bob"]) == 404
        summary["signed_out_session_refused"] = True

        for c in (alice_ctx, bob_ctx, viewer_ctx, carol_ctx, narrow_ctx):
            c.close()
        browser.close()
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    started = time.monotonic()
    main()
    step(f"passed in {time.monotonic() - started:.1f}s")
