"""Step `talker`: talker + code predictor trained on (text, codes) in the non-streaming CustomVoice prompt format, and
the teacher-forced talker the other steps reuse (ground-truth-aligned codes, probes)."""
import json
import os
import random
import time

import torch

from ..layout import CODEC, LANGS
from .common import SPEAKER_ID, TRAIN_LANGUAGE, amp, log, lr_factor, make_adamw
from .configs import main_config
from .data import load_codes
from .tokenizer import load_tokenizer, special_ids, text_body_ids


def build_example(tok, ids, text, codes, language):
    """Text-track ids, codec-track ids and masks for one utterance in the non-streaming CustomVoice prompt
    (docs/qwen3-tts.md §3.4):
      role (3):        T(im_start) T(assistant) T(\\n)                     no codec part
      tags (m-1):      P+K..., P+C(speaker), B+C(pad)                     K = think,think_bos,LANG,think_eos | nothink,think_bos,think_eos
      text (n+2):      T(x_i)+C(pad) ..., E+C(pad), P+C(bos)
      frames (F):      P + sum_q Emb_q(codes[f, q])
      end (1):         P + C(eos)   (input of the position after the last frame; never predicted from)
    Labels (HF causal shift inside the loss): label[p] = codebook-0 code at frame positions, EOS at the end row."""
    head, body = text_body_ids(tok, text)
    if language == "auto":
        K = [CODEC["nothink"], CODEC["think_bos"], CODEC["think_eos"]]
    else:
        K = [CODEC["think"], CODEC["think_bos"], LANGS[language], CODEC["think_eos"]]
    tags_codec = K + [SPEAKER_ID, CODEC["pad"]]
    text_tr = list(head) + [ids["tts_pad"]] * (len(tags_codec) - 1) + [ids["tts_bos"]]
    codec_tr = [-1] * 3 + tags_codec
    text_tr += list(body) + [ids["tts_eos"], ids["tts_pad"]]
    codec_tr += [CODEC["pad"]] * (len(body) + 1) + [CODEC["bos"]]
    F = codes.shape[0]
    first = len(text_tr)
    text_tr += [ids["tts_pad"]] * (F + 1)
    codec_tr += [-2] * F + [CODEC["eos"]]          # -2: frame rows (sum of codebook embeddings)
    labels = [-100] * first + [int(c) for c in codes[:, 0]] + [CODEC["eos"]]
    return dict(text=text_tr, codec=codec_tr, labels=labels, first=first, codes=codes)


def example_tensors(e):
    """build_example's lists as tensors (built once per utterance and cached; collate then only pads)."""
    return dict(text=torch.tensor(e["text"]), codec=torch.tensor(e["codec"]), labels=torch.tensor(e["labels"]),
                first=e["first"], codes=e["codes"].long())


def collate(exs, dev):
    """Pads example_tensors() of one batch to its longest prompt: text/codec ids, labels, attention mask, the frame
    codes [B, L, n_q] at the frame rows and their mask."""
    from torch.nn.utils.rnn import pad_sequence
    B = len(exs)
    text = pad_sequence([e["text"] for e in exs], batch_first=True)
    codec = pad_sequence([e["codec"] for e in exs], batch_first=True, padding_value=-1)
    labels = pad_sequence([e["labels"] for e in exs], batch_first=True, padding_value=-100)
    L = text.shape[1]
    lens = torch.tensor([len(e["text"]) for e in exs])
    att = (torch.arange(L)[None] < lens[:, None]).long()
    n_q = exs[0]["codes"].shape[1]
    frames = torch.zeros(B, L, n_q, dtype=torch.long)
    fmask = torch.zeros(B, L, dtype=torch.bool)
    for i, e in enumerate(exs):
        F = e["codes"].shape[0]
        frames[i, e["first"]:e["first"] + F] = e["codes"]
        fmask[i, e["first"]:e["first"] + F] = True
    return [t.to(dev, non_blocking=True) for t in (text, codec, labels, att, frames, fmask)]


def talker_forward(model, batch, resid_noise=0.0):
    """The talker teacher-forced on one collated batch. resid_noise: the share of frames whose residual codes
    (codebooks 1..n_q-1) in the talker's *input* are replaced by uniformly random codes (targets stay true). At
    inference those inputs are the code predictor's own samples, which carry nothing the talker's state did not
    already hold, only sampling noise; a talker trained on the true residuals learns to read them (for k-means
    residuals they nearly identify the utterance) and derails on sampled ones.
    Returns (the talker's output incl. its codebook-0 CE, the hidden states [N, hidden] that predict the N frames,
    the frames' true codes [N, n_q])."""
    text, codec, labels, att, frames, fmask = batch
    t = model.talker
    emb = t.text_projection(t.model.text_embedding(text)) * att[..., None]
    cmask = (codec >= 0)[..., None]
    emb = emb + t.model.codec_embedding(codec.clamp(min=0)) * cmask
    frames_in = frames
    if resid_noise > 0:
        noisy = torch.rand(frames.shape[:2], device=frames.device) < resid_noise
        rnd = torch.randint_like(frames[..., 1:], 0, t.code_predictor.get_input_embeddings()[0].num_embeddings)
        frames_in = torch.cat([frames[..., :1], torch.where(noisy[..., None], rnd, frames[..., 1:])], -1)
    femb = t.model.codec_embedding(frames_in[..., 0])
    for q in range(1, frames.shape[-1]):
        femb = femb + t.code_predictor.get_input_embeddings()[q - 1](frames_in[..., q])
    emb = emb + femb * fmask[..., None]
    out = t(inputs_embeds=emb, attention_mask=att, labels=labels, output_hidden_states=True)
    hidden = out.hidden_states[0][-1][:, :-1]        # hidden at p-1 predicts the frame at p
    return out, hidden[fmask[:, 1:]], frames[fmask]


def talker_loss(model, batch, resid_noise=0.0):
    """Codebook-0 CE (incl. EOS) and code-predictor CE of one collated batch (resid_noise: see talker_forward)."""
    out, h, c = talker_forward(model, batch, resid_noise)
    # forward_sub_talker_finetune's own loss goes through the causal-LM loss, which shifts the labels by one
    # more position (lm_head[i-1] at position i would learn code i+1); the logits are right, so score them here.
    logits, _ = model.talker.forward_sub_talker_finetune(c, h)            # [N, n_q-1, 2048]: logits[:, i-1] -> code i
    sub_loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 c[:, 1:].reshape(-1))
    return out.loss, sub_loss


def greedy_residuals(model, h, code0):
    """The code predictor's greedy residual codes (codebooks 1..n_q-1) for frames whose talker hidden states h
    [N, hidden] and codebook-0 codes code0 [N] are given: what inference decodes when the talker picks code0
    (generation_config subtalker_dosample=false). The code predictor is causal, so filling one codebook per pass
    of forward_sub_talker_finetune is exactly its autoregressive greedy loop. Returns [N, n_q] codes."""
    n_q = model.talker.config.num_code_groups
    c = torch.zeros(len(code0), n_q, dtype=torch.long, device=code0.device)
    c[:, 0] = code0
    for i in range(1, n_q):
        logits, _ = model.talker.forward_sub_talker_finetune(c, h)
        c[:, i] = logits[:, i - 1].argmax(-1)
    return c


def gta_codes(model, tok, ids, data, dev, batch=32):
    """Ground-truth-aligned codes for decoder training: for every utterance of `data` (dicts with text and codes
    [T, n_q]), its true codebook-0 codes with the residual codebooks replaced by what the code predictor greedily
    predicts from the talker teacher-forced on them. As at inference, each frame's input to the talker holds the
    residual codes predicted for it: a first pass with random residual inputs (what the talker was trained on,
    --resid-noise 1) predicts them, a second pass reads them and predicts again. The decoder then learns from the
    residual codes it gets at inference, with the true audio as target (as Tacotron 2 trains its WaveNet on
    ground-truth-aligned predictions). Returns a list of [T, n_q] int16 tensors."""
    out = []
    with torch.no_grad():
        for b in range(0, len(data), batch):
            exs = [example_tensors(build_example(tok, ids, d["text"], d["codes"], "english"))
                   for d in data[b:b + batch]]
            frames = [e["codes"].shape[0] for e in exs]
            _, h, c = talker_forward(model, collate(exs, dev), resid_noise=1.0)
            for e, p in zip(exs, greedy_residuals(model, h, c[:, 0]).cpu().split(frames)):
                e["codes"] = p
            _, h, c = talker_forward(model, collate(exs, dev))
            out += greedy_residuals(model, h, c[:, 0]).to(torch.int16).cpu().split(frames)
    return out


def gta_replace(a, ns, size, dev, rows, mel_codes):
    """--gta-from: mel_codes (per utterance [T, n_q], or [T, 1] from a quantizer that holds codebook 0 only) with
    their residual codebooks replaced by gta_codes() of the talker of the export a.gta_from (tokenizer from
    WORK/tok). Returns [T, n_q] int16 codes per utterance."""
    n_q = size["n_q"]
    full = bool(mel_codes) and mel_codes[0].shape[1] == n_q
    if not full:
        # the talker reads random residual inputs anyway (resid_noise=1), so only codebook 0 has to be real
        mel_codes = [torch.nn.functional.pad(c, (0, n_q - c.shape[1])) for c in mel_codes]
    tok_dir = os.path.join(a.work, "tok")
    tok, ids = load_tokenizer(tok_dir), special_ids(tok_dir)
    model = build_talker(ns, size, ids).to(dev)
    load_export_weights(model, a.gta_from)
    model.eval()
    torch.manual_seed(a.seed)                       # the first pass's random residual inputs
    t0 = time.time()
    data = [dict(text=r["text"], codes=c.long()) for r, c in zip(rows, mel_codes)]
    pred = gta_codes(model, tok, ids, data, dev)
    same = ""
    if full:
        eq = sum(int((p[:, 1:] == c[:, 1:].to(p.dtype)).sum()) for p, c in zip(pred, mel_codes))
        same = f"; {100 * eq / max(sum(c[:, 1:].numel() for c in mel_codes), 1):.1f} % equal to the quantizer's"
    log(f"gta: residual codes of {len(pred)} utterances from {a.gta_from} ({time.time() - t0:.0f} s{same})")
    return pred


def build_talker(ns, size, ids):
    """The official Qwen3TTSForConditionalGeneration (talker + code predictor) of the size preset, f32, untrained."""
    cfg = ns.Qwen3TTSConfig(**json.loads(json.dumps(main_config(size, ids))))
    return ns.Qwen3TTSForConditionalGeneration._from_config(cfg, dtype=torch.float32)


# What a talker trained on other codes can pass on (`talker --init-from DIR --init-transfer`): the text side, the
# transformer layers and the control rows of the codec track (think tags, languages, speaker: ids >= 2048), not the
# code rows or the code predictor's per-codebook tables and heads, whose codes mean something else now.
CODE_ROWS = 2048
CODE_TABLES = ("talker.code_predictor.lm_head.", "talker.code_predictor.model.codec_embedding.")


def load_export_weights(model, export_dir, transfer=False):
    """An exported checkpoint's model.safetensors (bf16) into `model` (as f32). transfer=True: only what carries over
    to new codes (CODE_TABLES, CODE_ROWS), the rest keeps its fresh initialisation; a tensor missing from the file
    (e.g. a carried file with the code tables left out) is then fine too."""
    from safetensors.torch import load_file
    sd = {k: v.float() for k, v in load_file(os.path.join(export_dir, "model.safetensors")).items()}
    if not transfer:
        model.load_state_dict(sd)
        return
    own = model.state_dict()
    n = 0
    for k, v in sd.items():
        if k.startswith(CODE_TABLES) or k not in own:
            continue
        if k in ("talker.model.codec_embedding.weight", "talker.codec_head.weight") and own[k].shape == v.shape:
            own[k][CODE_ROWS:] = v[CODE_ROWS:]
        elif own[k].shape == v.shape:
            own[k].copy_(v)
        else:
            continue
        n += 1
    model.load_state_dict(own)
    log(f"talker: {n} tensors transferred from {export_dir} (code rows and code-predictor tables fresh)")


def set_attention_dropout(model, p):
    """Attention dropout p in every attention layer of the talker and the code predictor (`--talker-dropout`): the
    official attention modules read their config's attention_dropout once, into `self.attention_dropout`, and apply it
    only in training mode. Regularises a talker that has seen all the text there is (it overfits the teacher's
    renders); the exported config.json is written from the size preset, so it keeps 0.0."""
    n = 0
    for m in model.modules():
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = float(p)
            n += 1
    if p > 0 and n == 0:
        raise SystemExit("--talker-dropout: no attention layer with an attention_dropout attribute in this model")
    if p > 0:
        log(f"talker: attention dropout {p} in {n} attention layers")
    return n


def step_talker(a, size, ns, data=None):
    """Talker + code predictor training. Data parallel when started by torchrun (WORLD_SIZE > 1): every process
    draws its own batches of --talker-batch utterances, the gradients are averaged with one all-reduce, and the
    clock that drives the learning rate and --max-minutes is the slowest process's, so all stay in step; only rank 0
    logs and saves."""
    import torch.distributed as dist
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    dev = torch.device(a.device)
    if world > 1:
        if a.device.startswith("cuda"):
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    torch.manual_seed(a.seed)
    random.seed(a.seed + rank)
    tok_dir = os.path.join(a.work, "tok")
    tok = load_tokenizer(tok_dir)
    ids = special_ids(tok_dir)
    if data is None:
        data = [d for p in (a.codes or [os.path.join(a.work, "codes.pt")]) for d in load_codes(p)]
    model = build_talker(ns, size, ids).to(dev)
    model.train()
    set_attention_dropout(model, a.talker_dropout)
    opt = make_adamw(model.parameters(), a, lr=a.talker_lr, weight_decay=a.talker_wd, betas=(0.9, 0.98))
    n_params = sum(p.numel() for p in model.parameters())
    say = log if rank == 0 else (lambda *_: None)
    say(f"talker: {n_params / 1e6:.2f} M parameters, {len(data)} utterances, {sum(len(d['codes']) for d in data)} "
        f"frames, {world} process(es) x batch {a.talker_batch}")
    out = os.path.join(a.work, "talker")
    os.makedirs(out, exist_ok=True)
    ckpt = os.path.join(out, "talker.pt")
    start = 1
    if a.resume and os.path.exists(ckpt):
        st = torch.load(ckpt, map_location=dev)
        model.load_state_dict(st["model"])
        if "opt" in st:
            opt.load_state_dict(st["opt"])
        start = st.get("step", 0) + 1
        say(f"talker: resumed at step {start}")
    elif a.init_from:
        load_export_weights(model, a.init_from, a.init_transfer)   # the optimiser starts afresh
        start = a.init_step + 1
        say(f"talker: initialised from {a.init_from}, counting from step {start}")
    if world > 1:                                    # identical start on every process
        for p in model.parameters():
            dist.broadcast(p.data, 0)
    params = [p for p in model.parameters() if p.requires_grad]
    cache = {}                                       # (utterance, language) -> prompt tensors (built once)
    val = [example_tensors(build_example(tok, ids, d["text"], d["codes"], TRAIN_LANGUAGE))
           for p in (a.val_codes or []) for d in load_codes(p)] if rank == 0 else []
    best = dict(ce=float("inf"), step=None, model=None)

    def validate(step):
        """Code-0 and code-predictor CE on the held-out utterances (--val-codes), with random residual codes in the
        talker's input as at inference (fixed noise seed); keeps a copy of the best weights by code-0 CE."""
        model.eval()
        tot0 = tot1 = 0.0
        with torch.no_grad(), torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(1234)
            for b in range(0, len(val), 64):
                with amp(a):
                    l0, l1 = talker_loss(model, collate(val[b:b + 64], dev), resid_noise=1.0)
                n = len(val[b:b + 64])
                tot0, tot1 = tot0 + l0.item() * n, tot1 + l1.item() * n
        model.train()
        ce0, ce1 = tot0 / len(val), tot1 / len(val)
        if ce0 < best["ce"]:
            best.update(ce=ce0, step=step, model={k: v.detach().clone() for k, v in model.state_dict().items()})
        log(f"talker step {step}: validation ({len(val)} held-out utterances, random residual inputs) "
            f"code0 {ce0:.3f} sub {ce1:.3f}{' (best)' if best['step'] == step else ''}")

    def example(i, lang):
        if (i, lang) not in cache:
            d = data[i]
            cache[(i, lang)] = example_tensors(build_example(tok, ids, d["text"], d["codes"], lang))
        return cache[(i, lang)]

    def elapsed():
        """Seconds since the start, the slowest process's (one small all-reduce)."""
        e = time.time() - t0
        if world > 1:
            e_t = torch.tensor([e], device=dev, dtype=torch.float64)
            dist.all_reduce(e_t, op=dist.ReduceOp.MAX)
            e = e_t.item()
        return e

    t0 = time.time()
    step = start - 1
    for step in range(start, a.talker_steps + 1):
        el = elapsed()
        for g in opt.param_groups:
            g["lr"] = a.talker_lr * lr_factor(step, a.talker_steps, a.warmup, el, a.max_minutes,
                                              warmup_from=start if a.init_from else 0)
        exs = [example(random.randrange(len(data)), TRAIN_LANGUAGE if random.random() < a.p_english else "auto")
               for _ in range(a.talker_batch)]
        batch = collate(exs, dev)
        with amp(a):
            l0, l1 = talker_loss(model, batch, a.resid_noise)
        loss = l0 + a.sub_weight * l1
        opt.zero_grad(set_to_none=False)
        loss.backward()
        if world > 1:
            from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
            for p in params:                         # a parameter this batch did not reach still takes part
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            flat = _flatten_dense_tensors([p.grad for p in params])
            dist.all_reduce(flat)
            flat /= world
            for p, g in zip(params, _unflatten_dense_tensors(flat, [p.grad for p in params])):
                p.grad.copy_(g)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % a.log_every == 0 or step == a.talker_steps:
            say(f"talker step {step}: code0 {l0.item():.3f} sub {l1.item():.3f} lr {opt.param_groups[0]['lr']:.2e} "
                f"({el:.0f} s)")
        if rank == 0 and a.snapshot_every and step % a.snapshot_every == 0:
            snap = os.path.join(out, f"snap-{step}.pt")
            torch.save({"model": {k: v.detach().to(torch.bfloat16).cpu() for k, v in model.state_dict().items()},
                        "size": a.size, "step": step}, snap)
            say(f"talker: snapshot -> {snap}")
        stop = a.max_minutes and el > 60 * a.max_minutes
        if val and (step % (a.log_every * a.val_every) == 0 or stop or step == a.talker_steps):
            validate(step)
        if stop:
            say(f"talker: time limit at step {step}")
            break
    if rank == 0:
        torch.save({"model": model.state_dict(), "size": a.size, "step": step, "opt": opt.state_dict()}, ckpt)
        if best["model"] is not None:
            torch.save({"model": best["model"], "size": a.size, "step": best["step"], "val_code0": best["ce"]},
                       os.path.join(out, "talker-best.pt"))
            log(f"talker: best validation code0 {best['ce']:.3f} at step {best['step']} -> talker-best.pt")
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return model
