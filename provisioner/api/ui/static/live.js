// Live updates for the fleet and node pages: one EventSource on /api/v1/events (the session
// cookie authenticates it). Untrusted text only ever goes through textContent (never an
// HTML sink); elements are found by attribute value with CSS.escape.
const page = document.body.dataset.page;
const indicator = document.getElementById("live");

function setLive(on) {
  if (indicator) indicator.dataset.live = on ? "on" : "off";
}

function swapState(element, state) {
  for (const cls of [...element.classList]) {
    if (cls.startsWith("s-")) element.classList.remove(cls);
  }
  element.classList.add("s-" + state);
  element.dataset.state = state;
}

function bumpCount(label, delta) {
  const el = document.querySelector(`[data-count="${CSS.escape(label)}"] b`);
  if (el) el.textContent = String(Math.max(0, Number(el.textContent) + delta));
}

function onFleet(ev) {
  const name = ev.hostname || ev.id;
  const selector = `[data-hostname="${CSS.escape(name)}"]`;
  for (const el of document.querySelectorAll(selector)) {
    const was = el.dataset.state;
    if (was !== ev.state) swapState(el, ev.state);
    el.classList.toggle("m", ev.maintenance);
    el.classList.toggle("vf", ev.state === "validate_failed");
    const cell = el.querySelector(".state");
    if (cell) cell.textContent = ev.state;
    const err = el.querySelector(".err");
    if (err) err.textContent = ev.last_error;
    if (el.classList.contains("cell")) {
      el.title = `${name}: ${ev.state}${ev.maintenance ? " (maintenance)" : ""}`;
      if (was !== ev.state) { bumpCount(was, -1); bumpCount(ev.state, +1); }
      if (ev.event === "maintenance_on") bumpCount("maintenance", +1);
      if (ev.event === "maintenance_off") bumpCount("maintenance", -1);
    }
  }
}

async function refreshHistory(nodeId) {
  const response = await fetch(`/api/v1/nodes/${encodeURIComponent(nodeId)}/history`,
                               { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!response.ok) return;
  const body = await response.json();
  const list = document.getElementById("history");
  if (!list) return;
  const items = body.items.slice().reverse().map((h) => {
    const li = document.createElement("li");
    li.dataset.seq = String(h.seq);
    li.dataset.event = h.event;
    const time = document.createElement("time");
    time.textContent = h.at.replace("T", " ").slice(0, 19);
    const what = document.createElement("b");
    what.textContent = h.event;
    const actor = document.createElement("span");
    actor.className = "actor";
    actor.textContent = `by ${h.actor}`;
    li.append(time, " ", what, ` ${h.from_state} \u2192 ${h.to_state} `, actor);
    if (h.reason) {
      const reason = document.createElement("div");
      reason.className = "reason";
      reason.textContent = h.reason;
      li.append(reason);
    }
    return li;
  });
  list.replaceChildren(...items);
}

function onNode(ev) {
  const body = document.body;
  if (ev.id !== body.dataset.nodeId) return;
  const badge = document.getElementById("state");
  if (badge) { swapState(badge, ev.state); badge.textContent = ev.state; }
  body.dataset.state = ev.state;
  const held = document.getElementById("maintenance");
  if (held) held.hidden = !ev.maintenance;
  const reason = document.getElementById("maintenance-reason");
  if (reason) reason.textContent = ev.maintenance ? `on: ${ev.maintenance_reason}` : "off";
  const err = document.getElementById("last-error");
  if (err) err.textContent = ev.last_error;
  const stale = document.getElementById("stale");
  if (stale) stale.hidden = false;
  refreshHistory(ev.id);
}

function connect() {
  const source = new EventSource("/api/v1/events");
  source.addEventListener("open", () => setLive(true));
  source.addEventListener("error", () => setLive(false));
  source.addEventListener("dropped", () => { setLive(false); source.close(); setTimeout(connect, 2000); });
  source.addEventListener("transition", (message) => {
    let ev;
    try { ev = JSON.parse(message.data); } catch { return; }
    if (page === "fleet") onFleet(ev);
    if (page === "node") onNode(ev);
  });
}

if (page === "fleet" || page === "node") connect();
