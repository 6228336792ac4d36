"""Speech recognition: Whisper backends, SpecASR decoding, streaming with LocalAgreement."""
