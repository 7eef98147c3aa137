"""Where specbeam meets fairseq2: model architectures and checkpoints, asset cards, and
the extension that registers the generators with fairseq2's recipes."""
