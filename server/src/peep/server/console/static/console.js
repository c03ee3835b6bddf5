// PEEP console: the little JavaScript it has (served from 'self'; the CSP allows no inline script).
// Live: prepends recognitions from /live/events (server-sent events) on the newest page, counts new alerts.
// Models: polls /models/status while a training runs. Text is set with textContent only, never as HTML.
"use strict";

function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = text;
  row.appendChild(td);
  return td;
}

function liveFeed() {
  const table = document.getElementById("events");
  if (!table || table.dataset.live !== "yes") return;  // an older page or a filter the stream cannot follow
  const state = document.getElementById("live-state");
  const params = new URLSearchParams();
  params.set("after", table.dataset.after || "0");
  if (table.dataset.site) params.set("site", table.dataset.site);
  if (table.dataset.device) params.set("device", table.dataset.device);
  const source = new EventSource("/live/events?" + params.toString());
  source.onopen = () => { state.textContent = "live"; };
  source.onerror = () => { state.textContent = "reconnecting…"; };
  source.onmessage = (msg) => {
    const e = JSON.parse(msg.data);
    const tbody = table.tBodies[0];
    for (const empty of tbody.querySelectorAll("tr.none")) empty.remove();
    const row = document.createElement("tr");
    row.className = e.unknown ? "unknown" : "known";
    row.dataset.seq = String(e.seq);
    const when = document.createElement("time");
    when.textContent = e.time_text;
    cell(row, "").appendChild(when);
    cell(row, e.site);
    cell(row, e.device_id);
    cell(row, e.track_id).className = "track";
    // A door's verification (its releases' track ids start with "door-").
    const door = e.purpose === "verify" && String(e.track_id || "").startsWith("door-");
    cell(row, e.requested_by ? "verify (door, asked from afar)" : door ? "verify (door claim)" : e.purpose);
    let subject = e.unknown ? "unknown" : e.subject;
    if (e.requested_by) subject = "opened at " + e.requested_by.replace("_", " ") + "'s request";
    else if (e.accepted !== null && !e.unknown) subject += e.accepted ? " (accepted)" : " (refused)";
    cell(row, subject).className = "subject";
    cell(row, e.probability.toFixed(3));
    cell(row, e.model_version);
    tbody.insertBefore(row, tbody.firstChild);
    while (tbody.rows.length > 50) tbody.deleteRow(tbody.rows.length - 1);
    const n = document.getElementById("events-count");
    if (n) n.textContent = String(Number(n.textContent) + 1);
    if (e.unknown) newAlert();
  };
}

// A new unknown face: counted at once; it joins its device's group at the next load of the page.
function newAlert() {
  const count = document.getElementById("alert-count");
  if (count) count.textContent = String(Number(count.textContent) + 1);
  const note = document.getElementById("alert-new");
  if (note) {
    const n = Number(note.dataset.n || "0") + 1;
    note.dataset.n = String(n);
    note.textContent = n + " new since this page loaded (reload to see them grouped)";
  }
}

function trainingProgress() {
  const box = document.getElementById("training");
  if (!box) return;
  const bar = document.getElementById("train-progress");
  const state = document.getElementById("train-state");
  let wasTraining = box.dataset.training === "yes";
  const poll = () => {
    fetch("/models/status", { credentials: "same-origin" })
      .then((r) => (r.ok ? r.json() : null))
      .then((s) => {
        if (!s) return;
        bar.value = s.progress;
        bar.hidden = !s.training;  // a full bar beside "idle" read as a run stuck at its end
        state.textContent = s.training ? "running" : (s.last_error ? "failed: " + s.last_error : "idle");
        if (wasTraining && !s.training) { window.location.reload(); return; }
        wasTraining = s.training;
        setTimeout(poll, s.training ? 1000 : 5000);
      })
      .catch(() => setTimeout(poll, 5000));
  };
  setTimeout(poll, 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  liveFeed();
  trainingProgress();
});
