// AudioWorklet: microphone samples at the context's rate -> 16 kHz PCM16 chunks of 100 ms.
//
// The context runs at the device's rate (44.1 or 48 kHz, usually). Output sample n lies at
// input position n * down / up (up / down = 16000 / rate in lowest terms), and is a windowed-sinc
// low-pass (cut at 7.5 kHz, Kaiser window) of the input around that position: nothing above the
// 8 kHz Nyquist of the output folds back into the speech band. Positions are kept as integers
// (an input index and a remainder in [0, up)), so the two clocks never drift apart, and the
// input is kept in a buffer across render quanta: each output sample sees every input sample
// its filter spans, whatever the block boundaries. The filter's taps are worked out once per
// phase (the remainder, or a 1/1024 step of it for rates with many phases).
const OUT_RATE = 16000;
const CUTOFF_HZ = 7500; // the middle of the transition band, which runs from ~7 to ~8 kHz
const HALF_WIDTH_S = 0.002; // the filter spans +-2 ms of input
const KAISER_BETA = 7; // about 70 dB of stop-band attenuation
const MAX_PHASES = 1024;
const CHUNK = 1600; // 100 ms at 16 kHz

function gcd(a, b) {
  while (b) [a, b] = [b, a % b];
  return a;
}

function besselI0(x) {
  let sum = 1, term = 1;
  for (let k = 1; k < 64; k++) {
    term *= (x / (2 * k)) ** 2;
    sum += term;
    if (term < 1e-12 * sum) break;
  }
  return sum;
}

class PCM16Writer extends AudioWorkletProcessor {
  constructor() {
    super();
    const rate = Math.round(sampleRate);
    const g = gcd(rate, OUT_RATE);
    this.up = OUT_RATE / g;
    this.down = rate / g;
    this.same = rate === OUT_RATE; // samples pass as they are
    this.half = Math.ceil(HALF_WIDTH_S * rate); // taps each side of the position
    // cut-off in cycles per input sample; a context slower than 16 kHz (up-sampling) is cut at
    // the same fraction of its own rate
    const fc = (CUTOFF_HZ * Math.min(1, rate / OUT_RATE)) / rate;
    this.phases = Math.min(this.up, MAX_PHASES);
    // taps[q][j] weighs input ipos - half + 1 + j for an output at ipos + q / phases;
    // q == phases (a remainder rounded up) is the next input sample's phase 0
    const i0b = besselI0(KAISER_BETA);
    this.taps = [];
    for (let q = 0; q <= this.phases; q++) {
      const t = new Float32Array(2 * this.half);
      let sum = 0;
      for (let j = 0; j < t.length; j++) {
        const d = q / this.phases + this.half - 1 - j; // distance from the output's position
        const x = 2 * fc * d;
        const sinc = x === 0 ? 1 : Math.sin(Math.PI * x) / (Math.PI * x);
        const r = d / this.half;
        const w = Math.abs(r) >= 1 ? 0 : besselI0(KAISER_BETA * Math.sqrt(1 - r * r)) / i0b;
        t[j] = sinc * w;
        sum += t[j];
      }
      for (let j = 0; j < t.length; j++) t[j] /= sum; // unit gain at DC
      this.taps.push(t);
    }
    // input not yet consumed; it starts with half - 1 zeros so that the first output sits on
    // the first input sample
    this.buf = new Float32Array(2 * this.half + 256);
    this.len = this.half - 1;
    this.ipos = this.half - 1; // buffer index of the next output's position
    this.rem = 0; // ... plus rem / up of an input sample
    this.out = new Int16Array(CHUNK);
    this.n = 0;
  }

  emit(v) {
    v = Math.max(-1, Math.min(1, v));
    this.out[this.n++] = Math.round(v * 32767);
    if (this.n === CHUNK) {
      this.port.postMessage(this.out.buffer, [this.out.buffer]);
      this.out = new Int16Array(CHUNK);
      this.n = 0;
    }
  }

  process(inputs) {
    const input = inputs[0];
    if (!input || !input.length) return true;
    const m = input[0].length;
    // a multi-channel source is mixed down to mono
    const mono = new Float32Array(m);
    for (const ch of input) for (let i = 0; i < m; i++) mono[i] += ch[i] / input.length;
    if (this.same) {
      for (let i = 0; i < m; i++) this.emit(mono[i]);
      return true;
    }
    if (this.len + m > this.buf.length) {
      const grown = new Float32Array(2 * (this.len + m));
      grown.set(this.buf.subarray(0, this.len));
      this.buf = grown;
    }
    this.buf.set(mono, this.len);
    this.len += m;
    const buf = this.buf, span = 2 * this.half;
    // an output needs the inputs up to ipos + half
    while (this.ipos + this.half < this.len) {
      const taps = this.taps[Math.round((this.rem * this.phases) / this.up)];
      const k0 = this.ipos - this.half + 1;
      let acc = 0;
      for (let j = 0; j < span; j++) acc += taps[j] * buf[k0 + j];
      this.emit(acc);
      this.rem += this.down;
      this.ipos += Math.floor(this.rem / this.up);
      this.rem %= this.up;
    }
    // keep what the next outputs' taps reach back to
    const keep = this.ipos - this.half + 1;
    if (keep > 0) {
      buf.copyWithin(0, keep, this.len);
      this.len -= keep;
      this.ipos -= keep;
    }
    return true;
  }
}
registerProcessor("pcm16-writer", PCM16Writer);
