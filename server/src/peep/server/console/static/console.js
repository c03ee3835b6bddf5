// PEEP console: the little JavaScript it has (served from 'self'; the CSP allows no inline script).
// Live: appends recognitions from /live/events (server-sent events) and unknown-face alerts.
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
  if (!table) return;
  const state = document.getElementById("live-state");
  const alerts = document.getElementById("alerts");
  const canAck = alerts && alerts.dataset.canAck === "yes";
  const csrf = table.dataset.csrf;
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
    const row = document.createElement("tr");
    row.className = e.unknown ? "unknown" : "known";
    row.dataset.seq = String(e.seq);
    cell(row, e.time_text);
    cell(row, e.site);
    cell(row, e.device_id);
    cell(row, e.track_id);
    cell(row, e.purpose);
    let subject = e.unknown ? "unknown" : e.subject;
    if (e.accepted !== null && !e.unknown) subject += e.accepted ? " (accepted)" : " (refused)";
    cell(row, subject).className = "subject";
    cell(row, e.probability.toFixed(3));
    cell(row, e.model_version);
    tbody.insertBefore(row, tbody.firstChild);
    while (tbody.rows.length > 200) tbody.deleteRow(tbody.rows.length - 1);
    if (e.unknown && alerts) addAlert(alerts, e, canAck, csrf);
  };
}

function addAlert(alerts, e, canAck, csrf) {
  const row = document.createElement("tr");
  row.dataset.event = e.event_id;
  cell(row, e.time_text);
  cell(row, e.site);
  cell(row, e.device_id);
  cell(row, e.probability.toFixed(3));
  cell(row, e.model_version);
  const td = document.createElement("td");
  if (canAck) {
    const form = document.createElement("form");
    form.method = "post";
    form.action = "/alerts/ack";
    for (const [name, value] of [["csrf", csrf], ["event_id", e.event_id], ["back", "/live"]]) {
      const input = document.createElement("input");
      input.type = "hidden";
      input.name = name;
      input.value = value;
      form.appendChild(input);
    }
    const button = document.createElement("button");
    button.type = "submit";
    button.className = "ack";
    button.textContent = "Acknowledge";
    form.appendChild(button);
    td.appendChild(form);
  }
  row.appendChild(td);
  const tbody = alerts.tBodies[0];
  tbody.insertBefore(row, tbody.firstChild);
  const count = document.getElementById("alert-count");
  if (count) count.textContent = String(tbody.rows.length);
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
