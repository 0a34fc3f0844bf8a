"""Step `probe` (diagnosis): teacher-forced CE of an export with altered inputs."""
import os
import random

import torch

from .common import log
from .data import load_codes
from .talker import build_example, build_talker, collate, example_tensors, load_export_weights, talker_loss
from .tokenizer import load_tokenizer, special_ids


def step_probe(a, size, ns):
    """Teacher-forced CE of an export (--init-from) on --probe-n random utterances of --codes, with the inputs
    altered: the true text and codes; another utterance's text; random residual codes (codebooks 1..n_q-1) in the
    talker's input; the previous frame's residual codes. Shows what the talker reads (scripts/voice/README.md,
    third round): a talker that reads the residual codes derails on the code predictor's samples."""
    tok_dir = os.path.join(a.work, "tok")
    tok, ids = load_tokenizer(tok_dir), special_ids(tok_dir)
    model = build_talker(ns, size, ids)
    load_export_weights(model, a.init_from)
    model.eval()
    n_codes = model.talker.code_predictor.get_input_embeddings()[0].num_embeddings
    data = [d for p in a.codes for d in load_codes(p)]
    rng = random.Random(a.seed)
    idx = rng.sample(range(len(data)), a.probe_n)
    other = idx[1:] + idx[:1]

    def ce(texts, resid=None):
        exs = [example_tensors(build_example(tok, ids, t, data[i]["codes"], "english")) for t, i in zip(texts, idx)]
        for e in exs:
            if resid is not None:
                e["codes"] = torch.cat([e["codes"][:, :1], resid(e["codes"][:, 1:])], 1)
        with torch.no_grad():
            l0, l1 = talker_loss(model, collate(exs, torch.device("cpu")))
        return f"code-0 CE {l0.item():.3f}, code-predictor CE {l1.item():.3f}"
    own = [data[i]["text"] for i in idx]
    log(f"probe {a.init_from}, {a.probe_n} utterances:")
    log(f"  true text, true codes:               {ce(own)}")
    log(f"  another utterance's text:            {ce([data[j]['text'] for j in other])}")
    log(f"  random residual codes in the input:  {ce(own, lambda r: torch.randint_like(r, 0, n_codes))}")
    log(f"  previous frame's residual codes:     {ce(own, lambda r: torch.roll(r, 1, 0))}")
