// speclive's web page: microphone -> WS /v1/realtime (OpenAI Realtime events) -> live views.
// Plain ES module, no dependencies. The worklet sends 16 kHz PCM16; answers come back as 16 kHz
// PCM16 and are played in order. Counters on <body data-*> let tests and curious users see
// what happened (turns, answers, milliseconds of answer audio played).

const $ = (sel) => document.querySelector(sel);
const body = document.body;
const RATE = 16000;

const st = {
  mode: "chat",
  ws: null,
  ctx: null,
  stream: null,
  src: null,
  echo: false, // the open capture cancels echo
  node: null,
  playAt: 0,
  sources: [],
  playedMs: 0,
  lastCandidate: "",
  newTurn: false,
};

function setStatus(text) { $("#status").textContent = text; }
function bump(name) { body.dataset[name] = String(Number(body.dataset[name] || 0) + 1); }

function b64FromBytes(buffer) {
  const u = new Uint8Array(buffer);
  let s = "";
  for (let i = 0; i < u.length; i += 0x8000) s += String.fromCharCode.apply(null, u.subarray(i, i + 0x8000));
  return btoa(s);
}

function bytesFromB64(b64) {
  const s = atob(b64);
  const u = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) u[i] = s.charCodeAt(i);
  return u.buffer;
}

function setSplit(el, stable, tentative) {
  el.querySelector(".stable").textContent = stable || "";
  el.querySelector(".tentative").textContent = tentative || "";
}

function commonPrefix(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

// ---- the connection --------------------------------------------------------------------
function turnDetection() {
  if ($("#turn").value === "semantic_vad") return { type: "semantic_vad", eagerness: $("#eagerness").value };
  return { type: "server_vad" };
}

function sessionUpdate() {
  return {
    type: "session.update",
    session: {
      turn_detection: turnDetection(),
      speclive: { mode: st.mode, target_lang: $("#lang").value, sample_rate: RATE },
    },
  };
}

function send(event) {
  if (st.ws && st.ws.readyState === WebSocket.OPEN) st.ws.send(JSON.stringify(event));
}

function connect() {
  return new Promise((resolve, reject) => {
    const key = $("#key").value || localStorage.getItem("speclive-key") || "";
    if ($("#key").value) localStorage.setItem("speclive-key", $("#key").value);
    const protocols = ["realtime"];
    if (key) protocols.push("openai-insecure-api-key." + key);
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}/v1/realtime`, protocols);
    ws.onopen = () => { st.ws = ws; send(sessionUpdate()); resolve(ws); };
    ws.onmessage = (m) => onEvent(JSON.parse(m.data));
    ws.onerror = () => reject(new Error("WebSocket error"));
    ws.onclose = (e) => {
      st.ws = null;
      if (e.code === 1008) { $(".key").hidden = false; setStatus("this server needs an API key"); }
      else if (e.code === 1013) setStatus("the server is full, try again soon");
      else setStatus(`disconnected (${e.code}${e.reason ? ": " + e.reason : ""})`);
      stopMic();
    };
  });
}

// ---- microphone -------------------------------------------------------------------------
// What the page asks of the microphone. Noise suppression and automatic gain control are off in
// every mode: Whisper hears speech as it was recorded, and they reshape it (noise suppression
// takes parts of the voice's spectrum for noise, the gain control pumps it up to clipping).
// Echo cancellation is on only in voice chat, where the answer plays through the speakers and
// would otherwise come back as the user speaking over it; it alters the waveform too, so the
// modes that play nothing go without it.
function micConstraints(echo) {
  return { audio: { channelCount: 1, echoCancellation: echo, noiseSuppression: false, autoGainControl: false } };
}

async function openCapture() {
  const echo = st.mode === "chat";
  const stream = await navigator.mediaDevices.getUserMedia(micConstraints(echo));
  st.stream = stream;
  st.echo = echo;
  st.src = st.ctx.createMediaStreamSource(stream);
  if (st.node) st.src.connect(st.node);
}

function closeCapture() {
  if (st.src) { st.src.disconnect(); st.src = null; }
  if (st.stream) { st.stream.getTracks().forEach((t) => t.stop()); st.stream = null; }
}

async function startMic() {
  st.ctx = st.ctx || new AudioContext();
  await st.ctx.resume();
  await st.ctx.audioWorklet.addModule("/static/worklet.js");
  await openCapture();
  if (!st.ws) await connect();
  st.node = new AudioWorkletNode(st.ctx, "pcm16-writer");
  st.node.port.onmessage = (m) => send({ type: "input_audio_buffer.append", audio: b64FromBytes(m.data) });
  st.src.connect(st.node);
  st.node.connect(st.ctx.destination); // silent: keeps the worklet pulled
  body.dataset.state = "listening";
  $("#mic").textContent = "■ Stop";
  setStatus("listening");
  matchCaptureToMode(); // the mode changed while the microphone opened
}

// A mode that needs the other echo setting reopens the microphone with it (browsers do not
// switch a running track's audio processing reliably); the worklet and the connection stay.
// One reopening at a time, in the order of the mode changes.
let reopening = Promise.resolve();
function matchCaptureToMode() {
  reopening = reopening.then(async () => {
    if (!st.node || st.echo === (st.mode === "chat")) return;
    closeCapture();
    try { await openCapture(); } catch (err) { setStatus(`microphone: ${err.message}`); stopMic(); }
    if (!st.node) closeCapture(); // stopped while it opened
  });
}

function stopMic() {
  if (st.node) { st.node.port.onmessage = null; st.node.disconnect(); st.node = null; }
  closeCapture();
  body.dataset.state = "idle";
  $("#mic").textContent = "🎤 Start";
}

// ---- answer audio -----------------------------------------------------------------------
function play(b64) {
  if (!st.ctx) return;
  const pcm = new Int16Array(bytesFromB64(b64));
  if (!pcm.length) return;
  const buf = st.ctx.createBuffer(1, pcm.length, RATE);
  const ch = buf.getChannelData(0);
  for (let i = 0; i < pcm.length; i++) ch[i] = pcm[i] / 32768;
  const src = st.ctx.createBufferSource();
  src.buffer = buf;
  src.connect(st.ctx.destination);
  const at = Math.max(st.ctx.currentTime, st.playAt);
  src.start(at);
  st.playAt = at + buf.duration;
  st.sources.push(src);
  src.onended = () => {
    st.sources = st.sources.filter((s) => s !== src);
    st.playedMs += buf.duration * 1000;
    body.dataset.playedMs = String(Math.round(st.playedMs));
  };
}

function stopPlayback() {
  st.sources.forEach((s) => { s.onended = null; try { s.stop(); } catch { /* not started */ } });
  st.sources = [];
  st.playAt = 0;
}

// ---- protocol events -> views -------------------------------------------------------------
function onEvent(e) {
  switch (e.type) {
    case "session.created":
    case "session.updated":
      setStatus(st.node ? "listening" : "connected");
      break;
    case "input_audio_buffer.speech_started":
      if (st.sources.length) stopPlayback(); // you spoke over the answer
      setStatus("hearing you…");
      st.newTurn = true; // the previous turn's texts stay until this one has its own
      break;
    case "input_audio_buffer.speech_stopped":
      setStatus(st.mode === "chat" ? "thinking…" : "listening");
      break;
    case "speclive.transcript":
      if (st.mode === "chat") setSplit($("#chat-you"), e.stable, e.tentative);
      else if (st.mode === "transcribe") setSplit($("#tx-live"), e.stable, e.tentative);
      break;
    case "conversation.item.input_audio_transcription.completed":
      bump("transcripts");
      body.dataset.lastTranscript = e.transcript;
      if (st.mode === "chat") setSplit($("#chat-you"), e.transcript, "");
      if (st.mode === "transcribe") {
        const li = document.createElement("li");
        li.textContent = e.transcript;
        $("#tx-lines").appendChild(li);
        setSplit($("#tx-live"), "", "");
      }
      break;
    case "speclive.speculation": {
      const el = $("#chat-spec");
      if (st.newTurn) { st.lastCandidate = ""; st.newTurn = false; }
      const kept = commonPrefix(st.lastCandidate, e.candidate);
      el.textContent = "";
      const b = document.createElement("b");
      b.textContent = e.candidate.slice(0, kept);
      el.append(b, e.candidate.slice(kept));
      st.lastCandidate = e.candidate;
      bump("speculations");
      break;
    }
    case "response.created":
      bump("responses");
      $("#chat-answer").textContent = "";
      setStatus("answering");
      break;
    case "response.output_audio_transcript.delta":
    case "response.audio_transcript.delta":
      $("#chat-answer").textContent += e.delta;
      break;
    case "response.output_audio.delta":
    case "response.audio.delta":
      play(e.delta);
      bump("audioDeltas");
      break;
    case "response.done":
      bump("answers");
      setStatus(st.node ? "listening" : "connected");
      break;
    case "speclive.interrupted":
      stopPlayback();
      break;
    case "speclive.turn_prediction": {
      // the policy at a pause: P(turn over) from the audio model and the LM, fused, against the
      // bar it has to clear after this much silence; "end" answers at once
      bump("predictions");
      if (e.end) bump("predictedEnds");
      $("#turn-panel").hidden = false;
      const pct = (v) => (v == null ? "–" : `${Math.round(100 * v)} %`);
      const fill = $("#turn-score");
      fill.style.width = `${Math.round(100 * (e.score || 0))}%`;
      fill.classList.toggle("end", !!e.end);
      $("#turn-bar").style.left = `${Math.round(100 * Math.min(1, e.bar))}%`;
      $("#turn-detail").textContent = `voice ${pct(e.audio_p)}, words ${pct(e.text_p)} after ` +
        `${Math.round(1000 * e.silence_s)} ms of silence: ${e.end ? "your turn is over" : "waiting"}`;
      break;
    }
    case "speclive.translation":
      $("#tr-source").textContent = e.source; // what this translation is of
      setSplit($("#tr-text"), e.stable, e.tentative);
      if (e.final) bump("translations");
      break;
    case "speclive.turn_metrics": {
      bump("turns");
      if (st.mode !== "chat" || e.latency_s == null) break;
      const li = document.createElement("li");
      li.textContent = `${e.transcript} — answered in ${e.latency_s.toFixed(2)} s` +
        (e.audio_ready_at_eot ? " (first sentence ready when you stopped)" : "");
      $("#chat-turns").appendChild(li);
      break;
    }
    case "speclive.notice":
      setStatus(e.message || e.code);
      break;
    case "error":
      setStatus(`error: ${e.error.message}`);
      break;
  }
}

// ---- controls ---------------------------------------------------------------------------
$("#mic").addEventListener("click", async () => {
  if (st.node) { stopMic(); setStatus("stopped"); return; }
  try { await startMic(); } catch (err) { setStatus(`microphone: ${err.message}`); stopMic(); }
});

document.querySelectorAll(".tab").forEach((tab) => tab.addEventListener("click", () => {
  document.querySelectorAll(".tab").forEach((t) => t.classList.toggle("active", t === tab));
  st.mode = tab.dataset.mode;
  for (const m of ["chat", "translate", "transcribe"]) $(`#view-${m}`).hidden = m !== st.mode;
  $("#lang-box").hidden = st.mode !== "translate";
  body.dataset.mode = st.mode;
  send(sessionUpdate());
  matchCaptureToMode();
}));
$("#lang").addEventListener("change", () => send(sessionUpdate()));
$("#turn").addEventListener("change", () => {
  $("#eagerness").hidden = $("#turn").value !== "semantic_vad";
  send(sessionUpdate());
});
$("#eagerness").addEventListener("change", () => send(sessionUpdate()));
// ?turn=semantic_vad&eagerness=high preselects the turn detection (links, tests)
{
  const q = new URLSearchParams(location.search);
  if (q.get("turn")) $("#turn").value = q.get("turn");
  if (q.get("eagerness")) $("#eagerness").value = q.get("eagerness");
  $("#eagerness").hidden = $("#turn").value !== "semantic_vad";
}
body.dataset.mode = st.mode;
