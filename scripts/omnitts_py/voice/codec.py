"""Step `codec`: the official Code2Wav decoder trained on the teacher audio (with the `learned` scheme also an encoder
and the official split RVQ)."""
import json
import os
import random
import time

import torch
import torch.nn as nn

from .common import HOP, SR, amp, log, lr_factor, make_adamw
from .configs import speech_tokenizer_config
from .data import load_audio, load_manifest
from .quantizer import encode_audio, init_codebooks_from_centroids, load_quantizer, make_mel
from .talker import gta_replace


def build_codec_modules(ns, size, device):
    tcfg = ns.Qwen3TTSTokenizerV2Config(**json.loads(json.dumps(speech_tokenizer_config(size))))
    codec = ns.Qwen3TTSTokenizerV2Model._from_config(tcfg, dtype=torch.float32)
    D = size["dec"]["codebook_dim"]
    ch = size["enc_ch"]

    class Res(nn.Module):
        def __init__(self, c, dil):
            super().__init__()
            self.c1 = nn.Conv1d(c, c, 3, padding=dil, dilation=dil)
            self.c2 = nn.Conv1d(c, c, 1)

        def forward(self, x):
            return x + self.c2(nn.functional.gelu(self.c1(nn.functional.gelu(x))))

    class Encoder(nn.Module):
        """log-mel at 100 Hz -> conv stack -> 12.5 Hz latents [B, codebook_dim, T] (training only)."""
        def __init__(self):
            super().__init__()
            self.mel = make_mel(1024, 240, 80, device)
            layers = [nn.Conv1d(80, ch, 5, padding=2), Res(ch, 1), Res(ch, 3)]
            for _ in range(3):
                layers += [nn.GELU(), nn.Conv1d(ch, ch, 4, stride=2, padding=1), Res(ch, 1), Res(ch, 3)]
            layers += [nn.GELU(), nn.Conv1d(ch, D, 3, padding=1)]
            self.net = nn.Sequential(*layers)

        def forward(self, wav):                      # [B, N] float
            return self.net(self.mel(wav))

    return codec.to(device), Encoder().to(device)


def rvq_quantize(rvq, x, train, decay=0.99, eps=1e-5):
    """One official ResidualVectorQuantizer: input_proj -> residual nearest-codebook search -> output_proj.
    EMA k-means updates go into the official `embedding_sum` / `cluster_usage` (what `decode` divides).
    Returns (quantized after output_proj with a straight-through gradient, codes [B, n, T], commitment loss)."""
    xin = rvq.input_proj(x)                          # [B, d, T]
    B, d, T = xin.shape
    flat = xin.transpose(1, 2).reshape(-1, d)
    residual = flat.detach()
    qsum = torch.zeros_like(flat)
    codes = []
    for layer in rvq.vq.layers:
        cb = layer._codebook
        emb = cb.embedding_sum / cb.cluster_usage.clamp(min=cb.epsilon)[:, None]
        dist = (residual.pow(2).sum(1, keepdim=True) - 2 * residual @ emb.t() + emb.pow(2).sum(1)[None])
        idx = dist.argmin(1)
        q = emb[idx]
        if train:
            with torch.no_grad():
                onehot = torch.zeros(flat.shape[0], emb.shape[0], device=flat.device, dtype=flat.dtype)
                onehot.scatter_(1, idx[:, None], 1.0)
                counts = onehot.sum(0)
                sums = onehot.t() @ residual
                cb.cluster_usage.data.mul_(decay).add_(counts, alpha=1 - decay)
                cb.embedding_sum.data.mul_(decay).add_(sums, alpha=1 - decay)
                # dead codes: re-seed from the current residuals
                dead = cb.cluster_usage.data < 0.02 * (flat.shape[0] / emb.shape[0]) + 1e-3
                nd = int(dead.sum())
                if nd:
                    pick = residual[torch.randint(0, residual.shape[0], (nd,), device=flat.device)]
                    cb.embedding_sum.data[dead] = pick
                    cb.cluster_usage.data[dead] = 1.0
        codes.append(idx.view(B, T))
        qsum = qsum + q
        residual = residual - q
    commit = torch.nn.functional.mse_loss(flat, qsum.detach())
    qst = flat + (qsum - flat).detach()
    out = rvq.output_proj(qst.view(B, T, d).transpose(1, 2))
    return out, torch.stack(codes, 1), commit


def quantize(dec, z, train):
    """Official SplitResidualVectorQuantizer semantics: rvq_first (1 codebook) and rvq_rest (n-1) both quantize z;
    decode() sums their outputs. codes: [B, n, T] in decoder order."""
    q1, c1, l1 = rvq_quantize(dec.quantizer.rvq_first, z, train)
    q2, c2, l2 = rvq_quantize(dec.quantizer.rvq_rest, z, train)
    return q1 + q2, torch.cat([c1, c2], 1), l1 + l2


def decoder_from_quantized(dec, hidden):
    """Qwen3TTSTokenizerV2Decoder.forward after quantizer.decode (same modules, same order)."""
    hidden = dec.pre_conv(hidden).transpose(1, 2)
    hidden = dec.pre_transformer(inputs_embeds=hidden).last_hidden_state
    hidden = hidden.permute(0, 2, 1)
    for blocks in dec.upsample:
        for block in blocks:
            hidden = block(hidden)
    wav = hidden
    for block in dec.decoder:
        wav = block(wav)
    return wav.clamp(min=-1, max=1)


def spectral_losses(y, x, mels):
    loss = 0.0
    for mel in mels:
        loss = loss + (mel(y) - mel(x)).abs().mean()
    for n_fft in (512, 1024, 2048):
        w = torch.hann_window(n_fft, device=x.device)
        sy = torch.stft(y, n_fft, n_fft // 4, window=w, return_complex=True).abs()
        sx = torch.stft(x, n_fft, n_fft // 4, window=w, return_complex=True).abs()
        loss = loss + (torch.log(sy.clamp(min=1e-5)) - torch.log(sx.clamp(min=1e-5))).abs().mean()
        loss = loss + torch.linalg.norm(sy - sx) / torch.linalg.norm(sx).clamp(min=1e-5)
    return loss


def make_disc(device):
    """The adversaries of the decoder: three complex-STFT discriminators (FFT sizes 512, 1024, 2048: the spectral
    detail) and five multi-period discriminators (periods 2, 3, 5, 7, 11: the waveform reshaped to [T / p, p], 2-D
    convolutions along time, as in HiFi-GAN: the periodic structure of voiced speech). Each returns (scores,
    feature maps) for the hinge and feature-matching losses."""

    class STFTD(nn.Module):
        def __init__(self, n_fft, ch=32):
            super().__init__()
            self.n_fft = n_fft
            self.register_buffer("win", torch.hann_window(n_fft))
            self.convs = nn.ModuleList([
                nn.Conv2d(2, ch, (3, 9), padding=(1, 4)),
                nn.Conv2d(ch, ch, (3, 9), stride=(1, 2), padding=(1, 4)),
                nn.Conv2d(ch, ch, (3, 9), stride=(1, 2), padding=(1, 4)),
                nn.Conv2d(ch, ch, (3, 3), padding=(1, 1))])
            self.out = nn.Conv2d(ch, 1, (3, 3), padding=(1, 1))

        def forward(self, x):
            s = torch.stft(x, self.n_fft, self.n_fft // 4, window=self.win, return_complex=True)
            z = torch.stack([s.real, s.imag], 1).transpose(2, 3)
            feats = []
            for c in self.convs:
                z = nn.functional.leaky_relu(c(z), 0.2)
                feats.append(z)
            return self.out(z), feats

    class PeriodD(nn.Module):
        def __init__(self, period, chs=(16, 64, 128, 256)):
            super().__init__()
            self.period = period
            convs, c = [], 1
            for o in chs:
                convs.append(nn.Conv2d(c, o, (5, 1), stride=(3, 1), padding=(2, 0)))
                c = o
            convs.append(nn.Conv2d(c, c, (5, 1), padding=(2, 0)))
            self.convs = nn.ModuleList(convs)
            self.out = nn.Conv2d(c, 1, (3, 1), padding=(1, 0))

        def forward(self, x):                        # x [B, N]
            p = self.period
            x = nn.functional.pad(x, (0, (-x.shape[-1]) % p), mode="reflect")
            z = x.view(x.shape[0], 1, -1, p)
            feats = []
            for c in self.convs:
                z = nn.functional.leaky_relu(c(z), 0.1)
                feats.append(z)
            return self.out(z), feats

    return nn.ModuleList([STFTD(n) for n in (512, 1024, 2048)] +
                         [PeriodD(p) for p in (2, 3, 5, 7, 11)]).to(device)


def step_codec(a, size, ns):
    dev = torch.device(a.device)
    torch.manual_seed(a.seed)
    rows = load_manifest(a.manifest, a.limit)
    audio = load_audio(a.manifest, rows)
    log(f"codec: {len(audio)} utterances, {sum(len(x) for x in audio) / SR / 3600:.2f} h, scheme {a.scheme}")
    codec, enc = build_codec_modules(ns, size, dev)
    if a.init_from:
        load_export_codec(codec, a.init_from)
    dec = codec.decoder
    mel_codes = None
    if a.scheme in ("mel", "phone"):
        # fixed codes: no encoder; the decoder's codebook vectors are ordinary trainable parameters
        q, fmel = load_quantizer(a.work, dev)
        mel_codes = encode_audio(q, fmel, audio, dev, rows=rows)
        if a.gta_from:
            if a.gta_share < 1 and mel_codes and mel_codes[0].shape[1] < size["n_q"]:
                raise SystemExit("codec --gta-share < 1 needs a quantizer with every codebook")
            gta = gta_replace(a, ns, size, dev, rows, mel_codes)
            # a share (1 - --gta-share) of the utterances keep their true residual codes
            keep = random.Random(a.seed).random
            mel_codes = [g if keep() < a.gta_share else c for g, c in zip(gta, mel_codes)]
        enc = torch.nn.Module()
    for n, p in dec.named_parameters():
        if n.endswith("cluster_usage") or (n.endswith("embedding_sum") and mel_codes is None):
            p.requires_grad_(False)
    gen_params = [p for p in list(enc.parameters()) + list(dec.parameters()) if p.requires_grad]
    opt = make_adamw(gen_params, a, lr=a.codec_lr, betas=(0.8, 0.99))
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True        # fixed crop shapes: let cuDNN pick the discriminators' kernels
    disc = make_disc(dev) if a.gan_start >= 0 else None
    if disc is not None and a.disc_from:
        from safetensors.torch import load_file
        disc.load_state_dict({k: v.float() for k, v in load_file(a.disc_from).items()})
        log(f"codec: discriminators from {a.disc_from}")
    dopt = torch.optim.AdamW(disc.parameters(), lr=a.codec_lr, betas=(0.8, 0.99)) if disc else None
    mels = [make_mel(n, n // 4, m, dev) for n, m in ((512, 64), (1024, 80), (2048, 128))]
    seg = a.seg_frames * HOP
    lens = [len(x) for x in audio]

    long_enough = [i for i in range(len(audio)) if lens[i] >= seg]

    def batch():
        if mel_codes is not None:                    # aligned crops of audio and codes
            xs, cs = [], []
            for _ in range(a.codec_batch):
                i = random.choice(long_enough)
                f = random.randrange(0, lens[i] // HOP - a.seg_frames + 1)
                xs.append(audio[i][f * HOP:f * HOP + seg])
                cs.append(mel_codes[i][f:f + a.seg_frames])
            return ((torch.stack(xs).float() / 32768.0).to(dev),
                    torch.stack(cs).long().transpose(1, 2).to(dev))     # [B, n_q, F]
        xs = []
        for _ in range(a.codec_batch):
            i = random.randrange(len(audio))
            n = lens[i]
            if n <= seg:
                x = torch.nn.functional.pad(audio[i], (0, seg - n))
            else:
                s = random.randrange(0, (n - seg) // HOP + 1) * HOP
                x = audio[i][s:s + seg]
            xs.append(x)
        return (torch.stack(xs).float() / 32768.0).to(dev)

    out = os.path.join(a.work, "codec")
    os.makedirs(out, exist_ok=True)
    ckpt = os.path.join(out, "codec.pt")
    start = 1
    if a.resume and os.path.exists(ckpt):
        st = torch.load(ckpt, map_location=dev)
        codec.load_state_dict(st["codec"])
        enc.load_state_dict(st["encoder"])
        if "opt" in st:
            opt.load_state_dict(st["opt"])
        if disc is not None and "disc" in st:
            disc.load_state_dict(st["disc"])
            dopt.load_state_dict(st["dopt"])
        start = st.get("step", 0) + 1
        log(f"codec: resumed at step {start}")
    with torch.no_grad():
        if start == 1 and mel_codes is not None and not a.init_from:
            init_codebooks_from_centroids(dec, q["centroids"].to(dev))
        z = enc(batch()) if start == 1 and mel_codes is None and not a.init_from else None
        for rvq in (dec.quantizer.rvq_first, dec.quantizer.rvq_rest) if z is not None else ():
            flat = rvq.input_proj(z).transpose(1, 2).reshape(-1, rvq.input_proj.out_channels)
            for layer in rvq.vq.layers:
                cb = layer._codebook
                pick = flat[torch.randint(0, flat.shape[0], (cb.codebook_size,), device=dev)]
                cb.embedding_sum.data.copy_(pick + 1e-3 * torch.randn_like(pick))
                cb.cluster_usage.data.fill_(1.0)
    t0 = time.time()
    step = start - 1
    for step in range(start, a.codec_steps + 1):
        for g in opt.param_groups:
            g["lr"] = a.codec_lr * lr_factor(step, a.codec_steps, a.codec_warmup, time.time() - t0, a.max_minutes)
        if mel_codes is not None:
            x, codes = batch()
            commit = torch.zeros((), device=dev)
            with amp(a):
                y = dec(codes)[:, 0]                 # the official decode path: quantizer.decode + decoder
        else:
            x = batch()
            with amp(a):
                z = enc(x)
            z = z.float()
            qz, codes, commit = quantize(dec, z, train=True)
            with amp(a):
                y = decoder_from_quantized(dec, qz)[:, 0]
        y = y.float()
        rec = spectral_losses(y, x, mels)
        loss = rec + a.commit_weight * commit
        use_gan = disc is not None and step >= a.gan_start
        if use_gan:
            adv, fm = 0.0, 0.0
            for d in disc:
                sy, fy = d(y)
                with torch.no_grad():
                    _, fx = d(x)
                adv = adv + torch.relu(1 - sy).mean()
                fm = fm + sum((u - v).abs().mean() for u, v in zip(fy, fx)) / len(fy)
            # averaged over the discriminators, so the weights do not depend on how many there are
            loss = loss + (a.adv_weight * adv + a.fm_weight * fm) / len(disc)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gen_params, 1.0)
        opt.step()
        if use_gan:
            dl = 0.0
            for d in disc:
                sx, _ = d(x)
                sy, _ = d(y.detach())
                dl = dl + torch.relu(1 - sx).mean() + torch.relu(1 + sy).mean()
            dopt.zero_grad(set_to_none=True)
            (dl / len(disc)).backward()
            dopt.step()
        if step % a.log_every == 0 or step == a.codec_steps:
            used = [int((layer._codebook.cluster_usage > 0.5).sum()) for rvq in
                    (dec.quantizer.rvq_first, dec.quantizer.rvq_rest) for layer in rvq.vq.layers]
            usage = "" if mel_codes is not None else f" codes>0.5 use {min(used)}..{max(used)}"
            log(f"codec step {step}: lr {opt.param_groups[0]['lr']:.2e} rec {rec.item():.3f} commit {commit.item():.4f}"
                f"{usage}{f' adv {float(adv) / len(disc):.3f} fm {float(fm) / len(disc):.3f} disc {float(dl) / len(disc):.3f}' if use_gan else ''}"
                f" ({time.time() - t0:.0f} s)")
        if a.max_minutes and time.time() - t0 > 60 * a.max_minutes:
            log(f"codec: time limit at step {step}")
            break
    st = {"codec": codec.state_dict(), "encoder": enc.state_dict(), "size": a.size, "step": step,
          "opt": opt.state_dict()}
    if disc is not None:
        st.update(disc=disc.state_dict(), dopt=dopt.state_dict())
    torch.save(st, ckpt)
    return codec, enc


def load_export_codec(codec, export_dir):
    """An exported checkpoint's speech_tokenizer/model.safetensors into `codec` (as f32); the codec step then fine-tunes
    from it (fresh optimiser, step count from 1)."""
    from safetensors.torch import load_file
    sd = load_file(os.path.join(export_dir, "speech_tokenizer", "model.safetensors"))
    codec.load_state_dict({k: v.float() for k, v in sd.items()})
    log(f"codec: initialised from {export_dir}")
