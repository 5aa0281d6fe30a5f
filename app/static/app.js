// The densecnn page: pick a model, drop an image, see its overlay, legend and per-class pixel counts.
"use strict";

const $ = (id) => document.getElementById(id);
let models = {};

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = false;
  $("status").textContent = "";
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

// Turn an error answer ({"error": {"code", "message"}}) or a network failure into a sentence.
async function errorText(response) {
  try {
    const body = await response.json();
    if (body && body.error) return `${body.error.message} (HTTP ${response.status}, ${body.error.code})`;
  } catch (_) { /* not JSON */ }
  return `the server answered HTTP ${response.status} ${response.statusText}`;
}

const API_ONLY = {
  1: "a signal model: this page shows images only; send signals (.npy) to the API (see /docs)",
  3: "a volume model: this page shows images only; send volumes (multi-page TIFF or .npy) to the API (see /docs)",
};

function describeModel(info) {
  const patch = info.patch_size.join("×");
  const facts = `${info.num_classes} classes, patch ${patch}, ${info.in_channels} input channel(s), padding ${info.padding_mode}`;
  return info.dims === 2 ? facts : `${facts}. This is ${API_ONLY[info.dims]}.`;
}

// The API key typed in the jobs panel (kept for this tab), as request headers; none on a server without keys.
function authHeaders() {
  const key = sessionStorage.getItem("densecnn-key");
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function loadModels() {
  let response;
  try {
    response = await fetch("/v1/models", { headers: authHeaders() });
  } catch (err) {
    showError(`Cannot reach the server: ${err.message}`);
    return;
  }
  if (!response.ok) {
    showError(`Cannot list the models: ${await errorText(response)}`);
    return;
  }
  const list = await response.json();
  const select = $("model");
  select.innerHTML = "";
  for (const info of list.models) {
    models[info.name] = info;
    const option = new Option(info.name, info.name, false, info.name === list.default);
    select.add(option);
  }
  select.disabled = false;
  $("model-info").textContent = describeModel(models[select.value]);
}

// "decode;dur=1.2, infer;dur=30.5, encode;dur=2.0" -> {decode: 1.2, ...} (milliseconds)
function parseServerTiming(header) {
  const steps = {};
  for (const part of (header || "").split(",")) {
    const match = part.trim().match(/^([\w-]+);dur=([\d.]+)/);
    if (match) steps[match[1]] = parseFloat(match[2]);
  }
  return steps;
}

function renderLegend(result) {
  const total = result.width * result.height;
  const body = $("legend").querySelector("tbody");
  body.innerHTML = "";
  for (const cls of result.classes) {
    const count = result.pixel_counts[cls.id];
    const row = body.insertRow();
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = `rgb(${cls.color.join(",")})`;
    row.insertCell().append(swatch);
    row.insertCell().textContent = cls.name;
    const pixels = row.insertCell();
    pixels.className = "num";
    pixels.textContent = count.toLocaleString("en");
    const share = row.insertCell();
    share.className = "num";
    share.textContent = `${((100 * count) / total).toFixed(1)} %`;
  }
}

async function segment(file) {
  clearError();
  const name = $("model").value;
  if (!name || !models[name]) {
    showError("No model is loaded yet; wait a moment and try again.");
    return;
  }
  if (models[name].dims !== 2) {
    showError(`${name} is ${API_ONLY[models[name].dims]}.`);
    return;
  }
  $("result").hidden = true;
  $("status").textContent = `Segmenting ${file.name} with ${name}…`;
  const form = new FormData();
  form.append("image", file, file.name);
  const started = performance.now();
  let response;
  try {
    response = await fetch(`/v1/models/${encodeURIComponent(name)}/segment?view=overlay`, {
      method: "POST",
      headers: { Accept: "application/json", ...authHeaders() },
      body: form,
    });
  } catch (err) {
    showError(`The upload failed: ${err.message}`);
    return;
  }
  if (!response.ok) {
    showError(`Could not segment ${file.name}: ${await errorText(response)}`);
    return;
  }
  const result = await response.json();
  const timing = parseServerTiming(response.headers.get("Server-Timing"));
  const serverMs = Object.values(timing).reduce((a, b) => a + b, 0);
  const roundTrip = performance.now() - started;

  const input = $("input-image");
  $("input-note").hidden = true;
  input.hidden = false;
  input.onerror = () => { input.hidden = true; $("input-note").hidden = false; };
  input.src = URL.createObjectURL(file);
  $("overlay-image").src = `data:image/png;base64,${result.overlay_png_base64}`;
  const download = $("download");
  download.href = `data:image/png;base64,${result.labels_png_base64}`;
  download.download = `${file.name.replace(/\.[^.]*$/, "")}-labels.png`;
  renderLegend(result);
  $("result").hidden = false;
  const steps = Object.entries(timing).map(([k, v]) => `${k} ${v.toFixed(0)} ms`).join(", ");
  $("status").textContent =
    `${file.name}: ${result.width}×${result.height} pixels. Server time ${serverMs.toFixed(0)} ms (${steps}); ` +
    `round trip ${roundTrip.toFixed(0)} ms.`;
}

function setUpDrop() {
  const drop = $("drop");
  $("file").addEventListener("change", (event) => {
    if (event.target.files.length) segment(event.target.files[0]);
    event.target.value = "";
  });
  drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    if (event.dataTransfer.files.length) segment(event.dataTransfer.files[0]);
  });
  drop.addEventListener("keydown", (event) => { if (event.key === "Enter") $("file").click(); });
  $("model").addEventListener("change", () => {
    // what was shown belongs to the previous model: its error, its result
    clearError();
    $("result").hidden = true;
    $("status").textContent = "";
    $("model-info").textContent = describeModel(models[$("model").value]);
  });
}

setUpDrop();
loadModels();
