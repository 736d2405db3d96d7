/* Sluice dashboard: the curves of one process and the comparison of runs, drawn with uPlot. Loaded before
   dashboard.js, whose state (S) and helpers ($, el) these functions use when called. */
"use strict";
const COLORS = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#4e342e",
  "#283593", "#9e9d24", "#00695c", "#5d4037", "#7b1fa2", "#0277bd", "#d84315", "#558b2f", "#37474f", "#f9a825",
  "#8e24aa", "#3949ab"];
const RESERVED = new Set(["iteration", "cum_bytes_up", "cum_bytes_down", "seconds", "participants", "dropped"]);
function metricKeys(pts) {
  const keys = new Set();
  for (const p of pts) for (const k of Object.keys(p)) if (!RESERVED.has(k) && !/^idle_.*_s$/.test(k)) keys.add(k);
  return [...keys].sort();
}
function chart(id, x, series, data, opts = {}) {
  const box = $(`#${id}`);
  const sig = JSON.stringify([x, series.map((s) => s.label)]);
  let c = S.charts[id];
  box.dataset.points = data[0].length;
  if (c && c.sig === sig && !S.rebuild) { c.u.setData(data); return; }
  if (c) c.u.destroy();
  const width = Math.max(260, box.clientWidth || 500);
  const hasLoss = series.some((s) => s.scale === "loss");
  const u = new uPlot({
    width, height: opts.height || 240, legend: { live: false },
    scales: { x: { time: false } },
    axes: [{ label: x, size: 40 }, { label: opts.y || "", size: 56 }]
      .concat(hasLoss ? [{ scale: "loss", side: 1, label: "loss", grid: { show: false }, size: 56 }] : []),
    series: [{ label: x }, ...series.map((s, i) => ({ label: s.label, stroke: COLORS[i % COLORS.length],
      width: 1.5, scale: s.scale || "y", spanGaps: true, points: { show: false } }))],
  }, data, box);
  S.charts[id] = { u, sig };
}
function renderCharts(p) {
  const pts = S.points.get(p.id) || [];
  const drawn = `${p.id}:${pts.length}:${pts.length ? pts[pts.length - 1].iteration : ""}`;
  if (drawn === S.drawn && !S.rebuild) return;
  S.drawn = drawn;
  const keys = metricKeys(pts);
  const it = pts.map((q) => q.iteration);
  const [div, unit] = byteUnit(pts.length ? wire(pts[pts.length - 1]) : 0);
  const mb = pts.map((q) => wire(q) / div);
  $("#c-mb-cap").textContent = `Metrics against cumulative ${unit} on the wire (up + down)`;
  $("#c-cum-cap").textContent = `Cumulative ${unit} up and down`;
  const ser = keys.map((k) => ({ label: k, scale: /loss|error/.test(k) ? "loss" : "y" }));
  const cols = keys.map((k) => pts.map((q) => (k in q ? q[k] : null)));
  chart("c-metrics", "iteration", ser, [it, ...cols], { y: "score" });
  chart("c-mb", unit, ser, [mb, ...cols], { y: "score" });
  chart("c-cum", "iteration", [{ label: `up (${unit})` }, { label: `down (${unit})` }],
    [it, pts.map((q) => (q.cum_bytes_up || 0) / div), pts.map((q) => (q.cum_bytes_down || 0) / div)], { y: unit });
  const per = (key) => pts.map((q, i) => {
    const prev = i ? pts[i - 1] : { iteration: 0, [key]: 0 };
    const d = q.iteration - prev.iteration;
    return d > 0 ? ((q[key] || 0) - (prev[key] || 0)) / d / 1e3 : null;
  });
  chart("c-bytes", "iteration", [{ label: "up (kB/it.)" }, { label: "down (kB/it.)" }],
    [it, per("cum_bytes_up"), per("cum_bytes_down")], { y: "kB" });
  const idle = [...new Set(pts.flatMap((q) => Object.keys(q).filter((k) => /^idle_.*_s$/.test(k))))].sort();
  const fig = $("#f-party");
  if (pts.some((q) => "participants" in q)) {
    fig.hidden = false;
    $("#c-party-cap").textContent = "Participants and dropped per round";
    chart("c-party", "round", [{ label: "participants" }, { label: "dropped" }],
      [it, pts.map((q) => q.participants ?? null), pts.map((q) => q.dropped ?? null)], { y: "clients" });
  } else if (idle.length) {
    fig.hidden = false;
    $("#c-party-cap").textContent = "Idle time per party (s per step)";
    chart("c-party", "step", idle.map((k) => ({ label: k.slice(5, -2) + " (s)" })), [it, ...idle.map((k) => pts.map((q) => q[k] ?? null))], { y: "s" });
  } else fig.hidden = true;
}
function renderCompare() {
  const ids = [...S.compare].filter((id) => S.points.has(id));
  if (ids.length < S.compare.size) return;  // drawn once every ticked run is loaded
  const sel = $("#cmp-metric");
  const keys = [...new Set(ids.flatMap((id) => metricKeys(S.points.get(id))))].sort();
  const cur = sel.value || keys.find((k) => /accuracy/.test(k)) || keys[0];
  if (sel.options.length !== keys.length) sel.replaceChildren(...keys.map((k) => el("option", { value: k, text: k })));
  if (cur) sel.value = cur;
  const xKey = $("#cmp-x").value;
  const drawn = JSON.stringify([xKey, sel.value, ids.map((id) => S.points.get(id).length)]);
  if (drawn === S.cmpDrawn && !S.rebuild) return;
  S.cmpDrawn = drawn;
  const [div, unit] = byteUnit(Math.max(0, ...ids.map((id) => {
    const pts = S.points.get(id);
    return pts.length ? wire(pts[pts.length - 1]) : 0;
  })));
  const tables = ids.map((id) => {
    const pts = S.points.get(id).filter((q) => sel.value in q);
    const xs = pts.map((q) => xKey === "mb" ? wire(q) / div : q.iteration);
    return [xs, pts.map((q) => q[sel.value])];
  });
  if (!tables.length) return;
  const data = uPlot.join(tables);
  $("#cmp-chart").dataset.series = ids.length;
  chart("cmp-chart", xKey === "mb" ? unit : "iteration", ids.map((id) => ({ label: id })), data, { y: sel.value, height: 300 });
}

function byteUnit(maxBytes) {
  /* the unit a chart of byte counts up to maxBytes reads best in */
  return maxBytes >= 1e6 ? [1e6, "MB"] : maxBytes >= 1e3 ? [1e3, "kB"] : [1, "B"];
}
const wire = (q) => (q.cum_bytes_up || 0) + (q.cum_bytes_down || 0);
