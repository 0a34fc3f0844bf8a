"""The voice's config.json and speech_tokenizer/config.json: the released layout (omnitts_py.layout) with the size
preset's shapes, the trained tokenizer's ids, one speaker and the training language."""
from .. import layout
from ..layout import LANGS
from .common import SPEAKER, SPEAKER_ID, TRAIN_LANGUAGE


def main_config(size, ids):
    """config.json of a CustomVoice 0.6B-type checkpoint of the preset `size` with the special ids of the trained
    tokenizer (tokenizer.special_ids)."""
    return layout.main_config(
        talker=size["talker"], cp=size["cp"], mrope_section=size["mrope_section"],
        text_hidden_size=size["text_hidden_size"], tts_model_type="custom_voice", tts_model_size="0b6",
        ids=ids, text_vocab_size=ids["text_vocab_size"], n_q=size["n_q"],
        languages={TRAIN_LANGUAGE: LANGS[TRAIN_LANGUAGE]}, speakers={SPEAKER: SPEAKER_ID})


def speech_tokenizer_config(size):
    """speech_tokenizer/config.json of the preset `size` (its decoder, the tiny Mimi encoder)."""
    return layout.speech_tokenizer_config(decoder=size["dec"], n_q=size["n_q"])
