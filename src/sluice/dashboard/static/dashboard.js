/* Sluice dashboard: the process table, one process's detail and curves, and a comparison chart.
   Live data arrive as server-sent events on one stream (read with fetch, so that the bearer token goes in a
   header); the stream reconnects after any break and starts again from the snapshot it sends first.
   Controls are the ProvMnS PATCHes a consumer sends, to the ProvMnS URIs, with the same token. */
"use strict";
const $ = (s) => document.querySelector(s);
const S = { mode: null, base: "", auth: false, token: sessionStorage.getItem("sluice-token") || "",
  procs: new Map(), points: new Map(), selected: null, compare: new Set(), charts: {}, dirty: false };
const ENDED = new Set(["FINISHED", "CANCELLED", "FAILED"]);

/* ---------------------------------------------------------------- formatting (numbers carry units) */
function fmtBytes(b) {
  if (b == null) return "–";
  if (b >= 1e9) return (b / 1e9).toFixed(2) + " GB";
  if (b >= 1e6) return (b / 1e6).toFixed(2) + " MB";
  if (b >= 1e3) return (b / 1e3).toFixed(1) + " kB";
  return b + " B";
}
function fmtS(s) {
  if (s == null || !isFinite(s)) return "–";
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + " s";
  const m = Math.floor(s / 60);
  return m < 60 ? `${m} min ${Math.round(s % 60)} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
}
function fmtN(v, d = 4) {
  if (v == null || typeof v !== "number") return "–";
  return Number.isInteger(v) ? String(v) : Math.abs(v) >= 100 ? v.toFixed(1) : v.toPrecision(d);
}
function fmtTime(iso) {
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toLocaleString();
}
function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") e.textContent = v; else if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}
function remaining(p) {
  const e = p.estimate || {};
  if (ENDED.has(p.status)) return "–";
  const parts = [];
  if (e.remaining_s != null) parts.push(fmtS(e.remaining_s));
  if (e.remaining_iterations != null) {
    const range = e.low != null && e.high != null && (e.low !== e.remaining_iterations || e.high !== e.remaining_iterations)
      ? ` [${e.low}–${e.high}]` : "";
    parts.push(`${e.remaining_iterations} it.${range}`);
  }
  return parts.length ? parts.join(", ") : (e.note || "–");
}

/* ---------------------------------------------------------------- HTTP */
function headers(extra = {}) {
  return S.token ? { ...extra, Authorization: `Bearer ${S.token}` } : extra;
}
async function api(path) {
  const r = await fetch(path, { headers: headers(), cache: "no-store" });
  if (r.status === 401) { showLogin("The token was refused."); throw new Error("401"); }
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return r.json();
}
async function patch(uri, body, what) {
  const msg = $("#ctl-msg");
  msg.textContent = `${what}…`;
  const r = await fetch(uri, { method: "PATCH", body: JSON.stringify(body),
    headers: headers({ "Content-Type": "application/merge-patch+json" }) });
  if (r.ok) { msg.textContent = `${what}: sent (${r.status})`; return; }
  let reason = r.statusText;
  try { const j = await r.json(); reason = j.reason || j.title || JSON.stringify(j).slice(0, 200); } catch (e) { /* not JSON */ }
  msg.textContent = `${what}: refused (${r.status}) ${reason}`;
}

/* ---------------------------------------------------------------- the event stream */
function setConn(state, text) {
  const c = $("#conn");
  c.dataset.state = state;
  c.textContent = text || state;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function stream() {
  for (;;) {
    try {
      const r = await fetch("/dashboard/api/events", { headers: headers(), cache: "no-store" });
      if (r.status === 401) { showLogin(S.token ? "The token was refused." : ""); return; }
      if (!r.ok || !r.body) throw new Error(String(r.status));
      setConn("live", "live");
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true }).replace(/\r\n/g, "\n");
        let k;
        while ((k = buf.indexOf("\n\n")) >= 0) { onBlock(buf.slice(0, k)); buf = buf.slice(k + 2); }
      }
    } catch (e) { /* the service went away: reconnect below */ }
    setConn("reconnecting", "reconnecting…");
    await sleep(1000);
  }
}
function onBlock(block) {
  let type = "message"; const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) type = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
  }
  if (!data.length) return;
  const ev = JSON.parse(data.join("\n"));
  if (type === "snapshot") onSnapshot(ev.processes);
  else if (type === "process") onProcess(ev);
  else if (type === "removed") { S.procs.delete(ev.id); S.points.delete(ev.id); renderTable(); }
}
function fromHash() {
  /* #p=<process>&compare=<id>,<id> (or compare=*): what to show first, so that a view can be linked */
  const h = new URLSearchParams(location.hash.slice(1));
  const want = h.get("p"), cmp = h.get("compare");
  if (want && S.procs.has(want)) select(want);
  if (cmp) {
    for (const id of cmp === "*" ? [...S.procs.keys()] : cmp.split(",")) {
      if (!S.procs.has(id)) continue;
      const cb = document.querySelector(`#procs tr[data-id="${CSS.escape(id)}"] input[type=checkbox]`);
      if (cb) cb.checked = true;
      toggleCompare(id, true);
    }
  }
}
function onSnapshot(list) {
  const first = !S.snapshots;
  S.snapshots = (S.snapshots || 0) + 1;
  S.procs = new Map(list.map((p) => [p.id, p]));
  for (const id of [...S.points.keys()]) if (!S.procs.has(id)) S.points.delete(id);
  renderTable();
  for (const id of new Set([S.selected, ...S.compare])) if (id && S.procs.has(id)) loadPoints(id);
  if (S.selected && S.procs.has(S.selected)) renderDetail();
  if (first) fromHash();
}
function addPoints(id, pts) {
  const have = S.points.get(id);
  if (!have) return;
  const last = have.length ? have[have.length - 1].iteration : -Infinity;
  for (const p of pts) if (p.iteration > last) have.push(p);
}
function onProcess(ev) {
  S.procs.set(ev.id, ev.summary);
  addPoints(ev.id, ev.points || []);
  S.lastEvent = { id: ev.id, iteration: ev.summary.iterations, committed: ev.committed_at || "" };
  schedule();
}
function fromColumns(cols) {
  const keys = Object.keys(cols), n = keys.length ? cols[keys[0]].length : 0, out = new Array(n);
  for (let i = 0; i < n; i++) {
    const p = {};
    for (const k of keys) { const v = cols[k][i]; if (v !== null) p[k] = v; }
    out[i] = p;
  }
  return out;
}
function loadPoints(id) {
  /* one request at a time per process: a second ask while one is on its way waits for it */
  S.loading = S.loading || new Map();
  if (!S.loading.has(id)) S.loading.set(id, fetchPoints(id).finally(() => S.loading.delete(id)));
  return S.loading.get(id);
}
async function fetchPoints(id) {
  const view = await api(`/dashboard/api/processes/${encodeURIComponent(id)}`);
  const have = S.points.get(id) || [];
  const merged = fromColumns(view.columns);
  const last = merged.length ? merged[merged.length - 1].iteration : -Infinity;
  for (const p of have) if (p.iteration > last) merged.push(p);
  S.points.set(id, merged);
  S.procs.set(id, { ...view, columns: undefined });
  schedule();
}
function schedule(rebuild) {
  if (rebuild) S.rebuild = true;
  if (S.dirty) return;
  S.dirty = true;
  requestAnimationFrame(() => {
    S.dirty = false;
    renderTable();
    if (S.selected) renderDetail();
    if (S.compare.size) renderCompare();
    S.rebuild = false;
    /* what was last drawn, when, and when the service committed it: <id>@<iteration>@<ms>@<s> */
    const e = S.lastEvent;
    if (e) document.body.dataset.shown = `${e.id}@${e.iteration}@${Date.now()}@${e.committed}`;
  });
}

/* ---------------------------------------------------------------- the table */
function renderTable() {
  const tb = $("#procs tbody");
  const rows = [...S.procs.values()];
  $("#count").textContent = `(${rows.length})`;
  $("#empty").hidden = rows.length > 0;
  const keep = new Map([...tb.children].map((tr) => [tr.dataset.id, tr]));
  rows.forEach((p, i) => {
    let tr = keep.get(p.id);
    if (!tr) {
      tr = el("tr", { "data-id": p.id });
      const cb = el("input", { type: "checkbox", "aria-label": `compare ${p.id}` });
      cb.addEventListener("change", () => toggleCompare(p.id, cb.checked));
      tr.append(el("td", {}, cb), el("td", {}, el("button", { class: "link", type: "button",
        text: p.id, onclick: () => select(p.id) })));
      for (let j = 0; j < 7; j++) tr.append(el("td"));
    }
    keep.delete(p.id);
    if (tb.children[i] !== tr) tb.insertBefore(tr, tb.children[i] || null);
    const c = tr.children;
    tr.dataset.status = p.requestStatus || p.status || "";
    tr.dataset.iterations = p.iterations;
    tr.classList.toggle("sel", p.id === S.selected);
    c[2].textContent = p.request || "–";
    c[3].textContent = p.requestStatus ? `${p.requestStatus}` : (p.state_info || p.status || "–");
    c[3].title = `process: ${p.state_info || p.status || ""}`;
    c[4].textContent = p.model_type || p.model_id || "–";
    c[5].textContent = p.engine || "–";
    const pct = p.progress == null ? null : Math.max(0, Math.min(100, p.progress));
    c[6].replaceChildren(el("span", { class: "bar", "aria-hidden": "true" }, el("i", { style: `width:${pct || 0}%` })),
      `${pct == null ? "–" : pct + " %"} (${p.iterations} it.)`);
    c[7].textContent = remaining(p);
    c[8].textContent = p.cause || "";
  });
  for (const tr of keep.values()) tr.remove();
}
function select(id) {
  S.selected = id;
  history.replaceState(null, "", `#p=${encodeURIComponent(id)}`);
  S.rebuild = true;
  $("#detail").hidden = false;
  $("#report").hidden = true;
  $("#ctl-msg").textContent = "";
  loadPoints(id).catch(() => {});
  renderTable();
}
function toggleCompare(id, on) {
  if (on) { S.compare.add(id); loadPoints(id).catch(() => {}); } else S.compare.delete(id);
  $("#compare").hidden = S.compare.size === 0;
  schedule(true);
}

/* ---------------------------------------------------------------- one process */
function fact(dl, name, value) {
  dl.append(el("div", { "data-fact": name }, el("dt", { text: name }), el("dd", { text: value })));
}
function renderDetail() {
  const p = S.procs.get(S.selected);
  if (!p) { $("#detail").hidden = true; return; }
  $("#detail").dataset.id = p.id;
  $("#detail").dataset.status = p.status || "";
  $("#d-id").textContent = p.id;
  const dl = $("#d-facts"); dl.replaceChildren();
  if (p.requestStatus) fact(dl, "requestStatus", p.requestStatus);
  fact(dl, "process", `${p.status || "–"}${p.state_info && p.state_info !== p.status ? ` (${p.state_info})` : ""}`);
  fact(dl, "model type", p.model_type || p.model_id || "–");
  fact(dl, "engine", p.engine || "–");
  fact(dl, "iterations done", String(p.iterations));
  fact(dl, "progress", p.progress == null ? "–" : `${p.progress} %`);
  fact(dl, "training time", fmtS(p.elapsed_s));
  const e = p.estimate || {};
  fact(dl, "estimated remaining", remaining(p));
  fact(dl, "80 % interval", e.low != null && e.high != null ? `${e.low}–${e.high} iterations` : "–");
  fact(dl, "reach probability", e.reach_probability == null ? "–" : `${Math.round(e.reach_probability * 100)} %`);
  fact(dl, "up (total)", fmtBytes(p.bytes_up));
  fact(dl, "down (total)", fmtBytes(p.bytes_down));
  if (p.started) fact(dl, "started", fmtTime(p.started));
  if (p.ended) fact(dl, "ended", fmtTime(p.ended));
  const end = $("#d-end");
  end.dataset.status = p.status || "";
  end.textContent = ENDED.has(p.status) ? endText(p) : (p.suspended ? "Suspended." : (e.note ? `Estimate: ${e.note}` : ""));
  renderControls(p);
  $("#d-term").textContent = p.termination_text || JSON.stringify(p.termination || {});
  renderCriteria(p);
  renderCharts(p);
  renderClients(p);
}
function endText(p) {
  let s = `Ended ${p.status}: ${p.cause || "no cause given"}`;
  const c = p.criterion;
  if (c && c.rule) {
    const hit = (c.hits || [])[0];
    s += ` — criterion “${c.rule}” fired at iteration ${c.iteration}`;
    if (hit && hit.observed != null) s += ` (observed ${fmtN(hit.observed)}, threshold ${fmtN(hit.threshold)})`;
  }
  if (p.detail) s += `. ${p.detail}`;
  return s;
}
function renderControls(p) {
  const svc = S.mode === "service" && p.links && p.links.process;
  const ended = ENDED.has(p.status);
  $("#controls").hidden = !svc;
  $("#term-form").hidden = !svc || ended;
  if (svc) {
    $("#b-suspend").disabled = ended || p.suspended;
    $("#b-resume").disabled = ended || !p.suspended;
    $("#b-cancel").disabled = ended;
    const neg = p.negotiation || {};
    const proposed = !ended && neg.state === "PROPOSED";
    $("#b-accept").hidden = !proposed;
    $("#term-legend").textContent = proposed ? `The producer proposes ${JSON.stringify(neg.proposal)}: modify it`
      : "Change termination parameters";
  }
  $("#b-report").hidden = !(p.links && p.links.report);
  $("#b-model").hidden = !(p.links && p.links.model);
}
function renderCriteria(p) {
  const tb = $("#criteria tbody"); tb.replaceChildren();
  for (const c of p.criteria || []) {
    const pct = c.closeness == null ? null : Math.round(c.closeness * 100);
    const unit = c.unit ? ` ${c.unit}` : "";
    tb.append(el("tr", {}, el("td", { text: c.name }), el("td", { class: "num", text: c.observed == null ? "–" : fmtN(c.observed) + unit }),
      el("td", { class: "num", text: fmtN(c.target) + unit }),
      el("td", {}, el("span", { class: "bar", "aria-hidden": "true" }, el("i", { style: `width:${pct || 0}%` })),
        pct == null ? "–" : `${pct} %`)));
  }
  if (!(p.criteria || []).length) tb.append(el("tr", {}, el("td", { colspan: "4", class: "muted", text: "none that can be measured" })));
}
function renderClients(p) {
  const list = p.clients || [];
  $("#clients-sec").hidden = !list.length && !(p.participating || []).length;
  const tb = $("#clients tbody"); tb.replaceChildren();
  if (!list.length) {
    tb.append(el("tr", {}, el("td", { colspan: "9", class: "muted",
      text: `taking part now: ${(p.participating || []).join(", ")} (details when the process ends)` })));
    return;
  }
  for (const c of list) {
    const loss = (c.performance || {}).train_loss;
    const tr = el("tr", { "data-client": c.id }, el("td", { text: String(c.id) }), el("td", { class: "num", text: String(c.rounds ?? "–") }),
      el("td", { class: "num", text: c.first_round != null ? `${c.first_round}–${c.last_round}` : "–" }),
      el("td", { class: "num", text: String(c.samples ?? "–") }), el("td", { class: "num", text: fmtS(c.training_s) }),
      el("td", { class: "num", text: fmtN(loss) }), el("td", { class: "num", text: String(c.dropped ?? 0) }),
      el("td", { class: "num", text: String(c.resynced ?? 0) }), el("td", { text: c.active === false ? "gone" : "active" }));
    if (c.dropped) tr.classList.add("dropped");
    if (c.resynced) tr.classList.add("resynced");
    tb.append(tr);
  }
}

/* ---------------------------------------------------------------- actions */
function current() { return S.procs.get(S.selected); }
function bindActions() {
  $("#b-suspend").addEventListener("click", () => patch(current().links.process, { attributes: { suspendProcess: true } }, "suspend"));
  $("#b-resume").addEventListener("click", () => patch(current().links.process, { attributes: { suspendProcess: false } }, "resume"));
  $("#b-cancel").addEventListener("click", () => patch(current().links.process, { attributes: { cancelProcess: true } }, "cancel"));
  $("#b-accept").addEventListener("click", () => patch(current().links.process,
    { VsDataContainer: [{ id: "sluice-negotiation", attributes: { vsData: { accept: true } } }] }, "accept"));
  $("#term-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const p = current(), t = {};
    const n = $("#t-iter").value, s = $("#t-time").value, m = $("#t-metric").value.trim(), v = $("#t-target").value;
    if (n) t.iterations = parseInt(n, 10);
    if (s) t.training_time_s = parseFloat(s);
    if (m && v) t.performance = { [m]: parseFloat(v) };
    if (!Object.keys(t).length) { $("#ctl-msg").textContent = "nothing to send"; return; }
    const neg = p.negotiation || {};
    const proposed = neg.state === "PROPOSED";
    const uri = proposed || !p.links.request ? p.links.process : p.links.request;
    patch(uri, { VsDataContainer: [{ id: "sluice-termination", attributes: { vsData: t } }] }, "termination parameters");
  });
  $("#b-report").addEventListener("click", async () => {
    const pre = $("#report");
    const r = await fetch(current().links.report, { headers: headers() });
    pre.textContent = JSON.stringify(await r.json(), null, 2);
    pre.hidden = false;
  });
  $("#b-model").addEventListener("click", async () => {
    const p = current();
    const r = await fetch(p.links.model, { headers: headers({ Accept: "application/octet-stream" }) });
    if (!r.ok) { $("#ctl-msg").textContent = `model download refused (${r.status})`; return; }
    const a = el("a", { href: URL.createObjectURL(await r.blob()), download: `${p.model_id || p.id}.pt` });
    document.body.append(a); a.click(); a.remove();
  });
  $("#cmp-metric").addEventListener("change", () => schedule(true));
  $("#cmp-x").addEventListener("change", () => schedule(true));
  $("#login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    S.token = $("#token").value.trim();
    sessionStorage.setItem("sluice-token", S.token);
    $("#login").hidden = true;
    start();
  });
  $("#logout").addEventListener("click", () => { sessionStorage.removeItem("sluice-token"); location.reload(); });
  new ResizeObserver(() => {
    for (const [id, c] of Object.entries(S.charts)) {
      const w = $(`#${id}`).clientWidth;
      if (w && Math.abs(w - c.u.width) > 4) c.u.setSize({ width: w, height: c.u.height });
    }
  }).observe($("main"));
}
function showLogin(msg) {
  setConn("connecting", "signed out");
  $("#login").hidden = false;
  $("#login-error").textContent = msg || "";
  $("#token").focus();
}
let started = false;
function start() {
  $("#logout").hidden = !S.auth;
  if (S.auth && !S.token) { showLogin(""); return; }
  if (!started) { started = true; stream().finally(() => { started = false; }); }
}
async function boot() {
  bindActions();
  for (;;) {
    try {
      const info = await (await fetch("/dashboard/api/info", { cache: "no-store" })).json();
      Object.assign(S, { mode: info.mode, base: info.base, auth: info.auth });
      break;
    } catch (e) { setConn("reconnecting", "reconnecting…"); await sleep(1000); }
  }
  $("#mode").textContent = S.mode === "service" ? "— training service" : "— run directories";
  start();
}
boot();
