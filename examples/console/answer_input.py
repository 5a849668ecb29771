"""Answer a step waiting for you in the web console, in a real browser.

    SY_CHROMIUM=$(command -v chromium) python answer_input.py BASE TOKEN JOB_ID [ANSWER]

Signs in to the console at BASE (the gateway's HTTP door, e.g.
http://127.0.0.1:7680) with TOKEN, finds the card "Waiting for your input"
for step `ask` of JOB_ID on the inbox, prints what it asks, and sends ANSWER
(JSON or plain text; default {"size": 6}) through its form. Needs Playwright
for Python and Debian's Chromium (never `playwright install`).
"""

import os
import re
import sys

from playwright.sync_api import expect, sync_playwright

BASE, TOKEN, JOB = sys.argv[1], sys.argv[2], sys.argv[3]
ANSWER = sys.argv[4] if len(sys.argv) > 4 else '{"size": 6}'

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=os.environ["SY_CHROMIUM"], args=["--no-sandbox"])
    page = browser.new_page()
    page.goto(BASE + "/ui/")
    page.get_by_label("API key or token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    card = page.locator(f'article[id="input-{JOB}-ask"]')
    print("inbox:", " ".join(card.locator("p").first.inner_text().split()))
    print("      ", " ".join(card.locator("p.muted").inner_text().split()))
    card.get_by_label("Answer (JSON, or plain text)").fill(ANSWER)
    card.get_by_role("button", name="Send answer").click()
    expect(page).to_have_url(re.compile(r"/ui/\?answered="))
    print(f"sent {ANSWER}; back on", page.url.replace(BASE, ""))
    browser.close()
