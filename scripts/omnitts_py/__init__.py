"""omnitts' Python side: the two recipes that build Qwen3-TTS checkpoints with the official reference classes
(qwen-tts 0.1.1, transformers 4.57.3), sharing what they both need once.

- `layout`: the checkpoint layout (ids, configs, the directory writer), `qwen_stack`: importing the reference;
- `fixtures`: tests/fixtures/generate.py, the tiny checkpoints and the reference's records on them;
- `voice`: scripts/voice/train.py, the bundled voice's training recipe, one module per step.

The commands stay `python tests/fixtures/generate.py` and `python scripts/voice/train.py STEP`; both put this
package's parent folder on `sys.path`."""
