"""Step `quantizer` (the `mel` code scheme): log-mel frame features and their residual k-means, which define the codes."""
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


def load_quantizer(work, dev):
    q = torch.load(os.path.join(work, "quantizer.pt"), map_location=dev, weights_only=False)
    # a carried copy may hold the centroids in f16 (quantizer16.pt)
    q = {k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in q.items()}
    return q, make_mel(FEAT["n_fft"], FEAT["hop"], FEAT["n_mels"], dev)


def encode_audio(q, mel, audio, dev, batch_seconds=600):
    """int16 utterances (whole frames) -> list of codes [T, n_q] int16, in batches of similar length."""
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
            c = rvq_encode(((f - q["mean"]) / q["std"]).reshape(-1, D), q["centroids"]).view(B, T, -1)
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
    feats = []
    with torch.no_grad():
        for x in audio:
            feats.append(frame_features(mel, (x.float() / 32768.0).to(dev)[None])[0])
    X = torch.cat(feats)
    if X.shape[0] > a.kmeans_frames:
        X = X[torch.randperm(X.shape[0], device=dev)[: a.kmeans_frames]]
    mean, std = X.mean(0), X.std(0).clamp(min=1e-3)
    log(f"quantizer: {X.shape[0]} frames of {X.shape[1]} features, {size['n_q']} x {a.kmeans_k} centroids")
    cents = fit_rvq_kmeans((X - mean) / std, size["n_q"], a.kmeans_k, a.kmeans_iters)
    torch.save({"mean": mean.cpu(), "std": std.cpu(), "centroids": cents.cpu(), "feat": FEAT},
               os.path.join(a.work, "quantizer.pt"))
