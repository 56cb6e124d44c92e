// The try-it page: calls /predict, /translate, /generate, /rerank and /zero-shot-classification,
// draws their attention, shows the training figures.
// Plain JavaScript, no build step, no outside requests (the page's CSP allows only this origin).
"use strict";

const $ = (id) => document.getElementById(id);

const CAPTIONS = {
  curves: "Training curves: loss and the validation metric over the steps",
  positions: "Sinusoidal positional encodings: position × dimension, and a few dimensions as curves",
};

// -- talking to the service ------------------------------------------------------------------

class ApiError extends Error {}

/** JSON in, JSON out; any error answer becomes an ApiError carrying the service's own message. */
async function call(path, body) {
  const init = body === undefined ? {} : {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  };
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(`${path}: the service did not answer (${err.message})`);
  }
  let data = null;
  try {
    data = await response.json();
  } catch (err) {
    data = null;
  }
  if (!response.ok) {
    const what = data && data.error ? data.error : response.statusText || "no message";
    const kind = data && data.type ? `, ${data.type}` : "";
    throw new ApiError(`${what} (HTTP ${response.status}${kind})`);
  }
  if (data === null) throw new ApiError(`${path}: the answer is not JSON`);
  return data;
}

/** POST with "stream": true: calls `onEvent` with each Server-Sent Event's data as it arrives; a
 * refusal (JSON, before the first event) or an error event becomes an ApiError. */
async function callStream(path, body, onEvent) {
  return readStream(path, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ ...body, stream: true }),
  }, onEvent);
}

/** Sends `init` to `path` and reads its answer as Server-Sent Events (see callStream). */
async function readStream(path, init, onEvent) {
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(`${path}: the service did not answer (${err.message})`);
  }
  if (!response.ok || !response.body) {
    const data = await response.json().catch(() => null);
    const what = data && data.error ? data.error : response.statusText || "no message";
    throw new ApiError(`${what} (HTTP ${response.status}${data && data.type ? `, ${data.type}` : ""})`);
  }
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffered = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new ApiError(`${path}: the stream ended before [DONE]`);
    buffered += value;
    let end;
    while ((end = buffered.indexOf("\n\n")) >= 0) {
      const line = buffered.slice(0, end);
      buffered = buffered.slice(end + 2);
      if (!line.startsWith("data: ")) continue;
      const payload = line.slice("data: ".length);
      if (payload === "[DONE]") return;
      const data = JSON.parse(payload);
      if (data.error) throw new ApiError(`${data.error} (${data.type || "error"})`);
      onEvent(data);
    }
  }
}

function showError(id, err) {
  const box = $(id);
  box.textContent = err ? (err instanceof ApiError ? err.message : `Error: ${err.message || err}`) : "";
  box.hidden = !err;
  if (err && !(err instanceof ApiError)) console.error(err);
}

/** Runs one request for a form: busy state, timing, errors shown in the form's error area (the
 * previous answer is hidden then: it no longer matches the text). */
async function run(prefix, work) {
  const button = $(`${prefix}-submit`);
  const status = $(`${prefix}-status`);
  button.disabled = true;
  status.textContent = "Working…";
  showError(`${prefix}-error`, null);
  const t0 = performance.now();
  try {
    const note = await work();
    status.textContent = `${note} · ${Math.round(performance.now() - t0)} ms`;
  } catch (err) {
    status.textContent = "";
    for (const part of ["result", "attention"]) {
      const box = $(`${prefix}-${part}`);
      if (box) box.hidden = true;
    }
    showError(`${prefix}-error`, err);
  } finally {
    button.disabled = false;
  }
}

// -- tokens ----------------------------------------------------------------------------------

/** A tokenizer piece as a person reads it: "▁" (word start) dropped; a byte piece as its
 * character when it is printable ASCII, else as \xNN (one byte of a longer UTF-8 character). */
function pieceLabel(piece) {
  const byte = /^<0x([0-9A-Fa-f]{2})>$/.exec(piece);
  if (byte) {
    const code = parseInt(byte[1], 16);
    return code > 0x20 && code < 0x7f ? String.fromCharCode(code) : `\\x${byte[1].toUpperCase()}`;
  }
  const text = piece.replace(/\u2581/g, "");
  return text === "" ? "␣" : text;
}

function percent(p) {
  return `${(100 * p).toFixed(1)} %`;
}

// -- heatmaps --------------------------------------------------------------------------------

function mean(matrices) {
  const rows = matrices[0].length;
  const cols = rows ? matrices[0][0].length : 0;
  const out = Array.from({ length: rows }, () => new Float64Array(cols));
  for (const m of matrices) {
    for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) out[r][c] += m[r][c] / matrices.length;
  }
  return out;
}

function cssVar(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

/** Weight -> colour along a light-to-deep ramp (0 is the card's background). */
function ramp(t) {
  const stops = [
    [247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107],
  ];
  const x = Math.min(Math.max(t, 0), 1) * (stops.length - 1);
  const i = Math.min(Math.floor(x), stops.length - 2);
  const f = x - i;
  const c = stops[i].map((v, k) => Math.round(v + (stops[i + 1][k] - v) * f));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function fitLabel(ctx, text, max) {
  if (ctx.measureText(text).width <= max) return text;
  let s = text;
  while (s.length > 1 && ctx.measureText(`${s}…`).width > max) s = s.slice(0, -1);
  return `${s}…`;
}

/**
 * Draws `matrix` (rows x cols) on `canvas` with the tokens as axis labels; the colour scale runs
 * from 0 to the map's largest weight. Pointing at (or tapping) a cell writes it to `readout`.
 */
function drawHeatmap(canvas, readout, rowTokens, colTokens, matrix, axes) {
  const rows = rowTokens.length;
  const cols = colTokens.length;
  const ctx = canvas.getContext("2d");
  const font = `12px ${cssVar("--font") || "sans-serif"}`;
  ctx.font = font;
  const rowLabels = rowTokens.map(pieceLabel);
  const colLabels = colTokens.map(pieceLabel);
  const labelMax = 110;
  const left = Math.min(labelMax, Math.max(24, ...rowLabels.map((t) => ctx.measureText(t).width))) + 10;
  const top = Math.min(labelMax, Math.max(24, ...colLabels.map((t) => ctx.measureText(t).width))) + 10;
  const room = canvas.parentElement.clientWidth - left - 8;
  const cell = Math.max(10, Math.min(34, Math.floor(room / Math.max(cols, 1))));
  const width = left + cols * cell + 8;
  const height = top + rows * cell + 8;
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);

  let top1 = 0;
  for (const row of matrix) for (const v of row) top1 = Math.max(top1, v);
  const scale = top1 > 0 ? top1 : 1;
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      ctx.fillStyle = ramp(matrix[r][c] / scale);
      ctx.fillRect(left + c * cell, top + r * cell, cell - 1, cell - 1);
    }
  }
  ctx.font = font;
  ctx.fillStyle = cssVar("--fg") || "#222";
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  rowLabels.forEach((t, r) => ctx.fillText(fitLabel(ctx, t, labelMax), left - 6, top + r * cell + cell / 2));
  colLabels.forEach((t, c) => {
    ctx.save();
    ctx.translate(left + c * cell + cell / 2, top - 6);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    ctx.fillText(fitLabel(ctx, t, labelMax), 0, 0);
    ctx.restore();
  });
  canvas.dataset.rows = String(rows);
  canvas.dataset.cols = String(cols);
  canvas.setAttribute("role", "img");
  canvas.setAttribute("aria-label", `attention heatmap, ${rows} ${axes.rows} × ${cols} ${axes.cols}`);

  const hint = `${axes.rows} × ${axes.cols}; darkest = ${scale.toFixed(3)}. Point at a cell.`;
  readout.textContent = hint;
  const pick = (event) => {
    const box = canvas.getBoundingClientRect();
    const c = Math.floor((event.clientX - box.left - left) / cell);
    const r = Math.floor((event.clientY - box.top - top) / cell);
    if (r < 0 || c < 0 || r >= rows || c >= cols) {
      readout.textContent = hint;
      return;
    }
    readout.textContent = `“${rowLabels[r]}” → “${colLabels[c]}”: ${matrix[r][c].toFixed(3)}`;
  };
  canvas.onmousemove = pick;
  canvas.onclick = pick;
  canvas.onmouseleave = () => { readout.textContent = hint; };
}

function fillSelect(select, options, keep) {
  const old = keep ? select.value : null;
  select.replaceChildren(...options.map(([value, text]) => new Option(text, value)));
  if (old !== null && options.some(([value]) => value === old)) select.value = old;
}

const redraws = [];
let resizeTimer = 0;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => redraws.forEach((f) => f()), 150);
});

/** A labelled bar of a probability: the label, a track filled to it, the percentage. */
function bar(label, prob, best) {
  const li = document.createElement("li");
  li.className = best ? "best" : "";
  const name = document.createElement("span");
  name.className = "name";
  name.textContent = label;
  const track = document.createElement("span");
  track.className = "track";
  const fill = document.createElement("span");
  fill.className = "fill";
  fill.style.width = `${(100 * prob).toFixed(1)}%`;
  track.append(fill);
  const value = document.createElement("span");
  value.className = "value";
  value.textContent = percent(prob);
  li.append(name, track, value);
  return li;
}

// -- sentiment -------------------------------------------------------------------------------

const sentiment = { attention: null };

// The classifier the card asks: the service's default, unless pair classifiers are served beside
// single-text ones (the default is then ambiguous): the first single-text one, named.
let sentimentModel = null;

function drawSentimentAttention() {
  const att = sentiment.attention;
  if (!att) return;
  const head = $("sentiment-head").value;
  const matrix = head === "avg" ? mean(att.weights) : att.weights[Number(head)];
  drawHeatmap($("sentiment-map"), $("sentiment-readout"), att.tokens, att.tokens, matrix, {
    rows: "tokens", cols: "attended tokens",
  });
}
redraws.push(drawSentimentAttention);

function showPrediction(p) {
  $("sentiment-label").textContent = p.label;
  $("sentiment-score").textContent = percent(p.score);
  $("sentiment-label").dataset.label = p.label;
  const items = Object.entries(p.scores).map(([label, prob]) => bar(label, prob, label === p.label));
  $("sentiment-bars").replaceChildren(...items);
  $("sentiment-result").hidden = false;

  sentiment.attention = p.attention || null;
  $("sentiment-attention").hidden = !p.attention;
  if (p.attention) {
    const heads = p.attention.weights.map((_, h) => [String(h), `head ${h + 1}`]);
    fillSelect($("sentiment-head"), [["avg", "average of heads"], ...heads], true);
    drawSentimentAttention();
  }
}

$("sentiment-head").addEventListener("change", drawSentimentAttention);
$("sentiment-form").addEventListener("submit", (event) => {
  event.preventDefault();
  run("sentiment", async () => {
    const text = $("sentiment-input").value;
    const body = { texts: [text], return_attention: true };
    if (sentimentModel) body.model = sentimentModel;
    const data = await call("/predict", body);
    showPrediction(data.predictions[0]);
    return `${data.model} v${data.version}`;
  });
});

// -- translation -----------------------------------------------------------------------------

const translation = { attention: [] };

function syncDecodeOptions() {
  const decode = $("decode").value;
  const beam = $("beam-size");
  const hyps = $("num-hypotheses");
  beam.disabled = decode !== "beam";
  hyps.disabled = decode === "greedy";
  hyps.max = decode === "beam" ? beam.value : "8";
  if (Number(hyps.value) > Number(hyps.max)) hyps.value = hyps.max;
}

function decodeRequest(text) {
  const decode = $("decode").value;
  const body = { texts: [text], decode, return_scores: true, return_attention: true };
  if (decode === "beam") body.beam_size = Number($("beam-size").value);
  if (decode === "sample") body.seed = Math.floor(Math.random() * 2 ** 32); // the streamed draws and the answer's agree
  if (decode !== "greedy") body.num_hypotheses = Number($("num-hypotheses").value);
  if ($("translate-model").value) body.model = $("translate-model").value;
  if (!$("language-box").hidden) {
    body.source_language = $("source-language").value;
    body.target_language = $("target-language").value;
  }
  return body;
}

// The translators served and the languages of the one chosen: a multilingual model (NLLB,
// M2M100, mBART-50) takes its source and target language per request.
let translators = [];

function showLanguages() {
  const model = translators.find((m) => m.name === $("translate-model").value) || translators[0];
  const sources = (model && model.source_languages) || [];
  const targets = (model && model.target_languages) || [];
  $("language-box").hidden = sources.length < 2 && targets.length < 2;
  if ($("language-box").hidden) return;
  fillSelect($("source-language"), sources.map((c) => [c, c]), true);
  fillSelect($("target-language"), targets.map((c) => [c, c]), true);
  if (model.source_language && !$("source-language").dataset.chosen) $("source-language").value = model.source_language;
  if (model.target_language && !$("target-language").dataset.chosen) $("target-language").value = model.target_language;
}

$("translate-model").addEventListener("change", showLanguages);
for (const id of ["source-language", "target-language"]) {
  $(id).addEventListener("change", () => { $(id).dataset.chosen = "1"; });
}

function drawTranslationAttention() {
  const sentences = translation.attention;
  if (!sentences.length) return;
  const m = sentences[Number($("sentence").value) || 0];
  const layer = $("layer").value;
  const head = $("head").value;
  const layers = layer === "avg" ? m.weights : [m.weights[Number(layer)]];
  const maps = layers.flatMap((heads) => (head === "avg" ? heads : [heads[Number(head)]]));
  drawHeatmap($("attention-map"), $("translate-readout"), m.target_tokens, m.source_tokens, mean(maps), {
    rows: "generated tokens", cols: "source tokens",
  });
}
redraws.push(drawTranslationAttention);

function showTranslation(t) {
  $("translation").textContent = t.text;
  const score = typeof t.score === "number" ? ` · score ${t.score.toFixed(3)}` : "";
  const cut = t.finish_reason === "length" ? " · cut at the length limit" : "";
  $("translation-meta").textContent = `best hypothesis${score}${cut}`;
  const hyps = t.hypotheses || [];
  $("nbest").replaceChildren(...hyps.map((h) => {
    const li = document.createElement("li");
    const text = document.createElement("span");
    text.textContent = h.text;
    text.lang = "de";
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = h.score.toFixed(3) + (h.finish_reason === "length" ? " (cut)" : "");
    li.append(text, score);
    return li;
  }));
  $("nbest-box").hidden = hyps.length === 0;
  $("translate-result").hidden = false;

  translation.attention = t.attention || [];
  $("translate-attention").hidden = translation.attention.length === 0;
  if (!translation.attention.length) return;
  const first = translation.attention[0];
  fillSelect($("sentence"), translation.attention.map((m, i) => {
    const words = m.source_tokens.filter((p) => p !== "</s>").map(pieceLabel).join(" ");
    return [String(i), `${i + 1}: ${words.length > 40 ? `${words.slice(0, 40)}…` : words}`];
  }), false);
  $("sentence-box").hidden = translation.attention.length < 2;
  const layers = first.weights.map((_, l) => [String(l), `layer ${l + 1}`]);
  fillSelect($("layer"), [["avg", "average of layers"], ...layers], true);
  const heads = (first.weights[0] || []).map((_, h) => [String(h), `head ${h + 1}`]);
  fillSelect($("head"), [["avg", "average of heads"], ...heads], true);
  drawTranslationAttention();
}

for (const id of ["sentence", "layer", "head"]) $(id).addEventListener("change", drawTranslationAttention);
for (const id of ["decode", "beam-size"]) $(id).addEventListener("change", syncDecodeOptions);
syncDecodeOptions();

$("translate-form").addEventListener("submit", (event) => {
  event.preventDefault();
  run("translate", async () => {
    const body = decodeRequest($("translate-input").value);
    // The best translation as it is produced (a long text's sentences appear as they end), then
    // the whole answer for the n-best list and the attention maps, which a stream does not carry.
    const { num_hypotheses: _n, return_attention: _a, ...streamed } = body;
    $("translation").textContent = "";
    $("translation-meta").textContent = "translating…";
    $("nbest-box").hidden = true;
    $("translate-attention").hidden = true;
    $("translate-result").hidden = false;
    await callStream("/translate", streamed, (e) => {
      if (e.text) $("translation").textContent += e.text;
    });
    const data = await call("/translate", body);
    showTranslation(data.translations[0]);
    return `${data.model} v${data.version}`;
  });
});

// -- documents ---------------------------------------------------------------------------------

/** The translated file of POST /translate_file (streamed: its progress moves the bar), its name
 * and its counts. */
async function translateFile(form) {
  form.append("stream", "true");
  const bar = $("document-progress");
  bar.value = 0;
  bar.hidden = false;
  let file = null;
  try {
    await readStream("/translate_file", { method: "POST", body: form }, (e) => {
      if (e.data === undefined) {
        bar.max = Math.max(e.total, 1);
        bar.value = e.done;
      } else {
        file = e;
      }
    });
  } finally {
    bar.hidden = true;
  }
  if (file === null) throw new ApiError("/translate_file: the stream ended without the file");
  const bytes = Uint8Array.from(atob(file.data), (c) => c.charCodeAt(0));
  return {
    blob: new Blob([bytes], { type: file.media_type }),
    name: file.filename,
    translated: file.translated,
    kept: file.kept,
    failed: file.failed,
  };
}

let documentUrl = null;

$("document-form").addEventListener("submit", (event) => {
  event.preventDefault();
  run("document", async () => {
    const file = $("document-file").files[0];
    if (!file) throw new ApiError("choose a file first");
    const form = new FormData();
    form.append("file", file, file.name);
    form.append("fuzzy", $("document-fuzzy").checked ? "true" : "false");
    if ($("translate-model").value) form.append("model", $("translate-model").value);
    if (!$("language-box").hidden) {
      form.append("source_language", $("source-language").value);
      form.append("target_language", $("target-language").value);
    }
    const done = await translateFile(form);
    if (documentUrl) URL.revokeObjectURL(documentUrl);
    documentUrl = URL.createObjectURL(done.blob);
    const link = $("document-link");
    link.href = documentUrl;
    link.download = done.name;
    link.textContent = `Download ${done.name}`;
    $("document-counts").textContent =
      `${done.translated} translated, ${done.kept} kept as they were, ${done.failed} left empty (a placeholder or accelerator could not be kept)`;
    $("document-result").hidden = false;
    return `${file.name}: ${done.translated} translated`;
  });
});

// -- text to text ------------------------------------------------------------------------------

// The text-to-text models served (T5, Flan-T5, BART summarizers): the card shows when one is ready.
let generators = [];

/** What the chosen model reads: its prefix (e.g. "summarize: ") before the text. */
function showPrefix() {
  const model = generators.find((m) => m.name === $("generate-model").value);
  const prefix = model && model.prefix ? model.prefix : "";
  $("generate-prefix").textContent = prefix ? `reads: ${prefix}…` : "reads the text as it is";
}

function showGenerators(serving) {
  generators = serving.filter((m) => m.task === "text2text" && m.status === "ready");
  fillSelect($("generate-model"), generators.map((m) => [m.name, m.name]), true);
  $("text2text").hidden = generators.length === 0;
  showPrefix();
}

$("generate-model").addEventListener("change", showPrefix);
$("generate-form").addEventListener("submit", (event) => {
  event.preventDefault();
  run("generate", async () => {
    const model = $("generate-model").value;
    // "beam" without a beam size: the model's own (its generation config's num_beams).
    const body = { model, texts: [$("generate-input").value], decode: $("generate-decode").value, return_scores: true };
    $("generation").textContent = "";
    $("generation-meta").textContent = "generating…";
    $("generate-result").hidden = false;
    let end = null;
    await callStream("/generate", body, (e) => {
      if (e.text) $("generation").textContent += e.text;
      if (e.finish_reason) end = e;
    });
    const score = end && typeof end.score === "number" ? ` · score ${end.score.toFixed(3)}` : "";
    const cut = end && end.finish_reason === "length" ? " · cut at the length limit" : "";
    const decode = $("generate-decode");
    $("generation-meta").textContent = `${decode.options[decode.selectedIndex].text}${score}${cut}`;
    const version = generators.find((m) => m.name === model);
    return version ? `${model} v${version.version}` : model;
  });
});

// -- sentence pairs: rerank and zero-shot -------------------------------------------------------

// The pair classifiers served (cross-encoders, NLI models): the rerank card offers each (a
// one-label scorer first), the zero-shot card those with an entailment label.
let pairModels = [];

/** Whether the service would run zero-shot on this model: as service/tasks/pairs.py `nli_ids`
 * decides, a label starting with "entail" (any case) among two or more. */
function isNli(model) {
  const labels = model.labels || [];
  return labels.length >= 2 && labels.some((l) => l.toLowerCase().startsWith("entail"));
}

function versionNote(model) {
  const m = pairModels.find((p) => p.name === model);
  return m ? `${model} v${m.version}` : model;
}

function showPairModels(serving) {
  const ready = serving.filter((m) => m.task === "classification" && m.status === "ready");
  pairModels = ready.filter((m) => m.pairs === true);
  const scorer = (m) => ((m.labels || []).length === 1 ? 0 : 1);
  const scorersFirst = [...pairModels].sort((a, b) => scorer(a) - scorer(b));
  fillSelect($("rerank-model"), scorersFirst.map((m) => [m.name, m.name]), true);
  $("rerank").hidden = pairModels.length === 0;
  const nli = pairModels.filter(isNli);
  fillSelect($("zeroshot-model"), nli.map((m) => [m.name, m.name]), true);
  $("zero-shot").hidden = nli.length === 0;
  const singles = ready.filter((m) => m.pairs !== true);
  sentimentModel = pairModels.length && singles.length ? singles[0].name : null;
}

function showRanks(ranks, texts) {
  $("ranks").replaceChildren(...ranks.map((r) => {
    const li = document.createElement("li");
    li.dataset.index = String(r.index);
    li.dataset.score = String(r.score);
    const doc = document.createElement("span");
    doc.className = "doc";
    doc.textContent = texts[r.index];
    const where = document.createElement("small");
    where.className = "where";
    where.textContent = `#${r.index + 1}`;
    doc.append(" ", where);
    const track = document.createElement("span");
    track.className = "track";
    const fill = document.createElement("span");
    fill.className = "fill";
    fill.style.width = `${(100 * Math.min(Math.max(r.score, 0), 1)).toFixed(1)}%`;
    track.append(fill);
    const value = document.createElement("span");
    value.className = "value";
    value.textContent = r.score.toFixed(4);
    li.append(doc, track, value);
    return li;
  }));
  $("rerank-result").hidden = false;
}

$("rerank-form").addEventListener("submit", (event) => {
  event.preventDefault();
  run("rerank", async () => {
    const model = $("rerank-model").value;
    // One document a line; blank lines are no documents (none at all: the service's 422).
    const texts = $("rerank-texts").value.split("\n").map((t) => t.trim()).filter((t) => t !== "");
    const body = { model, query: $("rerank-query").value, texts, truncate: $("rerank-truncate").checked };
    showRanks(await call("/rerank", body), texts);
    return `${versionNote(model)} · ${texts.length} documents`;
  });
});

$("zeroshot-form").addEventListener("submit", (event) => {
  event.preventDefault();
  run("zeroshot", async () => {
    const multi = $("zeroshot-multi").checked;
    const body = {
      model: $("zeroshot-model").value,
      texts: [$("zeroshot-input").value],
      candidate_labels: $("zeroshot-labels").value.split(",").map((l) => l.trim()).filter((l) => l !== ""),
      hypothesis_template: $("zeroshot-template").value,
      multi_label: multi,
    };
    const data = await call("/zero-shot-classification", body);
    const result = data.results[0];
    // One label: the best; several that may hold together: each more likely than not.
    $("zeroshot-bars").replaceChildren(...result.labels.map((label, i) => {
      const prob = result.scores[i];
      const li = bar(label, prob, multi ? prob >= 0.5 : i === 0);
      li.dataset.score = String(prob);
      return li;
    }));
    $("zeroshot-result").hidden = false;
    return `${data.model} v${data.version}`;
  });
});

// -- models and their training figures --------------------------------------------------------

function figureBlock(model) {
  const block = document.createElement("section");
  block.className = "model-figures";
  const title = document.createElement("h3");
  title.textContent = `${model.name} v${model.version}`;
  const task = document.createElement("small");
  task.textContent = ` ${model.task || ""}`;
  title.append(task);
  block.append(title);
  const order = (name) => (name === "curves" ? 0 : name === "positions" ? 1 : 2);
  for (const name of [...model.figures].sort((a, b) => order(a) - order(b) || a.localeCompare(b))) {
    const figure = document.createElement("figure");
    const img = document.createElement("img");
    img.src = `/v1/models/${encodeURIComponent(model.name)}/figures/${encodeURIComponent(name)}`;
    img.alt = CAPTIONS[name] || name;
    img.loading = "lazy";
    img.dataset.figure = `${model.name}/${name}`;
    const caption = document.createElement("figcaption");
    caption.textContent = CAPTIONS[name] || name;
    figure.append(img, caption);
    block.append(figure);
  }
  return block;
}

async function loadModels() {
  try {
    const data = await call("/v1/models");
    const serving = data.data.filter((m) => m.current !== false && m.status !== "refused");
    $("models").textContent = serving.length
      ? `Serving ${serving.map((m) => `${m.name} v${m.version} (${m.task || "?"}, ${m.status})`).join(" · ")}`
      : "No model is served.";
    translators = serving.filter((m) => m.task === "translation" && m.status === "ready");
    fillSelect($("translate-model"), [["", "the default"], ...translators.map((m) => [m.name, m.name])], true);
    showLanguages();
    showGenerators(serving);
    showPairModels(serving);
    const withFigures = serving.filter((m) => m.figures && m.figures.length);
    $("figures").replaceChildren(...withFigures.map(figureBlock));
    if (!withFigures.length) {
      const none = document.createElement("p");
      none.className = "muted";
      none.textContent = "The served versions keep no training figures (exported before figures were kept).";
      $("figures").append(none);
    }
    if (data.data.some((m) => m.status === "loading")) setTimeout(loadModels, 2000);
  } catch (err) {
    $("models").textContent = "";
    $("figures").replaceChildren();
    showError("models-error", err);
  }
}

loadModels();
