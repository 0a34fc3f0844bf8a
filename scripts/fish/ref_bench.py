#!/usr/bin/env python3
"""Times the official Fish Audio S2 reference (fishaudio/fish-speech, imported from outside the
repository) on a checkpoint directory written by real_shape.py (or any S2 checkpoint), batch 1,
exactly --frames frames a run, so that omnitts and the reference can be compared on identical
weights.

    FISH_SPEECH=/path/to/fish-speech python3 scripts/fish/ref_bench.py --ckpt /tmp/s2pro \
        --frames 200 --repeats 2 [--mode both] [--compile]
    # CPU check (f32): --device cpu --ckpt /tmp/s2small --frames 16

How it runs the reference: the Python API its CLI uses (fish_speech.models.text2semantic.
inference): init_model(dir, device, dtype[, compile]) + model.setup_caches(1, max_seq_len), the
prompt built as generate_long builds it (system "convert the provided text to speech", the user
turn, then `<|im_start|>assistant\\n<|voice|>`), then inference.generate(...) - the function
generate_long calls for each batch - and for the codec load_codec_model (its own
configs/modded_dac_vq.yaml; a codec_config.yaml in the directory, as small checkpoints have, is
used instead, as make_tiny.load_codec does) + decode_to_audio on every generated frame.
generate() is called directly rather than generate_long, so that all --frames frames come back
(generate_long drops the last one) and nothing but generation is timed (no prompt visualisation).

EOS: generate() builds a bias that is 0 on the semantic tokens and <|im_end|> and -inf elsewhere,
and passes that one tensor to the prefill (module-level decode_one_token_ar) and to every decode
step. This script wraps the prefill function and sets the bias at <|im_end|> to -inf in place
before the first call, so <|im_end|> can never be sampled (the stop test in decode_n_tokens never
fires) and each run generates exactly --frames frames (1 prefill + frames-1 decode steps). The
model, the sampler and the compiled function are untouched.

Sampling: `greedy` = top_k 1 (temperature 0.7, top_p 0.9; the repetition-aware fallback then is
the argmax too); `sample` = the CLI's defaults (temperature 1.0, top_p 0.9, top_k 30).

Reported (one JSON line at the end, plus one per run):
  ttff_ms      prefill + first frame (the reference's prefill call samples frame 0's 10 codes)
  ms_per_frame decode steps only: wall time of the frames-1 steps / (frames-1)
  slow_ms, fast_ms, other_ms (eager only, from the last repeat; step_ms their sum): CUDA-event
               times inside each step: the slow AR
               forward (forward_generate), the 10 fast-AR forwards (forward_generate_fast), and
               the rest (sampling, embeddings, cache clears). Not available with --compile (the
               whole step is one compiled graph)
  eager-seqN   (--short-seq-len N) eager greedy again with the KV cache cut to N positions: the
               reference's decode step attends over every cache position (max_seq_len of them,
               repeat_interleave'd from 8 to 32 heads in each layer), omnitts' over the filled ones
  decode_ms    codec decode of all frames (decode_to_audio); first call and a second call
               (codec_weights_and_buffers_gib: the codec on the GPU, 3.1 GiB of it three 1 GiB
               bool causal masks of 32768 x 32768 that modded_dac.Transformer builds whatever the
               yaml's block_size (never read at this commit) and decoding never uses; the decode
               itself builds a frames x frames window mask: no care needed for 200 frames)
  rtf          (generation wall + codec decode) / audio seconds at 44.1 kHz, 2048 samples a frame;
               rtf_llm without the codec
  peak GPU memory (allocated / reserved), LLM phase and codec phase separately
--compile: the reference's own compile (init_model(compile=True) does exactly
torch.compile(decode_one_token_ar, backend="inductor", mode="reduce-overhead" (CUDA graphs),
fullgraph=True); this script makes the same call on the same function, so that the eager and the
compiled runs share one loaded model). The eager modes run first, then the compiled ones
(--compile-modes, greedy by default: each mode is one more compile, since top_k is a Python
constant). The first run of each compiled mode compiles: minutes on a cold cache (the reference
turns on inductor's coordinate-descent tuning); a short warm-up run absorbs it and its time is
reported as warmup_s. --compile-only skips the eager runs.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_tiny as mt  # noqa: E402

SAMPLE_RATE = 44100
HOP = 2048
MODES = {
    "greedy": dict(temperature=0.7, top_p=0.9, top_k=1),
    "sample": dict(temperature=1.0, top_p=0.9, top_k=30),
}
DEFAULT_TEXT = ("Hello world. This is a small test of speech synthesis, with numbers like 42 "
                "and 2026! The quick brown fox jumps over the lazy dog.")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


class Timer:
    """Wall clock with device syncs (CUDA) around the timed span."""

    def __init__(self, cuda):
        self.cuda = cuda

    def sync(self):
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def now(self):
        self.sync()
        return time.perf_counter()


class StepEvents:
    """CUDA events around forward_generate / forward_generate_fast (eager mode only)."""

    def __init__(self, model, cuda):
        import torch

        self.model, self.cuda, self.torch = model, cuda, torch
        self.records = []  # per call: (kind, start, end)
        self._fg, self._ff = model.forward_generate, model.forward_generate_fast
        model.forward_generate = self._wrap(self._fg, "slow")
        model.forward_generate_fast = self._wrap(self._ff, "fast")

    def _mark(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def _wrap(self, fn, kind):
        def w(*a, **k):
            s = self._mark()
            r = fn(*a, **k)
            self.records.append((kind, s, self._mark()))
            return r

        return w

    def step_mark(self):
        self.records.append(("step", self._mark(), None))

    def elapsed(self, s, e):
        if self.cuda:
            return s.elapsed_time(e)
        return (e - s) * 1000

    def close(self):  # back to the class's methods (what torch.compile later traces)
        del self.model.forward_generate, self.model.forward_generate_fast


def split_steps(events, timer):
    """Mean slow / fast / other times of the decode steps (all but the last, which has no end
    mark), from the CUDA events of StepEvents."""
    timer.sync()
    steps, cur = [], None
    for kind, s, e in events.records:
        if kind == "step":
            cur = {"slow": 0.0, "fast": 0.0, "start": s}
            steps.append(cur)
        elif cur is not None:
            cur[kind] += events.elapsed(s, e)
    full = []
    for i in range(len(steps) - 1):
        steps[i]["total"] = events.elapsed(steps[i]["start"], steps[i + 1]["start"])
        full.append(steps[i])
    if not full:
        return {}
    r = {"slow_ms": round(statistics.mean(s["slow"] for s in full), 3),
         "fast_ms": round(statistics.mean(s["fast"] for s in full), 3),
         "step_ms": round(statistics.mean(s["total"] for s in full), 3)}
    r["other_ms"] = round(r["step_ms"] - r["slow_ms"] - r["fast_ms"], 3)
    return r


def build_prompt(model, text, ref_frames, seed):
    import torch
    from fish_speech.content_sequence import TextPart, VQPart
    from fish_speech.conversation import Conversation, Message

    conv = Conversation()
    if ref_frames:
        g = torch.Generator().manual_seed(seed)
        codes = torch.cat([torch.randint(0, 4096, (1, ref_frames), generator=g),
                           torch.randint(0, 1024, (9, ref_frames), generator=g)])
        parts = [
            TextPart(text="convert the provided text to speech reference to the following:\n\n"
                     "Text:\n", cal_loss=False),
            TextPart(text="<|speaker:0|>The quick brown fox.", cal_loss=False),
            TextPart(text="\n\nSpeech:\n", cal_loss=False),
            VQPart(codes=codes, cal_loss=False),
        ]
    else:
        parts = [TextPart(text="convert the provided text to speech", cal_loss=False)]
    conv.append(Message(role="system", parts=parts, cal_loss=False, add_im_start=True,
                        add_im_end=True))
    conv.append(Message(role="user", parts=[TextPart(text=text, cal_loss=False)],
                        cal_loss=False, add_im_start=True, add_im_end=True))
    conv.append(Message(role="assistant", parts=[], cal_loss=False, modality="voice",
                        add_im_start=True, add_im_end=False))
    return conv.encode_for_inference(model.tokenizer, num_codebooks=model.config.num_codebooks)


def load_codec(ckpt: Path, device, dtype):
    import torch
    from fish_speech.models.text2semantic import inference as inf

    yaml = ckpt / "codec_config.yaml"
    if not yaml.exists():  # the real layout: the reference's own loader and config
        codec = inf.load_codec_model(str(ckpt / "codec.pth"), device, dtype)
        which = "configs/modded_dac_vq.yaml (load_codec_model)"
    else:
        codec = mt.load_codec(ckpt).to(device=device, dtype=dtype)
        which = "codec_config.yaml"
    sd = torch.load(str(ckpt / "codec.pth"), map_location="cpu")
    want = {k for k in codec.state_dict() if not k.endswith(("freqs_cis", "causal_mask"))}
    missing, unexpected = sorted(want - set(sd)), sorted(set(sd) - want)
    assert not missing and not unexpected, f"codec keys: missing {missing[:5]} unexpected {unexpected[:5]}"
    return codec, which


def check_llm_keys(model, ckpt: Path):
    """The reference loads with strict=False: check that every parameter came from the file."""
    from fish_speech.models.text2semantic.llama import _remap_fish_qwen3_omni_keys

    index = ckpt / "model.safetensors.index.json"
    names = json.loads(index.read_text())["weight_map"]
    got = set(_remap_fish_qwen3_omni_keys({k: None for k in names}))
    want = {k for k in model.state_dict()
            if k not in ("freqs_cis", "causal_mask", "fast_freqs_cis") and "kv_cache" not in k}
    missing, unexpected = sorted(want - got), sorted(got - want)
    assert not missing and not unexpected, f"LLM keys: missing {missing[:5]} unexpected {unexpected[:5]}"
    return len(want)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--device", default=None, help="cuda if available, else cpu")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default=None,
                    help="bf16 on cuda, f32 on cpu (the default)")
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--mode", choices=["greedy", "sample", "both"], default="both")
    ap.add_argument("--compile", action="store_true",
                    help="also run the reference's torch.compile path (after the eager runs)")
    ap.add_argument("--compile-only", action="store_true", help="--compile without eager runs")
    ap.add_argument("--compile-modes", choices=["greedy", "sample", "both"], default="greedy")
    ap.add_argument("--max-seq-len", type=int, default=None,
                    help="override config.json's text_config.max_seq_len (the KV cache length; "
                    "the reference's decode cost grows with it)")
    ap.add_argument("--short-seq-len", type=int, default=0,
                    help="also run eager greedy with the KV cache cut to this many positions "
                    "(variant eager-seqN; the reference's decode attends over the whole cache, "
                    "omnitts' over the filled positions only); 0: off")
    ap.add_argument("--text", default=DEFAULT_TEXT)
    ap.add_argument("--ref-frames", type=int, default=0,
                    help="a clone-style prompt with this many (random) reference frames")
    ap.add_argument("--warmup-frames", type=int, default=8)
    ap.add_argument("--no-codec", action="store_true")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json-out", default=None, help="also write the summary JSON here")
    args = ap.parse_args()

    mt._import_reference()
    import torch
    from fish_speech.models.text2semantic import inference as inf
    from fish_speech.models.text2semantic.llama import DualARTransformer
    from fish_speech.tokenizer import IM_END_TOKEN

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    dtype_name = args.dtype or ("bf16" if cuda else "f32")
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype_name]
    ckpt = Path(args.ckpt)
    timer = Timer(cuda)
    if not cuda:
        torch.set_num_threads(os.cpu_count() or 1)

    if args.max_seq_len:  # init_model has no such argument; from_pretrained has
        orig_fp = DualARTransformer.from_pretrained

        def fp(path, load_weights=False, max_length=None, **k):
            return orig_fp(path, load_weights=load_weights, max_length=args.max_seq_len, **k)

        DualARTransformer.from_pretrained = staticmethod(fp)

    # ---- the LLM, as the CLI loads it
    t0 = timer.now()
    model, decode_one_token = inf.init_model(str(ckpt), device, dtype, compile=False)
    with torch.device(device):
        model.setup_caches(max_batch_size=1, max_seq_len=model.config.max_seq_len,
                           dtype=next(model.parameters()).dtype)
    t_load = timer.now() - t0
    n_checked = check_llm_keys(model, ckpt)
    im_end = model.tokenizer.get_token_id(IM_END_TOKEN)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"loaded {n_params / 1e9:.3f} B parameters ({n_checked} tensors, all from the file) in "
        f"{t_load:.1f} s; max_seq_len {model.config.max_seq_len}; im_end {im_end}; "
        f"semantic {model.config.semantic_begin_id}..{model.config.semantic_end_id}")

    encoded, audio_masks, audio_parts = build_prompt(model, args.text, args.ref_frames, args.seed)
    prompt_len = encoded.shape[1]
    if prompt_len + args.frames > model.config.max_seq_len:
        sys.exit(f"prompt {prompt_len} + {args.frames} frames > max_seq_len")

    # ---- EOS unreachable, and the prefill timed
    orig_prefill = inf.decode_one_token_ar
    marks = {}

    def prefill(model_, x, input_pos, temperature, top_p, top_k, semantic_logit_bias, *rest, **kw):
        semantic_logit_bias[..., im_end] = float("-inf")
        marks["prefill_start"] = timer.now()
        r = orig_prefill(model_, x, input_pos, temperature, top_p, top_k, semantic_logit_bias,
                         *rest, **kw)
        marks["prefill_end"] = timer.now()
        return r

    inf.decode_one_token_ar = prefill

    def run(mode, frames, events, fn):
        torch.manual_seed(args.seed)
        if cuda:
            torch.cuda.manual_seed(args.seed)
        def marked(*a, **k):
            events.step_mark()
            return fn(*a, **k)

        step_fn = fn if events is None else marked
        t_start = timer.now()
        y = inf.generate(model=model, prompt=encoded.to(device), max_new_tokens=frames,
                         audio_masks=audio_masks, audio_parts=audio_parts,
                         decode_one_token=step_fn, **MODES[mode])
        t_end = timer.now()
        codes = y[1:, prompt_len:].clone()
        assert codes.shape[1] == frames, (codes.shape, frames)
        assert not (y[0, prompt_len:] == im_end).any()
        return codes, t_start, t_end

    def modes_of(m):
        return ["greedy", "sample"] if m == "both" else [m]

    variants = []  # (name, step function, modes, KV cache positions)
    full_seq = model.config.max_seq_len
    if not args.compile_only:
        variants.append(("eager", decode_one_token, modes_of(args.mode), full_seq))
        n = args.short_seq_len
        if n and n < full_seq:
            if prompt_len + max(args.frames, args.warmup_frames) > n:
                log(f"--short-seq-len {n}: shorter than the prompt + frames; skipped")
            else:
                variants.append((f"eager-seq{n}", decode_one_token, ["greedy"], n))
    if args.compile or args.compile_only:
        # init_model(compile=True)'s call, on the same (unwrapped) function
        compiled = torch.compile(
            orig_prefill,
            backend="inductor" if torch.cuda.is_available() else "aot_eager",
            mode="reduce-overhead" if torch.cuda.is_available() else None,
            fullgraph=True,
        )
        variants.append(("compiled", compiled, modes_of(args.compile_modes), full_seq))
    audio_s = args.frames * HOP / SAMPLE_RATE
    results, last_codes = [], None
    state = {"llm_mem": {}, "codec": {}}

    def measure_codec():
        """The codec decode of the last run's frames (once, after the first variant)."""
        if cuda:
            state["llm_mem"] = {
                "llm_peak_alloc_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                "llm_peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2)}
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        t0 = timer.now()
        codec, which = load_codec(ckpt, device, dtype)
        t_codec_load = timer.now() - t0
        dec = []
        for _ in range(2):
            t0 = timer.now()
            with torch.inference_mode():
                wav = inf.decode_to_audio(last_codes.to(device), codec)
            dec.append(timer.now() - t0)
        assert wav.shape[0] == args.frames * HOP, wav.shape
        info = {"codec_config": which, "codec_load_s": round(t_codec_load, 2),
                "decode_frames": int(last_codes.shape[1]),
                "decode_ms_first": round(dec[0] * 1000, 1), "decode_ms": round(dec[1] * 1000, 1),
                "wav_finite": bool(torch.isfinite(wav.float()).all())}
        if cuda:
            info["codec_peak_extra_gib"] = round(
                (torch.cuda.max_memory_allocated() - before) / 2**30, 2)
            info["codec_weights_and_buffers_gib"] = round(
                sum(t.numel() * t.element_size() for t in
                    list(codec.parameters()) + list(codec.buffers())) / 2**30, 2)
        state["codec"] = info
        del codec, wav
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def summary(final):
        s = {
            "bench": "fish-speech reference", "complete": final, "ckpt": str(ckpt),
            "device": device, "gpu": torch.cuda.get_device_name() if cuda else None,
            "dtype": dtype_name, "torch": torch.__version__, "params_b": round(n_params / 1e9, 3),
            "max_seq_len": full_seq, "frames": args.frames,
            "audio_s": round(audio_s, 3), "load_s": round(t_load, 1), **state["llm_mem"],
            **state["codec"], "modes": {},
        }
        if cuda:
            s["peak_alloc_gib_since_codec"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        for variant, mode in dict.fromkeys((r["variant"], r["mode"]) for r in results):
            rs = [r for r in results if r["mode"] == mode and r["variant"] == variant]
            best = min(rs, key=lambda r: r["ms_per_frame"])
            m = {k: best[k] for k in ("kv_positions", "ttff_ms", "ms_per_frame", "gen_wall_s",
                                      "warmup_s")}
            for r in rs:
                for k in ("slow_ms", "fast_ms", "other_ms", "step_ms"):
                    if k in r:
                        m[k] = r[k]
            m["ms_per_frame_all"] = [r["ms_per_frame"] for r in rs]
            m["ttff_ms_all"] = [r["ttff_ms"] for r in rs]
            m["rtf_llm"] = round(best["gen_wall_s"] / audio_s, 4)
            if state["codec"]:
                m["rtf"] = round((best["gen_wall_s"] + state["codec"]["decode_ms"] / 1000)
                                 / audio_s, 4)
            s["modes"][f"{variant}/{mode}"] = m
        line = json.dumps(s)
        if args.json_out:  # rewritten after each variant: a killed run keeps what it measured
            Path(args.json_out).write_text(line + "\n")
        return line

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    def set_seq_len(n):
        """The KV cache (and the attention mask's width) cut or restored to n positions, as
        init_model with from_pretrained(max_length=n) would have made them."""
        if model.config.max_seq_len == n:
            return
        model.config.max_seq_len = n
        model.max_seq_len = -1
        with torch.device(device):
            model.setup_caches(max_batch_size=1, max_seq_len=n,
                               dtype=next(model.parameters()).dtype)
        if cuda:
            torch.cuda.empty_cache()

    for variant, fn, modes, seq_len in variants:
        set_seq_len(seq_len)
        for mode in modes:
            tw = timer.now()
            run(mode, args.warmup_frames, None, fn)  # warm-up (and the compile)
            warmup_s = timer.now() - tw
            for rep in range(args.repeats):
                # the slow/fast split on the last repeat only (its events cost a few µs a step)
                split = variant.startswith("eager") and (rep == args.repeats - 1 or args.repeats == 1)
                events = StepEvents(model, cuda) if split else None
                try:
                    codes, t_start, t_end = run(mode, args.frames, events, fn)
                finally:
                    if events is not None:
                        events.close()
                ttff = marks["prefill_end"] - t_start
                decode_wall = t_end - marks["prefill_end"]
                r = {
                    "variant": variant, "mode": mode, "repeat": rep, "frames": args.frames,
                    "kv_positions": model.max_seq_len,
                    "prompt_len": prompt_len, "ttff_ms": round(ttff * 1000, 2),
                    "prefill_call_ms": round((marks["prefill_end"] - marks["prefill_start"]) * 1000, 2),
                    "ms_per_frame": round(decode_wall * 1000 / max(1, args.frames - 1), 3),
                    "gen_wall_s": round(t_end - t_start, 3),
                    "warmup_s": round(warmup_s, 2),
                }
                if events is not None:
                    r.update(split_steps(events, timer))
                log(json.dumps(r))
                results.append(r)
                last_codes = codes
            summary(False)
        if not args.no_codec and not state["codec"]:
            measure_codec()
            log(json.dumps(state["codec"]))
        summary(False)
    print(summary(True), flush=True)

if __name__ == "__main__":
    main()
