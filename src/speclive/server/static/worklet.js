// AudioWorklet: microphone samples at the context's rate -> 16 kHz PCM16 chunks of 100 ms.
// Linear interpolation with the fractional read position carried across blocks.
class PCM16Writer extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / 16000;   // input samples per output sample
    this.pos = 0;                     // read position into `prev ++ block`
    this.prev = 0;                    // last sample of the previous block
    this.out = new Int16Array(1600);
    this.n = 0;
  }
  process(inputs) {
    const ch = inputs[0] && inputs[0][0];
    if (!ch) return true;
    // sample i of the virtual signal: i == 0 is `prev`, i >= 1 is ch[i - 1]
    while (this.pos <= ch.length - 1) {
      const i = Math.floor(this.pos), f = this.pos - i;
      const a = i === 0 ? this.prev : ch[i - 1], b = ch[i];
      const v = Math.max(-1, Math.min(1, a + (b - a) * f));
      this.out[this.n++] = v < 0 ? v * 32768 : v * 32767;
      if (this.n === this.out.length) {
        this.port.postMessage(this.out.buffer, [this.out.buffer]);
        this.out = new Int16Array(1600);
        this.n = 0;
      }
      this.pos += this.step;
    }
    this.pos -= ch.length;
    this.prev = ch[ch.length - 1];
    return true;
  }
}
registerProcessor("pcm16-writer", PCM16Writer);
