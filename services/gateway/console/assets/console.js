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

  function summary(ev) {
    const d = ev.data || {};
    switch (ev.kind) {
      case "job.state":
      case "task.state":
        return (d.from ? d.from + " → " : "→ ") + d.to + (d.reason ? " (" + d.reason + ")" : "");
      case "routing.decision": {
        const c = (d.candidates || []).map((x) => x.agent_id + " " + Number(x.score).toFixed(2));
        return d.capability + " → " + (c.length ? c.join(", ") : "no agent");
      }
      case "task.progress":
        return (d.message || "") + (d.percent ? " " + d.percent + "%" : "");
      default: {
        const keys = Object.keys(d).slice(0, 4);
        return keys.map((k) => {
          const v = d[k];
          const text = v !== null && typeof v === "object" ? JSON.stringify(v) : String(v);
          return k + "=" + (text.length > 80 ? text.slice(0, 79) + "…" : text);
        }).join(" ");
      }
    }
  }

  function append(list, ev) {
    const li = document.createElement("li");
    li.dataset.sequence = ev.sequence;
    li.dataset.kind = ev.kind;
    const t = document.createElement("time");
    if (ev.time_ms) {
      const at = new Date(ev.time_ms);
      t.dateTime = at.toISOString();
      t.title = at.toISOString();
      t.textContent = at.toLocaleTimeString();
    }
    const kind = document.createElement("code");
    kind.textContent = ev.kind;
    li.append(t, " ", kind, ev.subtask_id ? " " + ev.subtask_id + " " : " ", summary(ev));
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
      for (const id of ["outputs", "job-head"]) {
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
