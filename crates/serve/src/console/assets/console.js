// The mcpbox console. No framework, nothing fetched from elsewhere.
//
// One rule above all: whatever a server, an agent or the audit log chose
// (tool names, previews, descriptions, reasons, details) enters the page
// as text (text nodes, textContent), never as HTML. `el` below is the one
// way this file builds the DOM; it has no innerHTML path.
"use strict";

(function () {
  // ---- DOM helpers -------------------------------------------------------

  /** el("td", {className: "mono"}, "text", childNode, ...) */
  function el(tag, props) {
    const node = document.createElement(tag);
    if (props) {
      for (const k of Object.keys(props)) {
        const v = props[k];
        if (v === undefined || v === null || v === false) continue;
        if (k === "className") node.className = v;
        else if (k === "onclick") node.addEventListener("click", v);
        else if (k === "disabled") node.disabled = true;
        else if (k === "title" || k === "type" || k.startsWith("data-")) node.setAttribute(k, String(v));
        else throw new Error("el: unsupported property " + k);
      }
    }
    for (let i = 2; i < arguments.length; i++) append(node, arguments[i]);
    return node;
  }
  function append(node, child) {
    if (child === undefined || child === null || child === false) return;
    if (Array.isArray(child)) { child.forEach(function (c) { append(node, c); }); return; }
    if (child instanceof Node) node.appendChild(child);
    else node.appendChild(document.createTextNode(String(child)));
  }
  function $(id) { return document.getElementById(id); }
  function clip(s, n) { s = String(s); return s.length > n ? s.slice(0, n) + " … (" + (s.length - n) + " more characters)" : s; }
  function fmtTime(ms) { return ms ? new Date(ms).toLocaleString() : ""; }
  function fmtDuration(s) {
    s = Math.max(0, Math.floor(s));
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }
  function notice(text) {
    const n = $("notice");
    if (!text) { n.hidden = true; n.textContent = ""; return; }
    n.hidden = false;
    n.textContent = text;
  }

  // ---- API ---------------------------------------------------------------

  async function api(method, path, body) {
    const init = { method: method, credentials: "same-origin", headers: {} };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const r = await fetch(path, init);
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (r.status === 401) {
      notice("Not signed in: open the URL that mcpbox printed on its standard error (it ends in #token=…).");
      throw new Error("unauthorized");
    }
    if (!r.ok) throw new Error((data && data.error) || ("HTTP " + r.status));
    return data;
  }

  // The token arrives in the URL's fragment (never sent to a server); it
  // is traded once for an HttpOnly, SameSite=Strict cookie and removed
  // from the address bar and the history.
  async function login() {
    const m = /^#token=([0-9a-f]+)/.exec(location.hash);
    if (!m) return;
    history.replaceState(null, "", "/#approvals");
    try {
      await api("POST", "/login", { token: m[1] });
    } catch (e) {
      notice("This token was not accepted: " + e.message);
    }
  }

  // ---- pages -------------------------------------------------------------

  const pages = ["approvals", "sandboxes", "audit", "pins"];
  let current = null;
  function route() {
    let page = location.hash.replace(/^#/, "");
    if (pages.indexOf(page) < 0) page = "approvals";
    current = page;
    pages.forEach(function (p) {
      $("page-" + p).hidden = p !== page;
      $("nav-" + p).className = p === page ? "active" : "";
    });
    if (page === "sandboxes") loadSandboxes();
    if (page === "audit") loadAudit(false);
    if (page === "pins") loadPins();
  }

  // Approvals: a long poll (GET /api/approvals?since=VERSION answers when
  // the broker's table changes, or after 25 s).
  let approvals = [];
  let clockSkew = 0;
  async function pollApprovals() {
    let version = null;
    for (;;) {
      try {
        const r = await api("GET", "/api/approvals" + (version === null ? "" : "?since=" + version));
        version = r.version;
        clockSkew = r.now_ms - Date.now();
        approvals = r.approvals;
        renderApprovals();
        $("live").textContent = "live";
      } catch (e) {
        $("live").textContent = "reconnecting…";
        await new Promise(function (ok) { setTimeout(ok, 2000); });
      }
    }
  }

  function timeLeft(v) {
    return Math.max(0, (v.expires_ms - (Date.now() + clockSkew)) / 1000);
  }

  function subjectText(s) {
    if (!s) return "";
    if (s.type === "call") return "a tool call, before it reaches the server";
    if (s.type === "result") {
      let t = "a tool result of " + s.bytes + " bytes, before it reaches the host";
      if (s.over) t += " (over " + s.over + ")";
      if (s.credential_shapes && s.credential_shapes.length) t += "; credential-shaped: " + s.credential_shapes.join(", ");
      return t;
    }
    if (s.type === "network") return "a connection to " + s.host + ":" + s.port;
    return s.type;
  }

  function renderApprovals() {
    const pending = approvals.filter(function (v) { return v.state === "pending"; });
    $("pending-count").textContent = pending.length ? String(pending.length) : "";
    document.title = (pending.length ? "(" + pending.length + ") " : "") + "mcpbox console";
    const box = $("approvals");
    if (!approvals.length) {
      box.replaceChildren(el("div", { className: "empty" }, "Nothing waits for a human."));
      return;
    }
    box.replaceChildren.apply(box, approvals.map(approvalCard));
  }

  function approvalCard(v) {
    const buttons = el("div", { className: "actions" });
    const status = el("div", { className: "muted" });
    function act(path, body) {
      return async function () {
        Array.prototype.forEach.call(buttons.querySelectorAll("button"), function (b) { b.disabled = true; });
        try {
          await api("POST", "/api/approvals/" + encodeURIComponent(v.id) + "/" + path, body);
          status.textContent = "sent";
        } catch (e) {
          status.textContent = "failed: " + e.message;
          Array.prototype.forEach.call(buttons.querySelectorAll("button"), function (b) { b.disabled = false; });
        }
      };
    }
    if (v.state === "pending") {
      append(buttons, [
        el("button", { className: "allow", type: "button", onclick: act("approve", { scope: "once" }) }, "Allow once"),
        el("button", { className: "session", type: "button", onclick: act("approve", { scope: "session" }) }, "Allow for this session"),
        el("button", { className: "deny", type: "button", onclick: act("deny") }, "Deny"),
      ]);
    } else {
      append(buttons, el("span", { className: "tag" }, "approved by " + (v.approved_by || "?") + ": waits for the caller to retry"));
    }
    const left = el("span", { className: "timeleft", "data-expires": v.expires_ms }, fmtDuration(timeLeft(v)));
    return el("div", { className: "card", "data-approval": v.id },
      el("h2", null, v.tool),
      el("dl", { className: "facts" },
        el("dt", null, "server"), el("dd", null, v.server),
        el("dt", null, "caller"), el("dd", null, v.caller || "(unnamed host)"),
        el("dt", null, "rule"), el("dd", null, v.rule),
        el("dt", null, "reason"), el("dd", null, v.reason),
        el("dt", null, "what waits"), el("dd", null, subjectText(v.subject) + (v.held ? "" : " (the call was refused; approving lets its retry through once)")),
        el("dt", null, "asked"), el("dd", null, fmtTime(v.created_ms)),
        el("dt", null, "time left"), el("dd", null, left),
        el("dt", null, "id"), el("dd", null, v.id + "  ·  " + v.approve_command)
      ),
      el("div", { className: "muted" }, "Arguments (redacted, shortened):"),
      el("pre", { className: "preview" }, clip(JSON.stringify(v.preview, null, 2), 6000)),
      buttons,
      status
    );
  }

  // the countdowns, every second
  setInterval(function () {
    document.querySelectorAll("[data-expires]").forEach(function (n) {
      const ms = Number(n.getAttribute("data-expires"));
      n.textContent = fmtDuration((ms - (Date.now() + clockSkew)) / 1000);
    });
  }, 1000);

  // Sandboxes
  async function loadSandboxes() {
    const box = $("sandboxes");
    let r;
    try { r = await api("GET", "/api/sandboxes"); } catch (e) { box.replaceChildren(el("div", { className: "empty" }, "Could not load: " + e.message)); return; }
    if (!r.available) {
      box.replaceChildren(el("div", { className: "empty" }, "No sandboxes here: " + r.why + "."));
      return;
    }
    if (!r.sandboxes.length) {
      box.replaceChildren(el("div", { className: "empty" }, "No sandboxes yet: one is made for a client's first session with a server."));
      return;
    }
    const rows = r.sandboxes.map(function (s) {
      const status = el("span", { className: "muted" });
      function op(name, confirmText) {
        return el("button", {
          type: "button",
          onclick: async function () {
            if (confirmText && !window.confirm(confirmText)) return;
            try { await api("POST", "/api/sandboxes/" + encodeURIComponent(s.id) + "/" + name); status.textContent = name + ": done"; }
            catch (e) { status.textContent = name + ": " + e.message; }
            loadSandboxes();
          },
        }, name);
      }
      return el("tr", null,
        el("td", { className: "mono" }, s.id),
        el("td", null, s.agent),
        el("td", null, s.server + (s.task ? " / " + s.task : "")),
        el("td", { className: "state" }, s.state),
        el("td", null, s.cpu_usec === undefined ? "n/a" : (s.cpu_usec / 1e6).toFixed(2) + " s"),
        el("td", null, s.memory_bytes === undefined ? "n/a" : (s.memory_bytes / 1048576).toFixed(1) + " MiB"),
        el("td", null, String(s.processes)),
        el("td", null, String(s.sessions)),
        el("td", null, fmtDuration(s.idle_seconds)),
        el("td", null, s.created),
        el("td", null, el("div", { className: "actions" },
          s.state === "running" && s.freezer ? op("pause") : null,
          s.state === "running" && !s.freezer ? el("span", { className: "muted", title: "pausing needs a freezer cgroup (root, or a delegated cgroup)" }, "no freezer") : null,
          s.state === "paused" ? op("resume") : null,
          op("destroy", "Destroy sandbox " + s.id + "? Its processes are killed and its workspace deleted (declared artifacts are exported first)."),
          status))
      );
    });
    box.replaceChildren(el("table", null,
      el("thead", null, el("tr", null, ["id", "agent", "server", "state", "CPU", "memory", "processes", "sessions", "idle", "created", ""].map(function (h) { return el("th", null, h); }))),
      el("tbody", null, rows)));
  }
  setInterval(function () { if (current === "sandboxes") loadSandboxes(); }, 5000);

  // Audit
  let auditOldest = null;
  let infoDone = false;
  async function loadInfo() {
    const info = await api("GET", "/api/info");
    $("mode").textContent = info.mode;
    const sel = $("audit-db");
    sel.replaceChildren.apply(sel, info.audit_dbs.map(function (p, i) { const o = el("option", null, p); o.value = String(i); return o; }));
    infoDone = true;
  }

  async function loadAudit(older) {
    if (!infoDone) { try { await loadInfo(); } catch (e) { return; } }
    const form = $("audit-filters");
    const params = new URLSearchParams();
    ["db", "kind", "server", "tool", "decision", "since"].forEach(function (k) {
      const v = form.elements[k].value.trim();
      if (v) params.set(k, v);
    });
    // the next page: up to the oldest shown's millisecond included (several
    // records can share one), those already shown skipped by seq
    if (older && auditOldest !== null) params.set("before", String(auditOldest.time + 1));
    const chain = $("chain");
    api("GET", "/api/audit/verify?db=" + encodeURIComponent(form.elements.db.value || "0")).then(function (v) {
      chain.className = "chain " + v.status;
      if (v.status === "intact") {
        chain.textContent = "Chain intact: " + v.records + " records" +
          (v.pruned_through ? " (retention removed 1 to " + v.pruned_through + ")" : "") +
          (v.head_signed ? ", head signed" : (v.key ? "" : ", head not checked (no audit.key)")) + ".";
      } else if (v.status === "broken") {
        chain.textContent = "Chain BROKEN at record " + v.first_broken_seq + " (" + v.reason + "): " + v.records + " records intact before it.";
      } else {
        chain.textContent = "No audit log yet.";
      }
    }, function (e) { chain.className = "chain broken"; chain.textContent = "Could not verify the chain: " + e.message; });
    let r;
    const box = $("audit");
    try { r = await api("GET", "/api/audit?" + params.toString()); }
    catch (e) { box.replaceChildren(el("div", { className: "empty" }, e.message)); return; }
    if (!r.records.length) {
      if (!older) box.replaceChildren(el("div", { className: "empty" }, "No records match."));
      $("audit-older").hidden = true;
      return;
    }
    $("audit-older").hidden = r.records.length < 100;
    let records = r.records;
    if (older && auditOldest !== null) {
      const seen = auditOldest.seq;
      records = records.filter(function (rec) { return rec.seq < seen; });
    }
    if (!records.length) { $("audit-older").hidden = true; return; }
    const last = records[records.length - 1];
    auditOldest = { time: last.event.time_ms, seq: last.seq };
    const rows = records.map(function (rec) {
      const e = rec.event;
      return el("tr", null,
        el("td", null, String(rec.seq)),
        el("td", null, fmtTime(e.time_ms)),
        el("td", null, e.kind || ""),
        el("td", null, e.server),
        el("td", null, e.caller),
        el("td", { className: "mono" }, e.tool || ""),
        el("td", { className: "decision-" + (e.decision || "") }, e.decision || ""),
        el("td", { className: "mono" }, [e.reason || "", e.source ? " (" + e.source + ")" : ""].join("")),
        el("td", { className: "mono" }, clip(e.detail === null ? "" : JSON.stringify(e.detail), 400))
      );
    });
    if (older) {
      const tbody = box.querySelector("tbody");
      if (tbody) { append(tbody, rows); return; }
    }
    box.replaceChildren(el("table", null,
      el("thead", null, el("tr", null, ["seq", "time", "kind", "server", "caller", "tool", "decision", "reason", "detail"].map(function (h) { return el("th", null, h); }))),
      el("tbody", null, rows)));
  }

  // Pins
  function changeLine(c) {
    const name = c.tool === null ? "the server's instructions" : c.tool;
    if (c.kind === "added") return { cls: "change-add", text: "+ " + name + " (new tool)" };
    if (c.kind === "removed") return { cls: "change-del", text: "- " + name + " (gone)" };
    if (c.kind === "instructions_changed") return { cls: "change-mod", text: "~ the server's instructions changed" };
    return { cls: "change-mod", text: "~ " + name + " (definition changed)" };
  }

  async function loadPins() {
    const box = $("pins");
    let r;
    try { r = await api("GET", "/api/pins"); } catch (e) { box.replaceChildren(el("div", { className: "empty" }, e.message)); return; }
    if (!r.servers.length) {
      box.replaceChildren(el("div", { className: "empty" }, "No pins yet: each server's first tool list is pinned when it is seen."));
      return;
    }
    box.replaceChildren.apply(box, r.servers.map(function (s) {
      const status = el("span", { className: "muted" });
      function op(name, tool, label) {
        const accept = name === "accept";
        return el("button", {
          type: "button",
          className: accept ? "allow" : "deny",
          onclick: async function () {
            const body = { id: s.id };
            if (tool !== undefined) body.tool = tool === null ? "instructions" : tool;
            try { await api("POST", "/api/pins/" + name, body); status.textContent = accept ? "accepted" : "rejected"; loadPins(); }
            catch (e) { status.textContent = name + ": " + e.message; }
          },
        }, label);
      }
      let change = null;
      if (s.pending.length) {
        const items = s.pending.map(function (c) {
          const line = changeLine(c);
          const detail = [];
          if (c.diff) detail.push(el("pre", { className: "preview" }, c.diff));
          else if (c.kind === "added" && c.proposed_description) detail.push(el("pre", { className: "preview" }, c.proposed_description));
          if (c.schema && (c.schema.added.length || c.schema.removed.length || c.schema.changed.length)) {
            detail.push(el("div", { className: "muted" }, "input schema: " +
              [["added", c.schema.added], ["removed", c.schema.removed], ["changed", c.schema.changed]]
                .filter(function (p) { return p[1].length; })
                .map(function (p) { return p[0] + " " + p[1].map(function (x) { return x || "(the whole schema)"; }).join(", "); }).join("; ")));
          }
          if (c.why_not) detail.push(el("div", { className: "muted" }, c.why_not));
          return el("li", null,
            el("span", { className: line.cls }, line.text),
            detail,
            el("div", { className: "actions" },
              op("accept", c.tool, "Accept"),
              op("reject", c.tool, "Reject")));
        });
        change = el("div", null,
          el("strong", null, "A change is withheld until a human accepts it:"),
          el("ul", { className: "changes" }, items),
          el("div", { className: "actions" }, op("accept", undefined, "Accept the change"), op("reject", undefined, "Reject the change"), status));
      }
      return el("div", { className: "card", "data-pins": s.id },
        el("h2", null, s.id),
        el("div", { className: "muted" }, "server of the policy " + s.policy + (s.tools_pinned ? ", " + s.tools.length + " tools pinned" : ", no tool list pinned yet")),
        s.server ? el("div", { className: "muted" }, "runs " + s.server) : null,
        s.tools.length ? el("ul", { className: "tools" }, s.tools.map(function (t) { return el("li", { title: t.description || t.digest }, t.name); })) : null,
        change);
    }));
  }

  // ---- start -------------------------------------------------------------

  async function main() {
    await login();
    $("audit-filters").addEventListener("submit", function (ev) { ev.preventDefault(); loadAudit(false); });
    $("audit-older").addEventListener("click", function () { loadAudit(true); });
    window.addEventListener("hashchange", route);
    loadInfo().catch(function () {});
    route();
    pollApprovals();
  }
  main();
})();
