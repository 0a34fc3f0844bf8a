"""Step `quantizer` (the `mel` and `phone` code schemes): log-mel frame features and their residual k-means, which
define the codes. With `phone`, codebook 0 is a k-means of the log-mel frame *together with* the teacher's phoneme
alignment of the frame (which phoneme ids sound in each of its four 20 ms sub-frames, from the durations Piper's
graph computed for the render: render_ids.py), weighted so that its clusters are phonetically pure first and split
by sound second; codebooks 1.. are k-means of the log-mel residual left by the codebooks before them. So the talker,
which predicts codebook 0, predicts what is said; the code predictor adds how it sounds."""
import os

import numpy as np
import torch

from .common import HOP, SR, log
from .data import load_audio, load_manifest


def mel_filterbank(n_fft, n_mels, sr=SR):
    """Triangular filters on the HTK mel scale, area-normalised ([n_mels, n_fft // 2 + 1]); numpy only."""
    def hz2mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)
    def mel2hz(m):
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)
    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    pts = mel2hz(np.linspace(hz2mel(0.0), hz2mel(sr / 2), n_mels + 2))
    fb = np.zeros((n_mels, len(freqs)), dtype=np.float32)
    for i in range(n_mels):
        lo, c, hi = pts[i], pts[i + 1], pts[i + 2]
        fb[i] = np.maximum(0.0, np.minimum((freqs - lo) / (c - lo), (hi - freqs) / (hi - c)))
        fb[i] *= 2.0 / (hi - lo)
    return fb


def make_mel(n_fft, hop, n_mels, device):
    fb = torch.tensor(mel_filterbank(n_fft, n_mels), dtype=torch.float32, device=device)
    win = torch.hann_window(n_fft, device=device)

    def mel(x):                                     # x [B, N] -> [B, n_mels, N // hop]
        s = torch.stft(x, n_fft, hop, window=win, center=True, return_complex=True).abs()
        m = torch.matmul(fb, s)
        return torch.log(m.clamp(min=1e-5))[..., : x.shape[-1] // hop]
    return mel


# One 12.5 Hz frame (80 ms) = SUB log-mel sub-frames of 20 ms; its code is the residual k-means of their
# normalised concatenation ([SUB * n_mels]): stage 0 (the talker's codebook 0) clusters the whole frame, stage q the
# residual left by stages < q. The codes are defined before any network is trained, so the decoder (a vocoder from
# codes) and the talker (text -> codes) can be trained at the same time, on different GPUs, from the first step.
FEAT = dict(n_fft=1024, hop=480, n_mels=80)


SUB = HOP // FEAT["hop"]


def frame_features(mel, x):
    """x [B, N] float audio (N a multiple of HOP) -> [B, N // HOP, SUB * n_mels] log-mel frames."""
    m = mel(x)                                       # [B, n_mels, N // hop]
    B, M, S = m.shape
    T = S // SUB
    return m[..., : T * SUB].reshape(B, M, T, SUB).permute(0, 2, 3, 1).reshape(B, T, SUB * M)


# Piper's phoneme ids are < N_SYM (en_US-joe-medium: 151 entries in its phoneme_id_map). Id 0 is Piper's pad between
# phonemes (its time goes to the phoneme before it); id 0 also marks time outside the phonemes (the lead silence).
N_SYM = 160
PAD_ID = 0
TEACHER_SR, TEACHER_HOP = 22050, 256              # the durations' unit: one VITS decoder frame of the teacher


def frame_phonemes(row, n_frames, sub=None):
    """The phoneme alignment of one rendered utterance: [n_frames, SUB * N_SYM] float32, for each 20 ms sub-frame the
    share of its time each phoneme id sounds. From the manifest row's `durations` (per chunk, per phoneme id, in
    frames of 256 samples at 22.05 kHz), `phoneme_ids` and `lead_samples` (render_ids.py). Errors (SystemExit) when
    the row has no durations (a render by a model without the `durations` output)."""
    sub = sub or SUB
    if "durations" not in row:
        raise SystemExit(f"utterance {row.get('id')}: no phoneme durations in the manifest (render with "
                         "render_ids.py and a model made by onnx_fp16_weights.py)")
    ids, ends = [], []
    t = row.get("lead_samples", 0) / SR
    for chunk_ids, chunk_d in zip(row["phoneme_ids"], row["durations"]):
        prev = PAD_ID
        for i, d in zip(chunk_ids, chunk_d):
            if i == PAD_ID:
                i = prev
            prev = i
            t += d * TEACHER_HOP / TEACHER_SR
            ids.append(i)
            ends.append(t)
    ids, ends = np.array(ids + [PAD_ID]), np.array(ends + [np.inf])
    step = HOP / sub / SR / 20                        # 20 points a sub-frame (1 ms)
    pts = (np.arange(n_frames * sub * 20) + 0.5) * step
    sym = ids[np.searchsorted(ends, pts, side="right")]
    start = row.get("lead_samples", 0) / SR
    sym[pts < start] = PAD_ID
    onehot = np.zeros((n_frames * sub, N_SYM), np.float32)
    np.add.at(onehot, (np.arange(len(pts)) // 20, np.minimum(sym, N_SYM - 1)), 1.0 / 20)
    return onehot.reshape(n_frames, sub * N_SYM)


def kmeans_assign(X, C, chunk=32768):
    """Nearest centroid of each row of X [N, D] among C [K, D] -> [N] long."""
    cc = (C * C).sum(1)
    return torch.cat([(cc[None] - 2 * X[s:s + chunk] @ C.t()).argmin(1) for s in range(0, X.shape[0], chunk)])


def fit_rvq_kmeans(X, n_q, K, iters):
    """Residual k-means (Lloyd, random-sample init, empty clusters re-seeded): X [N, D] -> centroids [n_q, K, D]."""
    R = X.clone()
    cents = []
    for q in range(n_q):
        C = R[torch.randperm(R.shape[0], device=R.device)[:K]].clone()
        for _ in range(iters):
            idx = kmeans_assign(R, C)
            counts = torch.bincount(idx, minlength=K).float()
            sums = torch.zeros_like(C).index_add_(0, idx, R)
            seed = R[torch.randint(0, R.shape[0], (K,), device=R.device)]
            C = torch.where((counts == 0)[:, None], seed, sums / counts.clamp(min=1)[:, None])
        before = float(R.pow(2).mean())
        R = R - C[kmeans_assign(R, C)]
        log(f"quantizer: stage {q}: residual energy {before:.4f} -> {float(R.pow(2).mean()):.4f}")
        cents.append(C)
    return torch.stack(cents)


def rvq_encode(X, cents):
    """X [N, D] normalised features -> codes [N, n_q] (greedy residual assignment)."""
    R = X.clone()
    codes = []
    for C in cents:
        idx = kmeans_assign(R, C)
        R = R - C[idx]
        codes.append(idx)
    return torch.stack(codes, 1)


def int8_round_trip(C):
    """Centroids [n, K, D] -> (int8 values, f32 scale per stage [n]) and the f32 centroids they stand for: the form the
    `phone` quantizer is stored in (a quarter of f32, small enough to carry), used for encoding from the start so that
    every encoder of the codes, here or on another machine, assigns the same codes."""
    scale = C.abs().amax(dim=(1, 2)).clamp(min=1e-8) / 127.0
    qv = (C / scale[:, None, None]).round().clamp(-127, 127).to(torch.int8)
    return qv, scale, qv.float() * scale[:, None, None]


def load_quantizer(work, dev):
    q = torch.load(os.path.join(work, "quantizer.pt"), map_location=dev, weights_only=False)
    if "centroids_i8" in q:                          # the phone scheme's stored form (int8_round_trip)
        q["centroids"] = q.pop("centroids_i8").float() * q.pop("centroids_scale")[:, None, None].float()
        q["phone_centroids"] = q["phone_centroids"].float()
    # a carried copy may hold the centroids in f16 (quantizer16.pt)
    q = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in q.items()}
    return q, make_mel(FEAT["n_fft"], FEAT["hop"], FEAT["n_mels"], dev)


def rvq_encode_phone(X, P, q):
    """The phone scheme's encoder: X [N, D] normalised mel features, P [N, SUB * N_SYM] phoneme alignment -> codes
    [N, n_q]. Codebook 0 by the joint distance (mel + weighted alignment), the others on the mel residual."""
    C0 = torch.cat([q["centroids"][0], q["phone_centroids"]], 1)
    idx0 = kmeans_assign(torch.cat([X, P * q["phone_weight"]], 1), C0)
    rest = rvq_encode(X - q["centroids"][0][idx0], q["centroids"][1:])
    return torch.cat([idx0[:, None], rest], 1)


def encode_audio(q, mel, audio, dev, batch_seconds=600, rows=None):
    """int16 utterances (whole frames) -> list of codes [T, n_q] int16, in batches of similar length. A `phone`
    quantizer also needs the utterances' manifest rows (their phoneme durations: frame_phonemes)."""
    phone = "phone_centroids" in q
    if phone and rows is None:
        raise SystemExit("a phone-scheme quantizer encodes from the manifest rows' phoneme durations")
    out = [None] * len(audio)
    order = sorted(range(len(audio)), key=lambda i: len(audio[i]))
    b = 0
    with torch.no_grad():
        while b < len(order):
            e = b + 1
            while e < len(order) and (e - b + 1) * len(audio[order[e]]) <= batch_seconds * SR:
                e += 1
            idx = order[b:e]
            n = max(len(audio[i]) for i in idx)
            x = torch.stack([torch.nn.functional.pad(audio[i], (0, n - len(audio[i]))) for i in idx])
            f = frame_features(mel, (x.float() / 32768.0).to(dev))
            B, T, D = f.shape
            X = ((f - q["mean"]) / q["std"]).reshape(-1, D)
            if phone:
                P = torch.from_numpy(np.stack([frame_phonemes(rows[i], T) for i in idx])).to(dev)
                c = rvq_encode_phone(X, P.reshape(B * T, -1), q).view(B, T, -1)
            else:
                c = rvq_encode(X, q["centroids"]).view(B, T, -1)
            for j, i in enumerate(idx):
                out[i] = c[j, : len(audio[i]) // HOP].to(torch.int16).cpu()
            b = e
    return out


def init_codebooks_from_centroids(dec, cents):
    """Decoder codebook q <- centroids of stage q projected on the leading principal axes of stage 0's centroids
    (scaled to unit variance): a structured start for the vocoder's code embeddings."""
    C0 = cents[0] - cents[0].mean(0)
    _, _, V = torch.linalg.svd(C0, full_matrices=False)
    layers = [l for rvq in (dec.quantizer.rvq_first, dec.quantizer.rvq_rest) for l in rvq.vq.layers]
    d = layers[0]._codebook.embedding_sum.shape[1]
    P = V[:d].t() / (C0 @ V[:d].t()).std()
    for q, layer in enumerate(layers):
        layer._codebook.embedding_sum.data[: cents.shape[1]].copy_(cents[q] @ P)
        layer._codebook.cluster_usage.data.fill_(1.0)


def step_quantizer(a, size, ns):
    """Fits the feature normalisation and the residual k-means on (a sample of) the manifest's audio."""
    dev = torch.device(a.device)
    torch.manual_seed(a.seed)
    rows = load_manifest(a.manifest, a.limit)
    audio = load_audio(a.manifest, rows)
    mel = make_mel(FEAT["n_fft"], FEAT["hop"], FEAT["n_mels"], dev)
    feats, phones = [], []
    with torch.no_grad():
        for r, x in zip(rows, audio):
            f = frame_features(mel, (x.float() / 32768.0).to(dev)[None])[0]
            feats.append(f)
            if a.scheme == "phone":
                phones.append(torch.from_numpy(frame_phonemes(r, f.shape[0])).to(dev))
    X = torch.cat(feats)
    pick = torch.randperm(X.shape[0], device=dev)[: a.kmeans_frames]
    X = X[pick]
    mean, std = X.mean(0), X.std(0).clamp(min=1e-3)
    X = (X - mean) / std
    log(f"quantizer: {X.shape[0]} frames of {X.shape[1]} features, {size['n_q']} x {a.kmeans_k} centroids, "
        f"scheme {a.scheme}")
    path = os.path.join(a.work, "quantizer.pt")
    if a.scheme != "phone":
        cents = fit_rvq_kmeans(X, size["n_q"], a.kmeans_k, a.kmeans_iters)
        torch.save({"mean": mean.cpu(), "std": std.cpu(), "centroids": cents.cpu(), "feat": FEAT}, path)
        return
    P = torch.cat(phones)[pick] * a.phone_weight
    D = X.shape[1]
    C0 = fit_rvq_kmeans(torch.cat([X, P], 1), 1, a.kmeans_k, a.kmeans_iters)[0]
    idx0 = kmeans_assign(torch.cat([X, P], 1), C0)
    # purity: how often a frame's main phoneme (middle of the frame) is its cluster's main phoneme
    main = P.view(P.shape[0], SUB, N_SYM)[:, SUB // 2].argmax(1)
    cmain = C0[:, D:].view(-1, SUB, N_SYM)[:, SUB // 2].argmax(1)
    log(f"quantizer: codebook 0 phonetic purity {float((cmain[idx0] == main).float().mean()):.3f}")
    rest = fit_rvq_kmeans(X - C0[idx0, :D], size["n_q"] - 1, a.kmeans_k, a.kmeans_iters)
    qv, scale, _ = int8_round_trip(torch.cat([C0[None, :, :D], rest]))
    torch.save({"mean": mean.cpu(), "std": std.cpu(), "centroids_i8": qv.cpu(), "centroids_scale": scale.cpu(),
                "phone_centroids": C0[:, D:].half().cpu(), "phone_weight": a.phone_weight, "n_sym": N_SYM,
                "feat": FEAT, "scheme": "phone"}, path)
    log(f"quantizer: -> {path} (int8 centroids, phone part f16)")
