"""The Qwen3-TTS checkpoint layout both recipes write (docs/qwen3-tts.md §1): the codec and language ids, the
generation and preprocessor configs of the released checkpoints, builders of `config.json` and
`speech_tokenizer/config.json` with the released key set (each value either the published one or given), and the
writer of a checkpoint directory."""
import json
import os
import shutil

SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920          # one 12.5 Hz codec frame

# Codec-track control ids of the talker vocabulary (talker_config.codec_*).
CODEC = dict(pad=2148, bos=2149, eos=2150, think=2154, nothink=2155, think_bos=2156, think_eos=2157)
CODEC_EOS = CODEC["eos"]
# talker_config.codec_language_id of the released checkpoints (dialects last).
LANGS = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
         "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
         "beijing_dialect": 2074, "sichuan_dialect": 2062}
# Text-side special ids of the released tokenizer (docs/qwen3-tts.md §2).
RELEASED_TEXT_IDS = dict(im_start=151644, im_end=151645, tts_pad=151671, tts_bos=151672, tts_eos=151673,
                         assistant=77091)
RELEASED_TEXT_VOCAB = 151936

# generation_config.json of the released checkpoints (docs/qwen3-tts.md §1.4).
GENERATION_CONFIG = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0, "top_k": 50,
                     "subtalker_dosample": True, "subtalker_temperature": 0.9, "subtalker_top_p": 1.0,
                     "subtalker_top_k": 50, "max_new_tokens": 8192}
PREPROCESSOR_CONFIG = {"chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor",
                       "feature_size": 1, "overlap": None, "padding_side": "right", "padding_value": 0.0,
                       "return_attention_mask": True, "sampling_rate": 24000}
# A tiny Mimi encoder: the speech_tokenizer layout needs one; CustomVoice never runs it.
TINY_MIMI_ENCODER = dict(hidden_size=32, num_filters=4, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, head_dim=16, intermediate_size=64, codebook_dim=4,
                         vector_quantization_hidden_dimension=4, upsample_groups=32)


def write_json(path, obj):
    """`obj` as indented UTF-8 JSON with a final newline (the layout of the released config files)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def main_config(*, talker, cp, mrope_section, text_hidden_size, tts_model_type, tts_model_size, ids=None,
                text_vocab_size=RELEASED_TEXT_VOCAB, n_q=16, languages=LANGS, speakers=None, dialects=None,
                speaker_encoder=None):
    """config.json. talker / cp: the talker's and the code predictor's shape keys (hidden_size, intermediate_size,
    num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim); ids: the text special ids
    (RELEASED_TEXT_IDS by default); languages: codec_language_id; speakers: spk_id (CustomVoice), with dialects
    ({speaker: dialect}) for spk_is_dialect; speaker_encoder: overrides of enc_channels, enc_attention_channels,
    enc_se_channels (enc_dim is the talker's hidden size)."""
    ids = ids or RELEASED_TEXT_IDS
    speakers = speakers or {}
    cp_cfg = dict(attention_bias=False, attention_dropout=0.0, hidden_act="silu", initializer_range=0.02,
                  max_position_embeddings=65536, max_window_layers=28, num_code_groups=n_q, rms_norm_eps=1e-06,
                  rope_scaling=None, rope_theta=1000000, sliding_window=None, use_cache=True, use_sliding_window=False,
                  vocab_size=2048, **cp)
    dial = {k: False for k in speakers}
    dial.update(dialects or {})
    talker_cfg = dict(attention_bias=False, attention_dropout=0.0, code_predictor_config=cp_cfg,
                      codec_bos_id=CODEC["bos"], codec_eos_token_id=CODEC["eos"], codec_language_id=dict(languages),
                      codec_nothink_id=CODEC["nothink"], codec_pad_id=CODEC["pad"],
                      codec_think_bos_id=CODEC["think_bos"], codec_think_eos_id=CODEC["think_eos"],
                      codec_think_id=CODEC["think"], hidden_act="silu", initializer_range=0.02,
                      max_position_embeddings=32768, num_code_groups=n_q, position_id_per_seconds=13,
                      rms_norm_eps=1e-06,
                      rope_scaling={"interleaved": True, "mrope_section": list(mrope_section), "rope_type": "default"},
                      rope_theta=1000000, sliding_window=None, spk_id=dict(speakers), spk_is_dialect=dial,
                      text_hidden_size=text_hidden_size, text_vocab_size=text_vocab_size, use_cache=True,
                      use_sliding_window=False, vocab_size=3072, **talker)
    se = speaker_encoder or {}
    spk_enc = dict(mel_dim=128, enc_dim=talker["hidden_size"],
                   enc_channels=se.get("enc_channels", [512, 512, 512, 512, 1536]),
                   enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1],
                   enc_attention_channels=se.get("enc_attention_channels", 128), enc_res2net_scale=8,
                   enc_se_channels=se.get("enc_se_channels", 128), sample_rate=24000)
    # transformers_version 4.57.1: keeps the reference loader on the Qwen2 pre-tokenizer regex (docs/qwen3-tts.md §2)
    return dict(architectures=["Qwen3TTSForConditionalGeneration"], assistant_token_id=ids["assistant"],
                im_end_token_id=ids["im_end"], im_start_token_id=ids["im_start"], model_type="qwen3_tts",
                speaker_encoder_config=spk_enc, talker_config=talker_cfg, tokenizer_type="qwen3_tts_tokenizer_12hz",
                torch_dtype="bfloat16", transformers_version="4.57.1",
                tts_bos_token_id=ids["tts_bos"], tts_eos_token_id=ids["tts_eos"], tts_model_size=tts_model_size,
                tts_model_type=tts_model_type, tts_pad_token_id=ids["tts_pad"])


def speech_tokenizer_config(*, decoder, encoder=TINY_MIMI_ENCODER, n_q=16):
    """speech_tokenizer/config.json: the released decoder and encoder configs (docs/qwen3-tts.md §1.5) with the keys
    of `decoder` / `encoder` replaced; n_q = decoder num_quantizers = encoder_valid_num_quantizers."""
    dec = dict(attention_bias=False, attention_dropout=0.0, codebook_dim=512, codebook_size=2048, decoder_dim=1536,
               head_dim=64, hidden_act="silu", hidden_size=512, intermediate_size=1024, latent_dim=1024,
               layer_scale_initial_scale=0.01, max_position_embeddings=8000, num_attention_heads=16,
               num_hidden_layers=8, num_key_value_heads=16, num_quantizers=n_q, num_semantic_quantizers=1,
               rms_norm_eps=1e-05, rope_theta=10000, semantic_codebook_size=4096, sliding_window=72,
               upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], vector_quantization_hidden_dimension=512)
    enc = dict(_frame_rate=12.5, attention_bias=False, attention_dropout=0.0, audio_channels=1, codebook_dim=256,
               codebook_size=2048, compress=2, dilation_growth_rate=2, head_dim=64, hidden_act="gelu",
               hidden_size=512, initializer_range=0.02, intermediate_size=2048, kernel_size=7, last_kernel_size=3,
               layer_scale_initial_scale=0.01, max_position_embeddings=8000, model_type="mimi", norm_eps=1e-05,
               num_attention_heads=8, num_filters=64, num_hidden_layers=8, num_key_value_heads=8, num_quantizers=32,
               num_residual_layers=1, num_semantic_quantizers=1, pad_mode="constant", residual_kernel_size=3,
               rope_theta=10000.0, sampling_rate=24000, sliding_window=250, trim_right_ratio=1.0,
               upsample_groups=512, upsampling_ratios=[8, 6, 5, 4], use_cache=False, use_causal_conv=True,
               use_conv_shortcut=False, use_streaming=False, vector_quantization_hidden_dimension=256)
    dec.update(decoder)
    enc.update(encoder)
    return dict(architectures=["Qwen3TTSTokenizerV2Model"], model_type="qwen3_tts_tokenizer_12hz",
                decode_upsample_rate=1920, decoder_config=dec, encode_downsample_rate=1920, encoder_config=enc,
                encoder_valid_num_quantizers=n_q, input_sample_rate=24000, output_sample_rate=24000,
                transformers_version="4.57.1")


def write_checkpoint_dir(out_dir, model, codec, config, codec_config, tokenizer_dir, codec_dtype="f32"):
    """Writes a checkpoint directory in the released layout (docs/qwen3-tts.md §1.2), replacing `out_dir`:
    model.safetensors (the state of `model`, a Qwen3TTSForConditionalGeneration, in bf16), speech_tokenizer/
    model.safetensors (`codec`, a Qwen3TTSTokenizerV2Model, in f32, or in bf16 with codec_dtype="bf16": loaders
    upcast it and the decoder computes in f32 as for the released checkpoints), the two configs given, generation_config.json,
    preprocessor_config.json, and the tokenizer files of `tokenizer_dir`. Returns the two state dicts as written."""
    import torch
    from safetensors.torch import save_file
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(os.path.join(out_dir, "speech_tokenizer"))
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    cdt = {"f32": torch.float32, "bf16": torch.bfloat16}[codec_dtype]
    csd = {k: v.detach().to(cdt).contiguous() for k, v in codec.state_dict().items()}
    save_file(csd, os.path.join(out_dir, "speech_tokenizer", "model.safetensors"), metadata={"format": "pt"})
    write_json(os.path.join(out_dir, "config.json"), config)
    write_json(os.path.join(out_dir, "generation_config.json"), GENERATION_CONFIG)
    write_json(os.path.join(out_dir, "speech_tokenizer", "config.json"), codec_config)
    write_json(os.path.join(out_dir, "speech_tokenizer", "preprocessor_config.json"), PREPROCESSOR_CONFIG)
    for f in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tokenizer_dir, f), os.path.join(out_dir, f))
    return sd, csd
