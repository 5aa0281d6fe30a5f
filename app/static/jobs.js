// The jobs panel: upload an image as a job, watch its progress (polling), cancel it, download its labels.
"use strict";

const POLL_MS = 1000;
let pollTimer = null;

function jobError(message) {
  $("job-error").textContent = message;
  $("job-error").hidden = !message;
}

function formatEta(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 90) return `, ${Math.ceil(seconds)} s left`;
  return `, ${Math.ceil(seconds / 60)} min left`;
}

function progressText(job) {
  const p = job.progress;
  if (!p.blocks_total) return job.state === "queued" ? "waiting" : "";
  const rate = p.pixels_per_second ? `, ${Math.round(p.pixels_per_second).toLocaleString("en")} px/s` : "";
  return `${p.blocks_done}/${p.blocks_total} blocks${rate}${formatEta(p.eta_seconds)}`;
}

// A result behind the API key: fetched, then saved from memory (a plain link cannot send the key).
async function download(url, name) {
  const response = await fetch(url, { headers: authHeaders() });
  if (!response.ok) {
    jobError(`Cannot download ${name}: ${await errorText(response)}`);
    return;
  }
  const link = document.createElement("a");
  link.href = URL.createObjectURL(await response.blob());
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
}

function button(text, onClick) {
  const element = document.createElement("button");
  element.type = "button";
  element.textContent = text;
  element.addEventListener("click", onClick);
  return element;
}

async function removeJob(job) {
  const response = await fetch(`/v1/jobs/${job.id}`, { method: "DELETE", headers: authHeaders() });
  if (!response.ok) jobError(`Cannot ${job.state === "running" || job.state === "queued" ? "cancel" : "delete"} the job: ${await errorText(response)}`);
  refreshJobs();
}

function renderJobs(jobs) {
  const body = $("job-table").querySelector("tbody");
  body.innerHTML = "";
  $("no-jobs").hidden = jobs.length > 0;
  for (const job of jobs) {
    const row = body.insertRow();
    row.dataset.job = job.id;
    row.insertCell().textContent = job.input;
    row.insertCell().textContent = job.model;
    const state = row.insertCell();
    state.className = "state";
    state.textContent = job.state + (job.cancel_requested && job.state === "running" ? " (cancelling)" : "");
    if (job.error) state.title = job.error;
    const progress = row.insertCell();
    const bar = document.createElement("progress");
    bar.max = Math.max(job.progress.blocks_total, 1);
    bar.value = job.progress.blocks_done;
    progress.append(bar, ` ${progressText(job)}`);
    if (job.error) progress.append(` — ${job.error}`);
    const actions = row.insertCell();
    if (job.state === "queued" || job.state === "running") {
      actions.append(button("Cancel", () => removeJob(job)));
    } else {
      const stem = job.input.replace(/^.*\//, "").replace(/\.[^.]*$/, "");
      if (job.results.png) actions.append(button("Download PNG", () => download(job.results.png, `${stem}-labels.png`)));
      if (job.results.zarr && !job.results.png) {
        const link = document.createElement("code");
        link.textContent = new URL(job.results.zarr, location.href).href;
        link.title = "a zarr store: open it with zarr over HTTP";
        actions.append(link, " ");
      }
      actions.append(button("Delete", () => removeJob(job)));
    }
  }
}

async function refreshJobs() {
  clearTimeout(pollTimer);
  let response;
  try {
    response = await fetch("/v1/jobs", { headers: authHeaders() });
  } catch (err) {
    jobError(`Cannot reach the server: ${err.message}`);
    pollTimer = setTimeout(refreshJobs, 5 * POLL_MS);
    return;
  }
  if (!response.ok) {
    jobError(`Cannot list the jobs: ${await errorText(response)}`);
    return; // a missing or wrong key: typing one lists them again
  }
  const { jobs } = await response.json();
  renderJobs(jobs);
  const busy = jobs.some((job) => job.state === "queued" || job.state === "running");
  pollTimer = setTimeout(refreshJobs, busy ? POLL_MS : 5 * POLL_MS);
}

async function submitJob(file) {
  jobError("");
  const name = $("model").value;
  if (!name || !models[name]) {
    jobError("No model is loaded yet; wait a moment and try again.");
    return;
  }
  const form = new FormData();
  form.append("image", file, file.name);
  let response;
  try {
    response = await fetch(`/v1/jobs?model=${encodeURIComponent(name)}`, {
      method: "POST", headers: authHeaders(), body: form,
    });
  } catch (err) {
    jobError(`The upload failed: ${err.message}`);
    return;
  }
  if (!response.ok) jobError(`Could not start a job for ${file.name}: ${await errorText(response)}`);
  refreshJobs();
}

function setUpJobs() {
  const key = $("api-key");
  key.value = sessionStorage.getItem("densecnn-key") || "";
  key.addEventListener("change", () => {
    if (key.value) sessionStorage.setItem("densecnn-key", key.value.trim());
    else sessionStorage.removeItem("densecnn-key");
    jobError("");
    loadModels();
    refreshJobs();
  });
  $("job-file").addEventListener("change", (event) => {
    if (event.target.files.length) submitJob(event.target.files[0]);
    event.target.value = "";
  });
  refreshJobs();
}

setUpJobs();
