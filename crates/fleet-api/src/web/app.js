// The web view: rows of machines and units kept in maps, fed by /ui/events (server-sent
// events: a whole view first, then only the rows that change; and the cluster's latest events,
// then each as it is stored), drawn as virtual lists so that only the rows on screen exist in
// the page, whatever the size of the cluster.
"use strict";

const units = new Map();
const machines = new Map();
let patchesApplied = 0;
// The cluster's events by index; the newest KEPT_EVENTS are kept.
const happenings = new Map();
const KEPT_EVENTS = 200;

function short(id) {
  return id && id.length > 12 ? id.slice(0, 8) + "…" : id || "";
}

function globToRegExp(text) {
  const escaped = text.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
  return new RegExp(text.includes("*") || text.includes("?") ? "^" + escaped + "$" : escaped, "i");
}

// A list that draws only the rows in view.
class VirtualList {
  constructor(element, gridClass, draw) {
    this.element = element;
    this.draw = draw;
    this.gridClass = gridClass;
    this.items = [];
    this.spacer = document.createElement("div");
    this.rows = document.createElement("div");
    this.rows.className = "rows";
    element.append(this.spacer, this.rows);
    this.rowHeight = 24;
    element.addEventListener("scroll", () => this.render());
  }
  setItems(items) {
    this.items = items;
    this.spacer.style.height = items.length * this.rowHeight + "px";
    this.render();
  }
  render() {
    const first = Math.max(0, Math.floor(this.element.scrollTop / this.rowHeight) - 10);
    const count = Math.ceil(this.element.clientHeight / this.rowHeight) + 20;
    const shown = this.items.slice(first, first + count);
    this.rows.style.top = first * this.rowHeight + "px";
    const rows = shown.map((item) => {
      const row = document.createElement("div");
      row.className = "row " + this.gridClass;
      for (const [text, cls, title] of this.draw(item)) {
        const cell = document.createElement("span");
        cell.textContent = text;
        if (cls) cell.className = cls;
        if (title) cell.title = title;
        row.append(cell);
      }
      return row;
    });
    this.rows.replaceChildren(...rows);
  }
}

// Bytes as people read them (one decimal, rounded down), and thousandths of a core as cores.
function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let unit = 0;
  while (n >= 1024 && unit + 1 < units.length) { n /= 1024; unit += 1; }
  return (unit === 0 || Number.isInteger(n) ? String(n) : (Math.floor(n * 10) / 10).toFixed(1)) + " " + units[unit];
}
function cores(millis) { return String(millis / 1000); }

// What units reserve on the machine against what it offers: "1.5 GiB/4 GiB, 0.5/2 CPU".
function fill(m) {
  const r = m.reserved;
  if (!m.capacity) return r.memory || r.cpuMillis ? bytes(r.memory) + ", " + cores(r.cpuMillis) + " CPU" : "-";
  const c = m.capacity;
  return bytes(r.memory) + "/" + bytes(c.memory) + ", " + cores(r.cpuMillis) + "/" + cores(c.cpuMillis) + " CPU";
}
function overCapacity(m) {
  return !!m.capacity && (m.reserved.memory > m.capacity.memory || m.reserved.cpuMillis > m.capacity.cpuMillis);
}

// A drained machine: "drained", or how many of its units are moving and left to go.
function drainCell(m) {
  if (!m.drain) return ["-"];
  if (m.drain.state === "drained") return ["drained", null, "takes no new units"];
  const held = m.drain.held ? " (held by a disruption budget)" : "";
  return ["draining: " + m.drain.moving + " moving, " + m.drain.left + " left" + held, "waiting", "takes no new units"];
}

const machineList = new VirtualList(document.getElementById("machines"), "machines-grid", (m) => [
  m.outOfTouchSince
    ? [short(m.id) + " (out of touch)", "failed", m.id + ": out of touch since " + m.outOfTouchSince + ", units wait for it"]
    : [short(m.id), null, m.id],
  [m.ip || "-"],
  [String(m.units)],
  [fill(m), overCapacity(m) ? "failed" : null, overCapacity(m) ? "over capacity" : ""],
  drainCell(m),
  (m.taints || []).length ? [m.taints.join(","), null, "takes only the units that tolerate these (Tolerate=)"] : ["-"],
  [m.version || "-", null, "the version of fleet its fleetd runs"],
  [Object.entries(m.metadata).map(([k, v]) => k + "=" + v).join(",") || "-"],
]);

function unitClass(u) {
  if (u.health && u.health.startsWith("unhealthy")) return "failed";
  if (u.active === "active") return "active";
  if (u.active === "failed") return "failed";
  if (isWaiting(u)) return "waiting";
  return null;
}

const unitList = new VirtualList(document.getElementById("units"), "units-grid", (u) => {
  const machine = u.global ? "global (" + u.machines + ")" : u.machine ? short(u.machine) : "-";
  const ip = u.machine && machines.get(u.machine) ? machines.get(u.machine).ip : "";
  return [
    nameCell(u),
    [u.desired],
    [u.current || "-"],
    [ip ? machine + "/" + ip : machine, null, u.machine || ""],
    [u.active ? u.active + "/" + u.sub : "-", unitClass(u)],
    [u.health || "-", healthClass(u), u.health || ""],
    [u.runs || "-", runsClass(u), u.runs || ""],
    [String(u.priority)],
    [u.budget || "-"],
    [u.requires || "-"],
    [(u.terms || []).join("; ") || "-", null, (u.terms || []).join("\n")],
    [u.version, null, u.version],
    [u.reason || "", isWaiting(u) ? "waiting" : "note", u.reason || ""],
  ];
});

// A unit's name, marked when its file has something nothing knows or that is ignored (the
// warnings fleetctl gives at submission and in status), which its title lists.
function nameCell(u) {
  const warnings = u.warnings || [];
  if (!warnings.length) return [u.name, unitClass(u), u.name];
  return [u.name + " ⚠", unitClass(u) || "waiting", u.name + ":\n" + warnings.join("\n")];
}

// Waiting for a machine: asked to be somewhere and placed nowhere. A placed unit may carry a
// reason too (spread unevenly, kept on a drained machine): a note, not a wait.
function isWaiting(u) {
  if (u.desired === "inactive") return false;
  // A unit on a calendar or a batch unit is placed only for a run: between runs it waits for
  // nothing (its runs column says what comes next), unless the engine said why it cannot run.
  if (u.runs && !u.reason) return false;
  return u.global ? u.machines === 0 : !u.machine;
}

function runsClass(u) {
  if (!u.runs) return null;
  return u.runs.startsWith("last: failed") || u.runs.startsWith("last: lost") ? "failed"
    : u.runs.startsWith("last: running") ? "active" : null;
}

function healthClass(u) {
  if (!u.health) return null;
  return u.health.startsWith("unhealthy") ? "failed" : u.health.startsWith("healthy") ? "active" : null;
}

function unitShown(u, pattern, state) {
  if (pattern && !pattern.test(u.name)) return false;
  switch (state) {
    case "active": return u.active === "active";
    case "failed": return u.active === "failed";
    case "unhealthy": return !!u.health && u.health.startsWith("unhealthy");
    case "unplaced": return isWaiting(u);
    case "inactive": return u.active !== "active";
    case "warnings": return !!(u.warnings && u.warnings.length);
    default: return true;
  }
}

let drawPending = false;
function redraw() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => {
    drawPending = false;
    const unitText = document.getElementById("unit-filter").value.trim();
    const machineText = document.getElementById("machine-filter").value.trim().toLowerCase();
    const state = document.getElementById("unit-state").value;
    const pattern = unitText ? globToRegExp(unitText) : null;
    const allUnits = [...units.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    const shownUnits = allUnits.filter((u) => unitShown(u, pattern, state));
    const allMachines = [...machines.values()].sort((a, b) => (a.id < b.id ? -1 : 1));
    const shownMachines = machineText
      ? allMachines.filter((m) => (m.id + " " + m.ip + " " + JSON.stringify(m.metadata)).toLowerCase().includes(machineText))
      : allMachines;
    unitList.setItems(shownUnits);
    machineList.setItems(shownMachines);
    const active = allUnits.filter((u) => u.active === "active").length;
    const unplaced = allUnits.filter((u) => unitShown(u, null, "unplaced")).length;
    document.getElementById("unit-count").textContent = "(" + shownUnits.length + " of " + allUnits.length + ")";
    document.getElementById("machine-count").textContent = "(" + shownMachines.length + " of " + allMachines.length + ")";
    document.getElementById("summary").textContent =
      allMachines.length + " machines, " + allUnits.length + " units: " + active + " active, " + unplaced + " waiting for a machine";
    document.body.dataset.units = String(allUnits.length);
    document.body.dataset.patches = String(patchesApplied);
  });
}

// An event's units: its unit, or of several the first and how many more.
function eventUnits(e) {
  if (e.unit) return e.unit;
  const all = e.units || [];
  return all.length ? all[0] + (all.length > 1 ? " (+" + (all.length - 1) + ")" : "") : "-";
}

function eventClass(e) {
  if (e.kind === "machine-lost" || e.kind === "machine-revoked") return "failed";
  if (e.kind === "waiting" || e.kind === "unplaced") return "waiting";
  if (/^(failed|unhealthy)/.test(e.message)) return "failed";
  return null;
}

const eventList = new VirtualList(document.getElementById("events"), "events-grid", (e) => {
  const message = e.message + (e.by ? " (by " + e.by + ")" : "");
  return [
    [e.time.replace("T", " ").replace("Z", ""), null, e.time],
    [e.kind, eventClass(e)],
    [eventUnits(e), null, (e.units || []).join(", ")],
    [e.machineID ? short(e.machineID) : "-", null, e.machineID || ""],
    [message, eventClass(e), message],
  ];
});

function drawEvents() {
  const text = document.getElementById("event-filter").value.trim().toLowerCase();
  const newestFirst = [...happenings.values()].sort((a, b) => b.index - a.index);
  const shown = text
    ? newestFirst.filter((e) =>
        [e.kind, e.unit || "", (e.units || []).join(" "), e.machineID || "", e.message, e.by || ""]
          .join(" ").toLowerCase().includes(text))
    : newestFirst;
  eventList.setItems(shown);
  document.getElementById("event-count").textContent = "(" + shown.length + " of the latest " + newestFirst.length + ")";
  document.body.dataset.events = String(newestFirst.length);
}

// Events are drawn on the next frame, as units are: a burst of them is drawn once, and never
// ahead of a unit's row.
let eventsDrawPending = false;
function happened(events) {
  for (const e of events) happenings.set(e.index, e);
  if (happenings.size > KEPT_EVENTS) {
    const oldest = [...happenings.keys()].sort((a, b) => a - b).slice(0, happenings.size - KEPT_EVENTS);
    for (const index of oldest) happenings.delete(index);
  }
  if (eventsDrawPending) return;
  eventsDrawPending = true;
  requestAnimationFrame(() => {
    eventsDrawPending = false;
    drawEvents();
  });
}

function apply(patch) {
  if (patch.reset) {
    units.clear();
    machines.clear();
  }
  for (const m of patch.machines) machines.set(m.id, m);
  for (const id of patch.machinesGone) machines.delete(id);
  for (const u of patch.units) units.set(u.name, u);
  for (const name of patch.unitsGone) units.delete(name);
  patchesApplied += 1;
  redraw();
}

function connect() {
  const status = document.getElementById("connection");
  const feed = new EventSource("events");
  feed.addEventListener("open", () => {
    status.dataset.state = "live";
    status.textContent = "live";
  });
  feed.addEventListener("patch", (message) => apply(JSON.parse(message.data)));
  feed.addEventListener("happened", (message) => happened(JSON.parse(message.data)));
  feed.addEventListener("error", () => {
    // EventSource reconnects by itself; the first message after it is a whole view.
    status.dataset.state = "lost";
    status.textContent = "reconnecting…";
  });
}

for (const id of ["unit-filter", "machine-filter", "unit-state"]) {
  document.getElementById(id).addEventListener("input", redraw);
}
document.getElementById("event-filter").addEventListener("input", drawEvents);
connect();
