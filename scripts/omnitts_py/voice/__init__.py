"""scripts/voice/train.py, one module per step: `tokenizer`, `quantizer`, `codec`, `codes`, `talker`, `export`,
`check`, `roundtrip`, `probe`; shared: `common` (presets, speaker, optimiser, schedule, log), `configs` (the
voice's config files), `data` (manifest, audio, codes files); `cli` runs them (its docstring is the recipe)."""
