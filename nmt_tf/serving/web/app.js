// The translation page of nmt_tf.serve: one sentence to the server's REST API
// (TF Serving's predict: serving_default, or translate_with_options for a chosen beam), the answer drawn as text,
// an n-best list and an attention heatmap. No library, nothing from elsewhere.
"use strict";

const TIMEOUT_MS = 60000;
const body = document.body;
const modelName = body.dataset.modelName;
const maxInputTokens = Number(body.dataset.maxInputTokens) || 0;
const maxLineCharacters = Number(body.dataset.maxLineCharacters) || 2000;
const form = document.getElementById("form");
const source = document.getElementById("source");
const submit = document.getElementById("submit");
const message = document.getElementById("message");
const result = document.getElementById("result");
const markup = document.getElementById("markup");
const beam = document.getElementById("beam");
// The beams a request may ask for (the export's translate_with_options signature); none: the control stays hidden.
const servedBeam = Number(body.dataset.beamSize) || 0;
const maxBeam = Number(body.dataset.maxBeamSize) || 0;
if (maxBeam > 1) {
  for (let size = 1; size <= maxBeam; size++) {
    const choice = document.createElement("option");
    choice.value = size === servedBeam ? "" : String(size);
    choice.textContent = size === servedBeam ? `${size} (served default)` : String(size);
    choice.selected = size === servedBeam;
    beam.append(choice);
  }
  document.getElementById("beam-option").hidden = false;
}

// The request's body: serving_default, or with a chosen beam translate_with_options (TF Serving's columnar
// form, whose scalar inputs are the search settings). nmt_tf's extensions: protect keeps URLs, numbers, e-mail
// addresses, handles, hashtags and emoji verbatim; markup takes the tags out and puts them back around the
// words they wrap.
function requestBody(text) {
  const extensions = {protect: "all", ...(markup.checked ? {markup: "html"} : {})};
  if (beam.value) {
    return {signature_name: "translate_with_options", inputs: {text: [text], beam_size: Number(beam.value)},
            ...extensions};
  }
  return {signature_name: "serving_default", instances: [text], ...extensions};
}

// The first row of an answer in either form: {"predictions": [row]} or {"outputs": {alias: [values]}}.
function firstRow(payload) {
  if (!payload) return null;
  if (Array.isArray(payload.predictions)) return payload.predictions[0];
  if (payload.outputs && typeof payload.outputs === "object") {
    return Object.fromEntries(Object.entries(payload.outputs).map(([alias, values]) => [alias, values[0]]));
  }
  return null;
}

function say(text, kind) {
  message.textContent = text;
  message.className = kind === "notice" ? "notice" : "";
  message.hidden = !text;
}

function busy(on) {
  submit.disabled = on;
  submit.textContent = on ? "Translating…" : "Translate";
}

async function translate() {
  const text = source.value;
  if (!text.trim()) {
    result.hidden = true;
    say("The line is empty: type a sentence to translate.");
    return;
  }
  if (text.length > maxLineCharacters) {
    result.hidden = true;
    say(`The line is ${text.length.toLocaleString()} characters long; this page translates lines of at most ` +
        `${maxLineCharacters.toLocaleString()} characters. Split it into sentences.`);
    return;
  }
  say("");
  busy(true);
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), TIMEOUT_MS);
  const started = performance.now();
  try {
    let response;
    try {
      response = await fetch(`/v1/models/${encodeURIComponent(modelName)}:predict`, {
        method: "POST",
        headers: {"Content-Type": "application/json"},
        body: JSON.stringify(requestBody(text)),
        signal: controller.signal,
      });
    } catch (error) {
      result.hidden = true;
      say(error.name === "AbortError"
        ? `The server did not answer within ${TIMEOUT_MS / 1000} s.`
        : "The server cannot be reached: is nmt_tf.serve still running?");
      return;
    }
    let payload = null;
    try {
      payload = await response.json();
    } catch (error) {
      payload = null;
    }
    const elapsed = performance.now() - started;
    const prediction = firstRow(payload);
    if (!response.ok || !prediction) {
      result.hidden = true;
      const reason = payload && payload.error ? payload.error : response.statusText || "no readable answer";
      say(`The server answered with an error (HTTP ${response.status}): ${reason}`);
      return;
    }
    show(prediction, elapsed);
  } finally {
    clearTimeout(timer);
    busy(false);
  }
}

function show(prediction, elapsed) {
  document.getElementById("translation").textContent = prediction.translation || "(the model wrote nothing)";
  document.getElementById("timing").textContent =
    `${Math.round(elapsed).toLocaleString()} ms from pressing Enter to the answer ` +
    `(log-probability ${Number(prediction.log_prob).toFixed(2)}, score ${Number(prediction.score).toFixed(3)})`;
  showConfidence(prediction.confidence);
  if (prediction.truncated) {
    say(`The line is longer than the model's input limit of ${maxInputTokens || "its"} tokens: only its ` +
        "beginning was translated.", "notice");
  } else if (prediction.markup_warning || prediction.placeholder_warning) {
    say([prediction.markup_warning, prediction.placeholder_warning].filter(Boolean)
      .map((w) => w.charAt(0).toUpperCase() + w.slice(1) + ".").join(" "), "notice");
  }
  const nbest = document.getElementById("nbest");
  nbest.replaceChildren();
  const texts = prediction.nbest_translations || [prediction.translation];
  const scores = prediction.nbest_scores || [prediction.score];
  texts.forEach((hypothesis, i) => {
    if (scores[i] <= -1e8) return;          // fewer hypotheses finished than the n-best size
    const item = document.createElement("li");
    item.textContent = hypothesis;
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = Number(scores[i]).toFixed(3);
    item.append(score);
    nbest.append(item);
  });
  drawHeatmap(prediction);
  result.hidden = false;
}

// A model with a calibrator answers a confidence: the probability, fitted on its dev set, that the
// translation is acceptable. Under LOW_CONFIDENCE the page says plainly not to rely on it.
const LOW_CONFIDENCE = 0.5;

function showConfidence(confidence) {
  const line = document.getElementById("confidence");
  if (confidence === undefined || confidence === null) {
    line.hidden = true;
    return;
  }
  const percent = Math.round(Number(confidence) * 100);
  const low = Number(confidence) < LOW_CONFIDENCE;
  line.className = low ? "low" : "";
  line.textContent = low
    ? `Low confidence (${percent} %): the text looks unlike what the model was trained on, or the model was ` +
      "unsure of it. Do not rely on this translation."
    : `Confidence ${percent} %: the chance, calibrated on the model's dev set, that this translation is acceptable.`;
  line.hidden = false;
}

function tokens(list) {
  return (list || []).filter((token) => token !== "");
}

function drawHeatmap(prediction) {
  const sourceTokens = tokens(prediction.source_tokens);
  const targetTokens = tokens(prediction.target_tokens);
  const alpha = (prediction.alignment || []).slice(0, targetTokens.length)
    .map((row) => row.slice(0, sourceTokens.length));
  const table = document.getElementById("heatmap");
  table.replaceChildren();
  const head = table.createTHead().insertRow();
  head.append(document.createElement("th"));
  const columns = sourceTokens.map((token) => {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = token;
    head.append(th);
    return th;
  });
  const rows = [];
  const tbody = table.createTBody();
  targetTokens.forEach((token, i) => {
    const tr = tbody.insertRow();
    const th = document.createElement("th");
    th.scope = "row";
    th.textContent = token;
    tr.append(th);
    rows.push(th);
    sourceTokens.forEach((_, j) => {
      const td = tr.insertCell();
      const a = alpha[i] ? Number(alpha[i][j]) || 0 : 0;
      td.className = "cell";
      td.title = `${token} ← ${sourceTokens[j]}: α = ${a.toFixed(3)}`;
      td.style.backgroundColor = `rgba(36, 86, 200, ${Math.min(1, Math.max(0, a)).toFixed(3)})`;
      td.addEventListener("mouseenter", () => link(i, j));
      td.addEventListener("mouseleave", unlink);
    });
    th.addEventListener("mouseenter", () => link(i, null));
    th.addEventListener("mouseleave", unlink);
  });
  columns.forEach((th, j) => {
    th.addEventListener("mouseenter", () => link(null, j));
    th.addEventListener("mouseleave", unlink);
  });

  // A target token links to the source tokens holding at least a fifth of its
  // largest weight, a source token to the target tokens that attended to it so.
  function strongest(values) {
    const top = Math.max(...values, 0);
    return values.map((v) => top > 0 && v >= top / 5);
  }
  function link(i, j) {
    unlink();
    if (i !== null) {
      rows[i].classList.add("active");
      strongest(alpha[i] || []).forEach((on, k) => on && columns[k].classList.add("linked"));
    }
    if (j !== null) {
      columns[j].classList.add("active");
      if (i === null) strongest(alpha.map((row) => row[j] || 0)).forEach((on, k) => on && rows[k].classList.add("linked"));
    }
  }
  function unlink() {
    table.querySelectorAll("th.active, th.linked").forEach((th) => th.classList.remove("active", "linked"));
  }
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  translate();
});
