"""Text-to-speech behind one small protocol, and sentence splitting for sentence-wise TTS."""
