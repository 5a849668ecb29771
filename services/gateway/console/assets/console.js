// Switchyard console: the live timeline of a job page (Server-Sent Events
// from WatchJob, resumed by the browser after a reconnect with
// Last-Event-ID), steps and job state updated in place; live lists (the
// inbox count in the nav and title, and the inbox, jobs, budgets and
// agents pages merged in place when /ui/live says they changed); relative
// times kept fresh. Everything else works without JavaScript.
"use strict";

(function () {
  const TONES = {
    succeeded: "ok", completed: "ok", approved: "ok",
    failed: "bad", cancelled: "bad", discarded: "bad", skipped: "bad", rejected: "bad", retryable: "bad",
    running: "live", active: "live", retrying: "live", awaiting_approval: "live",
  };

  function setState(el, state) {
    if (!el) return;
    el.textContent = state;
    el.dataset.state = state;
    el.className = "state " + (TONES[state] || "wait");
  }

  // Micro-USD as people read it (the console's money rule: cents from a
  // cent up, the exact figure below).
  function usd(micro) {
    const m = Number(micro) || 0;
    if (m === 0) return "$0";
    if (Math.abs(m) >= 10000) return (m < 0 ? "-$" : "$") + (Math.abs(m) / 1e6).toFixed(2);
    return (m < 0 ? "-$" : "$") + (Math.abs(m) / 1e6).toFixed(6).replace(/0+$/, "");
  }

  // "is running", "succeeded", "is waiting for input".
  function became(state) {
    const s = String(state).replace(/_/g, " ");
    return /(ed|led)$/.test(s) ? s : "is " + s;
  }

  function ms(n) {
    const v = Number(n) || 0;
    return v < 1000 ? v + " ms" : (v / 1000).toFixed(1) + " s";
  }

  // An event as a sentence. Kinds without their own wording fall back to
  // their fields, shortened.
  function summary(ev) {
    const d = ev.data || {};
    const who = ev.subtask_id ? "Step " + ev.subtask_id : "The job";
    switch (ev.kind) {
      case "job.submitted":
        return "Submitted by " + d.submitted_by + " (" + d.tasks + " steps, " + d.format + ").";
      case "job.state":
        return "The job " + became(d.to) + (d.reason ? " (" + d.reason + ")" : "") + (d.error ? ": " + d.error : "") + ".";
      case "task.state":
        return who + " " + became(d.to) + (d.reason ? " (" + d.reason + ")" : "") + (d.error ? ": " + d.error : "") + ".";
      case "approval.requested":
        return "Approval requested (run " + d.run_id + ")" + (d.estimated_cost_micro_usd != null ? ", estimated " + usd(d.estimated_cost_micro_usd) : "") + ".";
      case "approval.decided":
        return "The run was " + d.status + " by " + d.by + ".";
      case "routing.decision": {
        const c = (d.candidates || []).map((x) => x.agent_id + " (score " + Number(x.score).toFixed(2) + ")");
        return who + " routed " + d.capability + " to " + (c.length ? c.join(", then ") : "no agent") + ".";
      }
      case "budget.created":
        return "Budget " + d.budget_id + " opened under " + (d.parent_id || "no parent") + ".";
      case "budget.reserved":
        return who + " reserved " + d.tokens + " tokens and " + usd(d.cost_micro_usd) + (d.agent_id ? " for " + d.agent_id : "") + ".";
      case "budget.committed":
        return who + " spent " + d.tokens + " tokens and " + usd(d.cost_micro_usd) + (d.overrun === "true" || d.overrun === true ? ", more than reserved" : "") + ".";
      case "budget.released":
        return who + " released its reservation (" + d.why + ").";
      case "budget.refused":
        return who + " was refused by budget " + d.refused_by + ": " + d.message;
      case "budget.paused":
        return "The budget ran out; extension run " + d.run_id + " asks a person for more.";
      case "budget.extension_decided":
        return "The extension was " + d.decision + " by " + d.by + (d.comment ? ": \u201c" + d.comment + "\u201d" : "") + ".";
      case "task.attempt":
        return who + " started attempt " + d.attempt + (d.timeout_secs ? " (timeout " + d.timeout_secs + " s)" : "") + ".";
      case "task.result":
        return who + " finished" + (d.agent_id ? " on " + d.agent_id : "") + (d.exit_code !== undefined && d.exit_code !== null && d.exit_code !== "" ? " (exit " + d.exit_code + ")" : "") + ".";
      case "agent.call":
        return who + " called " + d.agent_id + ": " + d.status + " in " + ms(d.latency_ms) + (d.error ? " (" + d.error + ")" : "") + ".";
      case "agent.progress":
        return who + ": " + (d.message || "working") + (d.percent ? " (" + d.percent + "%)" : "") + ".";
      case "llm.call":
        return who + " asked " + d.model + " (" + d.provider + "): " + d.outcome + " in " + ms(d.latency_ms) + (d.error ? " (" + d.error + ")" : "") + ".";
      case "llm.tool_call":
        return who + " called the tool " + d.name + ": " + d.status + (d.duration_ms ? " in " + ms(d.duration_ms) : "") + (d.reason ? " (" + d.reason + ")" : "") + ".";
      case "task.input_requested":
        return who + " asks: \u201c" + d.prompt + "\u201d";
      case "task.input_received":
        return who + " got its answer (" + d.outcome + (d.by ? ", from " + d.by : "") + ").";
      case "task.awaiting_approval":
        return who + " waits for approval of " + d.tool + " (run " + d.run_id + ").";
      case "task.approval_decided":
        return "The call to " + d.tool + " was " + d.decision + (d.by ? " by " + d.by : "") + ".";
      case "delegation.created":
        return who + " delegated to job " + d.child_job_id + ".";
      case "delegation.settled":
        return "Delegated job " + d.child_job_id + " ended " + d.state + ", spending " + usd(d.cost_micro_usd) + ".";
      case "dependency.waiting":
        return who + " waits for " + (d.service || "a service") + ": " + d.error;
      case "dependency.recovered":
        return (d.service || "A service") + " is back after " + ms(d.waited_ms) + ".";
      case "artifact.stored":
        return who + " stored " + d.name + " (" + d.size_bytes + " bytes).";
      case "job.notice":
        return d.message;
      default: {
        const keys = Object.keys(d).slice(0, 4);
        return keys.map((k) => {
          const v = d[k];
          const text = v !== null && typeof v === "object" ? JSON.stringify(v) : String(v);
          return k + ": " + (text.length > 80 ? text.slice(0, 79) + "…" : text);
        }).join("; ");
      }
    }
  }

  function append(list, ev) {
    const li = document.createElement("li");
    li.dataset.sequence = ev.sequence;
    li.dataset.kind = ev.kind;
    const t = document.createElement("time");
    if (ev.time_ms) {
      // UTC to the millisecond, like every other time the console shows.
      const at = new Date(ev.time_ms).toISOString();
      t.dateTime = at;
      t.title = at;
      t.textContent = at.slice(11, 23) + "Z";
    }
    const kind = document.createElement("code");
    kind.textContent = ev.kind;
    kind.className = "kind";
    li.append(t, " ", summary(ev), " ", kind);
    list.append(li);
  }

  function follow(list) {
    const live = document.getElementById("live");
    const url = list.dataset.events;
    const source = new EventSource(url);
    let seen = 0;
    source.onopen = () => { if (live) live.textContent = "(live)"; };
    source.onerror = () => {
      if (live) live.textContent = source.readyState === EventSource.CLOSED ? "(disconnected)" : "(reconnecting…)";
    };
    source.onmessage = (m) => {
      const ev = JSON.parse(m.data);
      if (ev.sequence <= seen) return;
      seen = ev.sequence;
      append(list, ev);
      const d = ev.data || {};
      if (ev.kind === "task.state" && ev.subtask_id) {
        const sel = '[data-task="' + CSS.escape(ev.subtask_id) + '"]';
        setState(document.querySelector("tr" + sel + " .state"), d.to);
        const node = document.querySelector("g.node" + sel);
        if (node) {
          node.setAttribute("class", "node " + (TONES[d.to] || "wait"));
          node.querySelector(".state-text").textContent = d.to;
        }
      } else if (ev.kind === "job.state") {
        setState(document.getElementById("job-state"), d.to);
      }
    };
    source.addEventListener("end", () => {
      source.close();
      if (live) live.textContent = "(finished)";
      refreshOutputs();
    });
  }

  // The finished job's outputs and figures, from the server's own page.
  async function refreshOutputs() {
    try {
      const r = await fetch(location.href, { credentials: "same-origin" });
      if (!r.ok) return;
      const doc = new DOMParser().parseFromString(await r.text(), "text/html");
      for (const id of ["outputs", "job-head", "waterfall-box"]) {
        const fresh = doc.getElementById(id);
        const here = document.getElementById(id);
        if (fresh && here) here.replaceWith(fresh);
      }
      const rows = doc.querySelectorAll("#steps tbody tr");
      rows.forEach((row) => {
        const here = document.getElementById(row.id);
        if (here) here.replaceWith(row);
      });
    } catch (e) {
      // The page still shows the live states; a reload shows the rest.
    }
  }

  function relative(ms) {
    const d = Math.round((Date.now() - ms) / 1000);
    const a = Math.abs(d);
    let s;
    if (a < 5) return "just now";
    if (a < 60) s = a + " s";
    else if (a < 3600) s = Math.floor(a / 60) + " min";
    else if (a < 86400) s = Math.floor(a / 3600) + " h";
    else s = Math.floor(a / 86400) + (a < 172800 ? " day" : " days");
    return d >= 0 ? s + " ago" : "in " + s;
  }

  function freshen() {
    document.querySelectorAll("time[datetime]").forEach((t) => {
      if (t.closest(".timeline")) return;
      const ms = Date.parse(t.dateTime);
      if (!Number.isNaN(ms)) t.textContent = relative(ms);
    });
  }

  // True when the person is in the middle of something inside `el`: focus
  // in a field, or text typed that was not sent.
  function busy(el) {
    const a = document.activeElement;
    if (a && a !== document.body && el.contains(a) && a.matches("input, textarea, select, button")) return true;
    return [...el.querySelectorAll("input, textarea")].some((i) => i.value !== i.defaultValue);
  }

  // Keyed merge: children present on both sides stay as they are (a card
  // someone is reading or typing in is not redrawn), new ones are added in
  // the server's order, gone ones removed.
  function mergeKeyed(here, fresh) {
    const kept = new Map([...here.children].filter((c) => c.id).map((c) => [c.id, c]));
    const next = [...fresh.children].map((c) => {
      const old = c.id && kept.get(c.id);
      if (!old) return document.importNode(c, true);
      if (old.hasAttribute("data-live-keyed")) mergeKeyed(old, c);
      return old;
    });
    here.replaceChildren(...next);
  }

  let refreshing = false;
  let again = false;
  // The page as the server now renders it, merged into this one.
  async function refreshLists() {
    if (refreshing) { again = true; return; }
    refreshing = true;
    try {
      const r = await fetch(location.href, { credentials: "same-origin" });
      if (!r.ok) return;
      const doc = new DOMParser().parseFromString(await r.text(), "text/html");
      doc.querySelectorAll("[data-live]").forEach((fresh) => {
        const here = fresh.id && document.getElementById(fresh.id);
        if (here && !busy(here)) here.replaceWith(document.importNode(fresh, true));
      });
      doc.querySelectorAll("[data-live-keyed]").forEach((fresh) => {
        const here = fresh.id && document.getElementById(fresh.id);
        if (here && !here.parentElement.closest("[data-live-keyed]")) mergeKeyed(here, fresh);
      });
      document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
    } catch (e) {
      // The next change tries again.
    } finally {
      refreshing = false;
      if (again) { again = false; refreshLists(); }
    }
  }

  function setCount(count) {
    const badge = document.getElementById("inbox-count");
    if (badge) {
      badge.textContent = count;
      badge.hidden = count === "0";
    }
    const title = document.title.replace(/^\(\S+\) /, "");
    document.title = count === "0" ? title : "(" + count + ") " + title;
  }

  function listen(page) {
    const source = new EventSource("/ui/live?page=" + encodeURIComponent(page));
    source.addEventListener("inbox", (m) => setCount(String(JSON.parse(m.data).count)));
    source.addEventListener("changed", () => refreshLists());
  }

  document.addEventListener("DOMContentLoaded", () => {
    const list = document.getElementById("timeline");
    if (list && list.dataset.events) follow(list);
    const page = document.body.dataset.live;
    if (page && window.EventSource) listen(page);
    setInterval(freshen, 30000);
  });
})();
