//! `gpu_parity --check-kernels`: each fused CUDA decode kernel (`src/nn/cuda_kernels`) against the
//! unfused candle ops it replaces, on random tensors of the real talker / code-predictor shapes,
//! in f32 and bf16, on the device. Prints one line per check and returns whether all passed.
//!
//! Error measure: max |fused − reference| / max |reference|. The reference runs the unfused candle
//! ops on the device in the same dtype (as the model did before the fusion), except attention,
//! whose reference is computed in f32 from the same dtype-rounded inputs (the unfused bf16 path
//! rounds scores and probabilities to bf16, the kernel does not). Tolerances: f32 1e-5 (2e-5 for
//! attention: other summation order); bf16 1.6e-2 (about two bf16 roundings, 2⁻⁸ each, of the
//! largest value: the fused kernels round once where the unfused ops round after every op). The
//! one-row matmuls (`gemv`) are checked against `Linear::forward` (cuBLAS) on the same inputs:
//! f32 2e-5 (other summation order over k), bf16 1.6e-2; `argmax_embed` exactly (index and row);
//! `embed_sum` against the same sum on the host in f32 codebook order, exactly; `sample_embed`
//! against `DeviceSampler::sample` on the device with the same uniforms (the same code in all but
//! ≤ 2 % of draws: float roundings at a CDF boundary) and its row exactly; `decode_stack` against
//! the per-layer kernels it chains, bit for bit (output and caches); `rope_attention` against
//! `qk_norm_rope_kv` + `decode_attention`, bit for bit; the batched frames' kernels against the
//! one-row kernels row by row, bit for bit: `rows_attention` against `rope_attention` (each row its
//! own cache, capacity and position), `pick_rows` against `argmax_embed` / `sample_embed` (greedy
//! and sampled rows mixed), `embed_sum_rows` against `embed_sum`. The Code2Wav convolution
//! layers on `shift_cols` + one GEMM + `bias_epilogue(_phased)` (`nn::conv`, f32 and bf16) against
//! candle's f32 `conv1d` / `conv_transpose1d` of the same inputs over the history and the chunk
//! concatenated (attention's tolerances: other summation order), and chunked against whole; `gather_rows` against `Tensor::cat`, bit for bit.

use anyhow::Result;
use candle_core::{D, DType, Device, Module, Tensor};
use gstomnitts::nn::cuda_kernels::{
    DecodeAt, Pos,
    add_rms_norm::add_rms_norm,
    argmax_embed::argmax_embed,
    decode_attention::{decode_attention, decode_attention_in_blocks},
    decode_stack::{Barrier, StackAttention, StackLayer, decode_stack, time_grid_barrier},
    embed_sum::{embed_sum, embed_sum_rows},
    gather_rows::gather_rows,
    gemv::{gemv_bias, gemv_residual, norm_gemv, norm_gemv_logits, norm_gemv_silu},
    pick_rows::pick_rows,
    qk_norm_rope::{HeadNorms, Heads, qk_norm_rope_kv},
    rope_attention::rope_attention,
    rows_attention::{RowCaches, rows_attention},
    sample_embed::sample_embed,
    silu_mul::silu_mul,
};

fn tolerance(dtype: DType, attention: bool) -> f32 {
    match (dtype, attention) {
        (DType::F32, false) => 1e-5,
        (DType::F32, true) => 2e-5,
        _ => 1.6e-2,
    }
}

/// max |a − b| / max |b| over all elements (both converted to f32).
fn rel_err(a: &Tensor, b: &Tensor) -> Result<f32> {
    let a = a.to_dtype(DType::F32)?.flatten_all()?;
    let b = b.to_dtype(DType::F32)?.flatten_all()?;
    let diff = (&a - &b)?.abs()?.max(0)?.to_scalar::<f32>()?;
    let scale = b.abs()?.max(0)?.to_scalar::<f32>()?.max(1e-30);
    if !diff.is_finite() {
        return Ok(f32::INFINITY);
    }
    Ok(diff / scale)
}

struct Report {
    all_ok: bool,
}

impl Report {
    fn check(&mut self, name: &str, dtype: DType, err: f32, tol: f32) {
        let ok = err <= tol;
        self.all_ok &= ok;
        println!(
            "{:<46} {:<5} max rel err {:>10.3e}  tol {:>8.1e}  {}",
            name,
            format!("{dtype:?}"),
            err,
            tol,
            if ok { "ok" } else { "FAIL" }
        );
    }
}

fn randn(shape: &[usize], dtype: DType, dev: &Device) -> Result<Tensor> {
    Ok(Tensor::randn(0f32, 1f32, shape, dev)?.to_dtype(dtype)?)
}

/// Unfused RMSNorm over the last dim (candle's CUDA kernel, as `RmsNorm::forward` on CUDA).
fn rms(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    Ok(candle_nn::ops::rms_norm(&x.contiguous()?, w, eps as f32)?)
}

/// RoPE tables as `RotaryEmbedding` builds them (f32, `[n, hd/2]`, theta 1e6).
fn tables(n: usize, hd: usize, dev: &Device) -> Result<(Tensor, Tensor)> {
    let half = hd / 2;
    let (mut c, mut s) = (Vec::new(), Vec::new());
    for p in 0..n {
        for i in 0..half {
            let f = 1.0f32 / 1e6f32.powf((2 * i) as f32 / hd as f32);
            c.push((f * p as f32).cos());
            s.push((f * p as f32).sin());
        }
    }
    Ok((
        Tensor::from_vec(c, (n, half), dev)?,
        Tensor::from_vec(s, (n, half), dev)?,
    ))
}

pub fn run(dev: &Device) -> Result<bool> {
    let mut r = Report { all_ok: true };
    let eps = 1e-6;
    for dtype in [DType::F32, DType::BF16] {
        // add + RMSNorm, talker 1.7B width and code-predictor width.
        for (rows, cols) in [(1, 2048), (2, 1024), (1, 1024)] {
            let a = randn(&[1, rows, cols], dtype, dev)?;
            let b = randn(&[1, rows, cols], dtype, dev)?;
            let w = randn(&[cols], dtype, dev)?.affine(0.1, 1.0)?;
            let (sum, normed) = add_rms_norm(&a, &b, &w, eps)?;
            let want_sum = (&a + &b)?;
            let want = rms(&want_sum, &w, eps)?;
            let tol = tolerance(dtype, false);
            r.check(
                &format!("add_rms_norm sum [{rows}x{cols}]"),
                dtype,
                rel_err(&sum, &want_sum)?,
                tol,
            );
            r.check(
                &format!("add_rms_norm normed [{rows}x{cols}]"),
                dtype,
                rel_err(&normed, &want)?,
                tol,
            );
        }
        // SiLU(gate)·up from one fused gate/up row (narrowed halves) and from separate tensors.
        for (t, cols) in [(1, 6144), (2, 3072)] {
            let gu = randn(&[1, t, 2 * cols], dtype, dev)?;
            let (g, u) = (gu.narrow(2, 0, cols)?, gu.narrow(2, cols, cols)?);
            let got = silu_mul(&g, &u)?;
            let want = (candle_nn::ops::silu(&g.contiguous()?)? * u.contiguous()?)?;
            r.check(
                &format!("silu_mul narrowed [{t}x{cols}]"),
                dtype,
                rel_err(&got, &want)?,
                tolerance(dtype, false),
            );
            let (g, u) = (g.contiguous()?, u.contiguous()?);
            let got = silu_mul(&g, &u)?;
            r.check(
                &format!("silu_mul contiguous [{t}x{cols}]"),
                dtype,
                rel_err(&got, &want)?,
                tolerance(dtype, false),
            );
        }
        // One-row matmuls: q/k/v, o_proj, gate/up and down of the code predictor / 0.6B talker
        // (hidden 1024) and the 1.7B talker (hidden 2048), 1-3 rows, and an output count that
        // leaves idle warps in the last block.
        for (rows, k, n) in [
            (1usize, 1024usize, 4096usize),
            (2, 1024, 4096),
            (1, 2048, 1024),
            (2, 3072, 1024),
            (1, 2048, 4096),
            (1, 6144, 2048),
            (3, 1024, 1001),
            (4, 4096, 300),
        ] {
            gemv_checks(&mut r, dev, dtype, rows, k, n, eps)?;
        }
        // The code predictor's last row of a 2-row step: an input view with a start offset.
        {
            let h = randn(&[1, 2, 1024], dtype, dev)?;
            let last = h.narrow(1, 1, 1)?;
            let nw = randn(&[1024], dtype, dev)?.affine(0.1, 1.0)?;
            let w = randn(&[2048, 1024], dtype, dev)?.affine(0.05, 0.0)?;
            let want = candle_nn::Linear::new(w.clone(), None)
                .forward(&rms(&last.contiguous()?, &nw, eps)?)?
                .to_dtype(DType::F32)?;
            r.check(
                "gemv_norm_logits, narrowed input [1x1024 -> 2048]",
                dtype,
                rel_err(&norm_gemv_logits(&last, &nw, eps, &w)?, &want)?,
                if dtype == DType::F32 { 2e-5 } else { 1.6e-2 },
            );
        }
        // The whole-stack kernel against the per-layer kernels: code predictor (hidden 1024,
        // 5 layers, 16-slot caches) and 1.7B talker (hidden 2048, 3 layers) shapes.
        for (hidden, inter, layers, cap, t, p, dev_pos) in [
            (1024usize, 3072usize, 5usize, 16usize, 1usize, 3usize, true),
            (1024, 3072, 5, 16, 2, 0, false),
            (2048, 6144, 3, 512, 1, 300, true),
            (2048, 6144, 3, 512, 1, 0, false),
        ] {
            let shape = StackCase {
                hidden,
                inter,
                layers,
                cap,
                t,
                p,
                dev_pos,
            };
            stack_checks(&mut r, dev, dtype, shape, eps)?;
        }
        argmax_checks(&mut r, dev, dtype)?;
        embed_sum_checks(&mut r, dev, dtype)?;
        sample_embed_checks(&mut r, dev, dtype)?;
        rows_checks(&mut r, dev, dtype, eps)?;
        // q/k norm + RoPE + cache write, then attention, talker (16/8 heads) and CP shapes.
        for (nh, nkv, hd, cap) in [(16usize, 8usize, 128usize, 4096usize), (16, 8, 128, 16)] {
            for (t, p, dev_pos) in [
                (1usize, 0usize, false),
                (1, 5, true),
                (2, 0, false),
                (1, 300.min(cap - 1), true),
                (1, cap - 1, true),
            ] {
                qk_and_attention(
                    &mut r,
                    dev,
                    dtype,
                    Heads { nh, nkv, hd },
                    cap,
                    t,
                    p,
                    dev_pos,
                    eps,
                )?;
            }
        }
    }
    conv_checks(&mut r, dev)?;
    // Not a check: what one grid barrier of the stack kernel costs on this GPU.
    for per_sm in [1, 2, 4] {
        let (blocks, us) = time_grid_barrier(dev, per_sm, 20_000)?;
        println!("grid barrier, {blocks} blocks: {us:.2} us");
    }
    println!(
        "kernel checks: {}",
        if r.all_ok { "all ok" } else { "FAILURES" }
    );
    Ok(r.all_ok)
}

#[allow(clippy::too_many_arguments)]
fn qk_and_attention(
    r: &mut Report,
    dev: &Device,
    dtype: DType,
    heads: Heads,
    cap: usize,
    t: usize,
    p: usize,
    dev_pos: bool,
    eps: f64,
) -> Result<()> {
    let Heads { nh, nkv, hd } = heads;
    let (qd, kvd) = (nh * hd, nkv * hd);
    let tag = format!(
        "nh{nh} nkv{nkv} hd{hd} cap{cap} t{t} p{p}{}",
        if dev_pos { " dev" } else { "" }
    );
    // One fused q|k|v row per position, narrowed as the model does.
    let qkv = randn(&[1, t, qd + 2 * kvd], dtype, dev)?;
    let (q, k, v) = (
        qkv.narrow(2, 0, qd)?,
        qkv.narrow(2, qd, kvd)?,
        qkv.narrow(2, qd + kvd, kvd)?,
    );
    let qw = randn(&[hd], dtype, dev)?.affine(0.1, 1.0)?;
    let kw = randn(&[hd], dtype, dev)?.affine(0.1, 1.0)?;
    let (cos, sin) = tables(cap + 4, hd, dev)?;
    // Caches: random past, then the fused write at p.. .
    let kc = randn(&[1, nkv, cap, hd], dtype, dev)?;
    let vc = randn(&[1, nkv, cap, hd], dtype, dev)?;
    let (kc0, vc0) = (kc.copy()?, vc.copy()?);
    // The same inputs for `rope_attention` (the two kernels in one launch), on its own caches.
    let (kc1, vc1) = (kc.copy()?, vc.copy()?);
    let pos_t = Tensor::new(&[p as u32], dev)?;
    let pos = if dev_pos {
        Pos::Device(&pos_t)
    } else {
        Pos::Host(p)
    };
    let norms = Some(HeadNorms {
        q: &qw,
        k: &kw,
        eps,
    });
    let q_out = qk_norm_rope_kv(&q, &k, &v, norms, &cos, &sin, pos, &kc, &vc, heads)?;

    // Unfused reference (Attention::qkv + KvCache append), same dtype.
    let rc = cos.narrow(0, p, t)?.to_dtype(dtype)?;
    let rs = sin.narrow(0, p, t)?.to_dtype(dtype)?;
    let rq = rms(&q.reshape((1, t, nh, hd))?, &qw, eps)?
        .transpose(1, 2)?
        .contiguous()?;
    let rq = candle_nn::rotary_emb::rope(&rq, &rc, &rs)?;
    let rk = rms(&k.reshape((1, t, nkv, hd))?, &kw, eps)?
        .transpose(1, 2)?
        .contiguous()?;
    let rk = candle_nn::rotary_emb::rope(&rk, &rc, &rs)?;
    let rv = v.reshape((1, t, nkv, hd))?.transpose(1, 2)?.contiguous()?;
    let tol = tolerance(dtype, false);
    r.check(
        &format!("qk_norm_rope q [{tag}]"),
        dtype,
        rel_err(&q_out, &rq)?,
        tol,
    );
    let n = t.min(cap - p);
    r.check(
        &format!("qk_norm_rope k slot [{tag}]"),
        dtype,
        rel_err(&kc.narrow(2, p, n)?, &rk.narrow(2, 0, n)?)?,
        tol,
    );
    r.check(
        &format!("qk_norm_rope v slot [{tag}]"),
        dtype,
        rel_err(&vc.narrow(2, p, n)?, &rv.narrow(2, 0, n)?)?,
        0.0,
    );
    // Slots outside p..p+t untouched.
    let mut untouched = 0f32;
    if p > 0 {
        untouched = untouched.max(rel_err(&kc.narrow(2, 0, p)?, &kc0.narrow(2, 0, p)?)?);
        untouched = untouched.max(rel_err(&vc.narrow(2, 0, p)?, &vc0.narrow(2, 0, p)?)?);
    }
    if p + t < cap {
        let rest = cap - p - t;
        untouched = untouched.max(rel_err(
            &kc.narrow(2, p + t, rest)?,
            &kc0.narrow(2, p + t, rest)?,
        )?);
    }
    r.check(
        &format!("qk_norm_rope other slots [{tag}]"),
        dtype,
        untouched,
        0.0,
    );
    // Without head norms (a stack without them, Fish's fast AR): RoPE only.
    let (kc2, vc2) = (kc0.copy()?, vc0.copy()?);
    let q_plain = qk_norm_rope_kv(&q, &k, &v, None, &cos, &sin, pos, &kc2, &vc2, heads)?;
    let rotate = |x: &Tensor, heads: usize| -> Result<Tensor> {
        let x = x
            .reshape((1, t, heads, hd))?
            .transpose(1, 2)?
            .contiguous()?;
        Ok(candle_nn::rotary_emb::rope(&x, &rc, &rs)?)
    };
    r.check(
        &format!("qk rope without norms q [{tag}]"),
        dtype,
        rel_err(&q_plain, &rotate(&q, nh)?)?,
        tol,
    );
    r.check(
        &format!("qk rope without norms k slot [{tag}]"),
        dtype,
        rel_err(&kc2.narrow(2, p, n)?, &rotate(&k, nkv)?.narrow(2, 0, n)?)?,
        tol,
    );

    // Attention over slots 0..=p+i with the bucket `cap` as max_keys, against f32 math on the
    // same (dtype-rounded) inputs with the additive causal mask.
    let scale = 1.0 / (hd as f64).sqrt();
    let got = decode_attention(&q_out, &kc, &vc, pos, cap, scale)?; // [1, t, nh*hd]
    let rep = nh / nkv;
    let qf = q_out.to_dtype(DType::F32)?.reshape((1, nkv, rep * t, hd))?;
    let kf = kc.to_dtype(DType::F32)?;
    let vf = vc.to_dtype(DType::F32)?;
    let scores = (qf.matmul(&kf.t()?)? * scale)?; // [1, nkv, rep*t, cap]
    let mut mask = Vec::with_capacity(t * cap);
    for i in 0..t {
        for j in 0..cap {
            mask.push(if j <= p + i { 0f32 } else { f32::NEG_INFINITY });
        }
    }
    let mask = Tensor::from_vec(mask, (t, cap), dev)?;
    let scores = scores
        .reshape((1, nkv, rep, t, cap))?
        .broadcast_add(&mask)?
        .reshape((1, nkv, rep * t, cap))?;
    let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
    let want = probs
        .matmul(&vf)?
        .reshape((1, nh, t, hd))?
        .transpose(1, 2)?
        .reshape((1, t, nh * hd))?;
    r.check(
        &format!("decode_attention [{tag}]"),
        dtype,
        rel_err(&got, &want)?,
        tolerance(dtype, true),
    );
    // Every block size gives the same bits (the sums follow one layout of 256 threads).
    let mut by_size = 0f32;
    for threads in [32, 64, 128, 256] {
        let other = decode_attention_in_blocks(&q_out, &kc, &vc, pos, cap, scale, threads)?;
        by_size = by_size.max(rel_err(&other, &got)?);
    }
    r.check(
        &format!("decode_attention in blocks of 32 … 256 = its own size [{tag}]"),
        dtype,
        by_size,
        0.0,
    );
    // One launch for both: bit-identical output and caches.
    let merged = rope_attention(
        &q, &k, &v, norms, &cos, &sin, pos, &kc1, &vc1, heads, cap, scale,
    )?;
    let caches = rel_err(&kc1, &kc)?.max(rel_err(&vc1, &vc)?);
    r.check(
        &format!("rope_attention = both kernels [{tag}]"),
        dtype,
        rel_err(&merged, &got)?.max(caches),
        0.0,
    );
    Ok(())
}

/// The `gemv` kernels against `Linear::forward` on the unfused norm, residual add and SiLU · up.
fn gemv_checks(
    r: &mut Report,
    dev: &Device,
    dtype: DType,
    rows: usize,
    k: usize,
    n: usize,
    eps: f64,
) -> Result<()> {
    let tag = format!("[{rows}x{k} -> {n}]");
    let tol = if dtype == DType::F32 { 2e-5 } else { 1.6e-2 };
    let x = randn(&[1, rows, k], dtype, dev)?;
    let nw = randn(&[k], dtype, dev)?.affine(0.1, 1.0)?;
    let w = randn(&[n, k], dtype, dev)?.affine(0.05, 0.0)?;
    let lin = candle_nn::Linear::new(w.clone(), None);
    let normed = rms(&x, &nw, eps)?;

    let want = lin.forward(&normed)?;
    r.check(
        &format!("gemv_norm {tag}"),
        dtype,
        rel_err(&norm_gemv(&x, &nw, eps, &w)?, &want)?,
        tol,
    );
    let got = norm_gemv_logits(&x, &nw, eps, &w)?;
    let f32_out = if got.dtype() == DType::F32 {
        0.0
    } else {
        f32::INFINITY
    };
    r.check(
        &format!("gemv_norm_logits {tag}"),
        dtype,
        rel_err(&got, &want.to_dtype(DType::F32)?)?.max(f32_out),
        tol,
    );

    let res = randn(&[1, rows, n], dtype, dev)?;
    let want = (&res + lin.forward(&x)?)?;
    r.check(
        &format!("gemv_residual {tag}"),
        dtype,
        rel_err(&gemv_residual(&x, &w, &res)?, &want)?,
        tol,
    );

    let bias = randn(&[n], dtype, dev)?;
    let want = candle_nn::Linear::new(w.clone(), Some(bias.clone())).forward(&x)?;
    r.check(
        &format!("gemv_bias {tag}"),
        dtype,
        rel_err(&gemv_bias(&x, &w, &bias)?, &want)?,
        tol,
    );

    let gate_up = randn(&[2 * n, k], dtype, dev)?.affine(0.05, 0.0)?;
    let g = candle_nn::Linear::new(gate_up.narrow(0, 0, n)?, None).forward(&normed)?;
    let u = candle_nn::Linear::new(gate_up.narrow(0, n, n)?, None).forward(&normed)?;
    let want = (candle_nn::ops::silu(&g)? * u)?;
    r.check(
        &format!("gemv_norm_silu {tag}"),
        dtype,
        rel_err(&norm_gemv_silu(&x, &nw, eps, &gate_up)?, &want)?,
        tol,
    );
    Ok(())
}

/// `argmax_embed` against the host's first-index argmax and the table row, with ties planted.
fn argmax_checks(r: &mut Report, dev: &Device, dtype: DType) -> Result<()> {
    let (vocab, hidden) = (2048usize, 1024usize);
    let table = randn(&[vocab, hidden], dtype, dev)?;
    for (case, ties) in [
        ("random", &[][..]),
        ("tied maxima", &[1500usize, 7, 900][..]),
    ] {
        let mut l: Vec<f32> = randn(&[vocab], DType::F32, dev)?.to_vec1()?;
        for &i in ties {
            l[i] = 10.0;
        }
        let want = l
            .iter()
            .enumerate()
            .fold(0, |b, (i, &v)| if v > l[b] { i } else { b });
        let logits = Tensor::from_vec(l, (1, 1, vocab), dev)?;
        let (id, x) = argmax_embed(&logits, Some(&table))?;
        let got = id.to_vec1::<u32>()?[0] as usize;
        let index_err = if got == want { 0.0 } else { f32::INFINITY };
        r.check(
            &format!("argmax_embed index ({case})"),
            dtype,
            index_err,
            0.0,
        );
        let row_err = match x {
            Some(x) => rel_err(&x.reshape(hidden)?, &table.get(want)?)?,
            None => f32::INFINITY,
        };
        r.check(&format!("argmax_embed row ({case})"), dtype, row_err, 0.0);
        let (id, none) = argmax_embed(&logits, None)?;
        let bare_err = if id.to_vec1::<u32>()?[0] as usize == want && none.is_none() {
            0.0
        } else {
            f32::INFINITY
        };
        r.check(
            &format!("argmax_embed without table ({case})"),
            dtype,
            bare_err,
            0.0,
        );
    }
    Ok(())
}

/// `embed_sum` (16 tables: one of 3072 rows, 15 of 2048, width 1024) against the host: f32 sum in
/// codebook order, rounded to the dtype, plus the text row, rounded again. Must match exactly.
fn embed_sum_checks(r: &mut Report, dev: &Device, dtype: DType) -> Result<()> {
    let hidden = 1024usize;
    let mut tables = vec![randn(&[3072, hidden], dtype, dev)?];
    for _ in 0..15 {
        tables.push(randn(&[2048, hidden], dtype, dev)?);
    }
    let codes: Vec<u32> = (0..16u32).map(|i| (i * 797 + 3) % 2048).collect();
    // A row of a larger table, as the trailing text rows are passed.
    let trailing = randn(&[3, hidden], dtype, dev)?;
    let text = trailing.narrow(0, 1, 1)?;
    let refs: Vec<&Tensor> = tables.iter().collect();
    let got = embed_sum(&codes, &refs, &text)?;
    let mut acc = vec![0f32; hidden];
    for (t, &c) in tables.iter().zip(&codes) {
        let row: Vec<f32> = t.get(c as usize)?.to_dtype(DType::F32)?.to_vec1()?;
        for (a, v) in acc.iter_mut().zip(row) {
            *a += v;
        }
    }
    let sum = Tensor::from_vec(acc, (1, hidden), dev)?.to_dtype(dtype)?;
    let want = (sum.to_dtype(DType::F32)? + text.to_dtype(DType::F32)?)?.to_dtype(dtype)?;
    r.check(
        "embed_sum [16 tables, 1024]",
        dtype,
        rel_err(&got.reshape((1, hidden))?, &want)?,
        0.0,
    );
    // A code past its table is an error, not a read out of bounds.
    let mut bad = codes.clone();
    bad[3] = 2048;
    let refused = if embed_sum(&bad, &refs, &text).is_err() {
        0.0
    } else {
        f32::INFINITY
    };
    r.check(
        "embed_sum refuses a code past its table",
        dtype,
        refused,
        0.0,
    );
    Ok(())
}

/// `sample_embed` against `DeviceSampler::sample` (the candle-op sampler it replaces) on the
/// device: random logits, the released warper settings and harsher ones, three steps of a frame.
fn sample_embed_checks(r: &mut Report, dev: &Device, dtype: DType) -> Result<()> {
    use gstomnitts::models::qwen3_tts::device_sampler::{DeviceSampler, frame_params};
    use gstomnitts::models::qwen3_tts::sampling::TokenChooser;
    use rand::SeedableRng;
    let (vocab, hidden, steps) = (2048usize, 1024usize, 15usize);
    let sampler = DeviceSampler::new(vocab, dev)?;
    let table = randn(&[vocab, hidden], dtype, dev)?;
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
    for (temperature, top_k, top_p) in [
        (0.9f32, 50usize, 1.0f32),
        (0.9, 50, 0.8),
        (1.0, 0, 0.95),
        (1.3, 3, 0.5),
        (0.9, 1, 1.0),
    ] {
        let chooser = TokenChooser {
            do_sample: true,
            temperature,
            top_k,
            top_p,
        };
        let (mut n, mut differ, mut row_err) = (0usize, 0usize, 0f32);
        for _ in 0..40 {
            let logits = (randn(&[1, 1, vocab], DType::F32, dev)? * 3.0)?;
            let params = frame_params(&chooser, vocab, steps, &mut rng);
            let params = Tensor::new(params.as_slice(), dev)?;
            for step in [0, 7, steps - 1] {
                let want = sampler.sample(&logits, &params, step)?.to_vec1::<u32>()?[0];
                let (id, x) = sample_embed(&logits, &params, step, Some(&table))?;
                let got = id.to_vec1::<u32>()?[0];
                n += 1;
                differ += usize::from(got != want);
                row_err = row_err.max(match x {
                    Some(x) => rel_err(&x.reshape(hidden)?, &table.get(got as usize)?)?,
                    None => f32::INFINITY,
                });
            }
        }
        let tag = format!("T {temperature} top-k {top_k} top-p {top_p}");
        r.check(
            &format!("sample_embed = DeviceSampler ({tag}; {differ}/{n} differ)"),
            dtype,
            differ as f32 / n as f32,
            0.02,
        );
        r.check(&format!("sample_embed row ({tag})"), dtype, row_err, 0.0);
    }
    Ok(())
}

/// The batched frames' kernels against the one-row kernels, row by row (bit for bit):
/// `rows_attention` (talker heads 16/8 × 128; rows with caches of different capacities, at
/// positions from 0 to the last slot, one table per call), `pick_rows` (greedy and sampled rows
/// mixed, with and without the embedding table), `embed_sum_rows`.
fn rows_checks(r: &mut Report, dev: &Device, dtype: DType, eps: f64) -> Result<()> {
    use gstomnitts::models::qwen3_tts::device_sampler::frame_params;
    use gstomnitts::models::qwen3_tts::sampling::TokenChooser;
    use gstomnitts::nn::cuda_kernels::device_address;
    use rand::SeedableRng;
    let heads = Heads {
        nh: 16,
        nkv: 8,
        hd: 128,
    };
    let (qd, kvd) = (heads.nh * heads.hd, heads.nkv * heads.hd);
    let max_keys = 4096;
    let scale = 1.0 / (heads.hd as f64).sqrt();
    let (cos, sin) = tables(max_keys, heads.hd, dev)?;
    let qw = randn(&[heads.hd], dtype, dev)?.affine(0.1, 1.0)?;
    let kw = randn(&[heads.hd], dtype, dev)?.affine(0.1, 1.0)?;
    let norms = Some(HeadNorms {
        q: &qw,
        k: &kw,
        eps,
    });
    // (capacity, position) per row.
    let rows_spec: [(usize, usize); 6] = [
        (64, 0),
        (64, 63),
        (300, 17),
        (4096, 4095),
        (512, 300),
        (16, 5),
    ];
    let n = rows_spec.len();
    let qkv = randn(&[n, 1, qd + 2 * kvd], dtype, dev)?;
    let (q, k, v) = (
        qkv.narrow(2, 0, qd)?,
        qkv.narrow(2, qd, kvd)?,
        qkv.narrow(2, qd + kvd, kvd)?,
    );
    let mut solo_out = Vec::new();
    let mut solo_caches = Vec::new();
    let mut row_caches = Vec::new();
    for (i, &(cap, p)) in rows_spec.iter().enumerate() {
        let kc = randn(&[1, heads.nkv, cap, heads.hd], dtype, dev)?;
        let vc = randn(&[1, heads.nkv, cap, heads.hd], dtype, dev)?;
        let (kc1, vc1) = (kc.copy()?, vc.copy()?);
        let row = |x: &Tensor| x.narrow(0, i, 1);
        solo_out.push(rope_attention(
            &row(&q)?,
            &row(&k)?,
            &row(&v)?,
            norms,
            &cos,
            &sin,
            Pos::Host(p),
            &kc,
            &vc,
            heads,
            max_keys,
            scale,
        )?);
        solo_caches.push((kc, vc));
        row_caches.push((kc1, vc1));
    }
    let mut addrs = vec![0i64; 2 * n];
    for (i, (kc, vc)) in row_caches.iter().enumerate() {
        addrs[i] = device_address(kc)? as i64;
        addrs[n + i] = device_address(vc)? as i64;
    }
    let table = Tensor::from_vec(addrs, (2, n), dev)?;
    let caps: Vec<u32> = rows_spec.iter().map(|&(c, _)| c as u32).collect();
    let caps = Tensor::new(caps.as_slice(), dev)?;
    let positions: Vec<u32> = rows_spec.iter().map(|&(_, p)| p as u32).collect();
    let positions = Tensor::new(positions.as_slice(), dev)?;
    let got = rows_attention(
        &q,
        &k,
        &v,
        norms,
        &cos,
        &sin,
        &positions,
        RowCaches {
            caches: &table,
            caps: &caps,
        },
        heads,
        max_keys,
        scale,
    )?;
    let want = Tensor::cat(&solo_out, 0)?;
    let mut cache_err = 0f32;
    for ((a, b), (c, d)) in solo_caches.iter().zip(&row_caches) {
        cache_err = cache_err.max(rel_err(a, c)?).max(rel_err(b, d)?);
    }
    r.check(
        &format!("rows_attention = rope_attention per row [{n} rows]"),
        dtype,
        rel_err(&got, &want)?,
        0.0,
    );
    r.check(
        &format!("rows_attention caches = rope_attention's [{n} rows]"),
        dtype,
        cache_err,
        0.0,
    );

    // pick_rows: rows 0, 2, 4 greedy, the others sampled with different warpers.
    let (vocab, hidden, steps) = (2048usize, 1024usize, 15usize);
    let table = randn(&[vocab, hidden], dtype, dev)?;
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(11);
    let choosers = [(0.9f32, 50usize, 1.0f32), (1.0, 0, 0.95), (1.3, 3, 0.5)];
    let rows = 6;
    let mut params = Vec::new();
    for i in 0..rows {
        if i % 2 == 0 {
            params.extend(gstomnitts::models::qwen3_tts::device_sampler::greedy_row_params(steps));
        } else {
            let (temperature, top_k, top_p) = choosers[i / 2];
            let c = TokenChooser {
                do_sample: true,
                temperature,
                top_k,
                top_p,
            };
            params.extend(frame_params(&c, vocab, steps, &mut rng));
        }
    }
    let stride = params.len() / rows;
    let params = Tensor::from_vec(params, (rows, stride), dev)?;
    let logits = (randn(&[rows, 1, vocab], DType::F32, dev)? * 3.0)?;
    let (mut differ, mut row_err) = (0usize, 0f32);
    for (step, with_table) in [(0usize, true), (7, true), (steps - 1, false)] {
        let codes = Tensor::zeros((rows, steps + 1), DType::U32, dev)?;
        let t = with_table.then_some(&table);
        let x = pick_rows(&logits, &params, step, t, &codes, step + 1)?;
        let got: Vec<Vec<u32>> = codes.to_vec2()?;
        for i in 0..rows {
            let l = logits.narrow(0, i, 1)?;
            let p = params.get(i)?;
            let (id, xs) = if i % 2 == 0 {
                argmax_embed(&l, t)?
            } else {
                sample_embed(&l, &p, step, t)?
            };
            let want = id.to_vec1::<u32>()?[0];
            differ += usize::from(got[i][step + 1] != want);
            if let (Some(x), Some(xs)) = (&x, xs) {
                row_err = row_err.max(rel_err(&x.narrow(0, i, 1)?, &xs)?);
            }
        }
        if with_table != x.is_some() {
            row_err = f32::INFINITY;
        }
    }
    r.check(
        &format!("pick_rows = argmax_embed / sample_embed per row ({differ} differ)"),
        dtype,
        differ as f32,
        0.0,
    );
    r.check(
        "pick_rows rows = one-row kernels' rows",
        dtype,
        row_err,
        0.0,
    );

    // embed_sum_rows against embed_sum row by row.
    let mut tables = vec![randn(&[3072, hidden], dtype, dev)?];
    for _ in 0..15 {
        tables.push(randn(&[2048, hidden], dtype, dev)?);
    }
    let refs: Vec<&Tensor> = tables.iter().collect();
    let codes: Vec<Vec<u32>> = (0..5u32)
        .map(|r| (0..16u32).map(|i| (i * 797 + r * 131 + 3) % 2048).collect())
        .collect();
    let text = randn(&[5, 1, hidden], dtype, dev)?;
    let codes_dev = Tensor::new(codes.clone(), dev)?;
    let got = embed_sum_rows(&codes_dev, &refs, &text)?;
    let mut want = Vec::new();
    for (i, c) in codes.iter().enumerate() {
        want.push(embed_sum(c, &refs, &text.get(i)?.reshape((1, hidden))?)?);
    }
    r.check(
        "embed_sum_rows = embed_sum per row [5 rows]",
        dtype,
        rel_err(&got, &Tensor::cat(&want, 0)?)?,
        0.0,
    );
    Ok(())
}

/// A `decode_stack` check: the stack's sizes, `t` rows at position `p` (on the device or not).
struct StackCase {
    hidden: usize,
    inter: usize,
    layers: usize,
    cap: usize,
    t: usize,
    p: usize,
    dev_pos: bool,
}

/// `decode_stack` against the per-layer kernels it chains (`norm_gemv` → `qk_norm_rope_kv` →
/// `decode_attention` → `gemv_residual` → `norm_gemv_silu` → `gemv_residual`, as
/// `DecoderLayer::forward_gemv`) on random layers and caches with `p` positions filled: the output
/// and every cache must be bit-identical (same device functions, same work split).
fn stack_checks(
    r: &mut Report,
    dev: &Device,
    dtype: DType,
    case: StackCase,
    eps: f64,
) -> Result<()> {
    let StackCase {
        hidden,
        inter,
        layers,
        cap,
        t,
        p,
        dev_pos,
    } = case;
    let heads = Heads {
        nh: 16,
        nkv: 8,
        hd: 128,
    };
    let Heads { nh, nkv, hd } = heads;
    let scale = 1.0 / (hd as f64).sqrt();
    let (cos, sin) = tables(cap, hd, dev)?;
    let mat = |n: usize, k: usize| -> Result<Tensor> {
        Ok(randn(&[n, k], dtype, dev)?.affine(1.0 / (k as f64).sqrt(), 0.0)?)
    };
    let vec = |n: usize| -> Result<Tensor> { Ok(randn(&[n], dtype, dev)?.affine(0.1, 1.0)?) };
    let mut stack = Vec::new();
    for _ in 0..layers {
        stack.push(StackLayer {
            eps,
            input_norm: vec(hidden)?,
            post_norm: vec(hidden)?,
            attn: StackAttention {
                heads,
                qk_eps: eps,
                scale,
                qkv: mat((nh + 2 * nkv) * hd, hidden)?,
                qk_norm: Some((vec(hd)?, vec(hd)?)),
                o: mat(hidden, nh * hd)?,
                k_cache: randn(&[1, nkv, cap, hd], dtype, dev)?,
                v_cache: randn(&[1, nkv, cap, hd], dtype, dev)?,
            },
            gate_up: mat(2 * inter, hidden)?,
            down: mat(hidden, inter)?,
        });
    }
    let x = randn(&[1, t, hidden], dtype, dev)?;
    let pos_tensor = Tensor::new(&[p as u32], dev)?;
    let pos = if dev_pos {
        Pos::Device(&pos_tensor)
    } else {
        Pos::Host(p)
    };
    let at = DecodeAt {
        cos: &cos,
        sin: &sin,
        pos,
        max_keys: cap,
    };

    // The per-layer kernels on copies of the caches.
    let mut h = x.clone();
    let mut want_caches = Vec::new();
    for l in &stack {
        let a = &l.attn;
        let (kc, vc) = (a.k_cache.copy()?, a.v_cache.copy()?);
        let qkv = norm_gemv(&h, &l.input_norm, eps, &a.qkv)?;
        let (qw, kvw) = (nh * hd, nkv * hd);
        let q = qk_norm_rope_kv(
            &qkv.narrow(2, 0, qw)?,
            &qkv.narrow(2, qw, kvw)?,
            &qkv.narrow(2, qw + kvw, kvw)?,
            a.qk_norm.as_ref().map(|(q, k)| HeadNorms { q, k, eps }),
            &cos,
            &sin,
            pos,
            &kc,
            &vc,
            heads,
        )?;
        let att = decode_attention(&q, &kc, &vc, pos, cap, scale)?;
        let mid = gemv_residual(&att, &a.o, &h)?;
        let act = norm_gemv_silu(&mid, &l.post_norm, eps, &l.gate_up)?;
        h = gemv_residual(&act, &l.down, &mid)?;
        want_caches.push((kc, vc));
    }
    let got = decode_stack(&x, &stack, at, &Barrier::default())?;
    let tag = format!(
        "decode_stack {layers}x[{hidden}/{inter}] t={t} p={p}{}",
        if dev_pos { " (device pos)" } else { "" }
    );
    r.check(&format!("{tag} out"), dtype, rel_err(&got, &h)?, 0.0);
    let mut cache_err = 0f32;
    for (l, (kc, vc)) in stack.iter().zip(&want_caches) {
        cache_err = cache_err
            .max(rel_err(&l.attn.k_cache, kc)?)
            .max(rel_err(&l.attn.v_cache, vc)?);
    }
    r.check(&format!("{tag} caches"), dtype, cache_err, 0.0);
    Ok(())
}

/// A streaming layer `f` over `x` `[b, c, 200]` in chunks of 1, 2, 4, 150 and 43 positions
/// against one call over all of it: [`rel_err`] of the two outputs.
fn chunked_vs_whole<S: Default>(
    x: &Tensor,
    f: impl Fn(&Tensor, &mut S) -> candle_core::Result<Tensor>,
) -> Result<f32> {
    let whole = f(x, &mut S::default())?;
    let mut state = S::default();
    let mut parts = Vec::new();
    for (start, n) in [(0, 1), (1, 2), (3, 4), (7, 150), (157, 43)] {
        parts.push(f(&x.narrow(2, start, n)?, &mut state)?);
    }
    rel_err(&Tensor::cat(&parts, 2)?, &whole)
}

/// The Code2Wav convolution layers on CUDA (`nn::conv`, `OMNITTS_DECODER_CONV`'s choice) on the
/// decoder's shapes: convolutions (k 7, dilations 1 / 3 / 9, channels 96 … 1536, one output
/// channel), transposed convolutions (k = 2s, s 2 … 8); `gather_rows`.
fn conv_checks(r: &mut Report, dev: &Device) -> Result<()> {
    use gstomnitts::nn::conv::{
        CausalConvState, ConvTransposeState, StreamingCausalConv1d, StreamingCausalConvTranspose1d,
    };
    let bf = DType::BF16;
    let f32_of = |t: &Tensor| -> Result<Tensor> { Ok(t.to_dtype(DType::F32)?) };
    // (batch, c_in, c_out, k, dilation, len)
    for (b, cin, cout, k, dil, len) in [
        (3, 96, 96, 7, 9, 300),
        (2, 192, 192, 7, 3, 129),
        (4, 768, 768, 7, 1, 40),
        (1, 1024, 1536, 7, 1, 4),
        (2, 96, 1, 7, 1, 77),
        (1, 40, 24, 3, 2, 1),
    ] {
        let ctx = (k - 1) * dil;
        let w = randn(&[cout, cin, k], bf, dev)?.affine(1.0 / (cin * k) as f64, 0.0)?;
        let x = randn(&[b, cin, len], bf, dev)?;
        let hist = randn(&[b, cin, ctx], bf, dev)?;
        let bias = randn(&[cout], bf, dev)?;
        let xp = f32_of(&Tensor::cat(&[&hist, &x], 2)?)?;
        let want = xp
            .conv1d(&f32_of(&w)?, 0, 1, dil, 1)?
            .broadcast_add(&f32_of(&bias)?.reshape((1, cout, 1))?)?;
        // The streaming layer (OMNITTS_DECODER_CONV's choice) with `hist` as its past, in f32
        // and bf16.
        for dtype in [DType::F32, bf] {
            let layer = StreamingCausalConv1d::new(
                w.to_dtype(dtype)?,
                Some(bias.to_dtype(dtype)?),
                dil,
                1,
            )?;
            let mut state = CausalConvState::default();
            layer.forward(&hist.to_dtype(dtype)?, &mut state)?;
            let got = layer.forward(&x.to_dtype(dtype)?, &mut state)?;
            let name = format!("conv layer [{b}x{cin}->{cout}, k{k} d{dil}, {len}]");
            r.check(&name, dtype, rel_err(&got, &want)?, tolerance(dtype, true));
        }
    }
    // Transposed: (batch, c_in, c_out, stride, len); k = 2s as in the decoder.
    let transposed: [(usize, usize, usize, usize, usize); 4] = [
        (2, 1536, 768, 8, 25),
        (3, 384, 192, 4, 50),
        (2, 192, 96, 3, 17),
        (1, 1024, 1024, 2, 1),
    ];
    for (b, cin, cout, s, len) in transposed {
        let k = 2 * s;
        let q = k.div_ceil(s);
        let w = randn(&[cin, cout, k], bf, dev)?.affine(1.0 / cin as f64, 0.0)?;
        let x = randn(&[b, cin, len], bf, dev)?;
        let hist = randn(&[b, cin, q - 1], bf, dev)?;
        let bias = randn(&[cout], bf, dev)?;
        let xp = f32_of(&Tensor::cat(&[&hist, &x], 2)?)?;
        let mut rows = Vec::new();
        for i in 0..b {
            rows.push(
                xp.narrow(0, i, 1)?
                    .conv_transpose1d(&f32_of(&w)?, 0, 0, s, 1, 1)?,
            );
        }
        let want = Tensor::cat(&rows, 0)?
            .narrow(2, (q - 1) * s, len * s)?
            .broadcast_add(&f32_of(&bias)?.reshape((1, cout, 1))?)?;
        // The streaming layer: the history fed as a first chunk, then x (its output is x's).
        for dtype in [DType::F32, bf] {
            let layer = StreamingCausalConvTranspose1d::new(
                w.to_dtype(dtype)?,
                Some(bias.to_dtype(dtype)?),
                s,
            )?;
            let mut state = ConvTransposeState::default();
            layer.forward(&hist.to_dtype(dtype)?, &mut state)?;
            let got = layer.forward(&x.to_dtype(dtype)?, &mut state)?;
            let name = format!("conv transposed layer [{b}x{cin}->{cout}, s{s}, {len}]");
            r.check(&name, dtype, rel_err(&got, &want)?, tolerance(dtype, true));
        }
    }
    // gather_rows = cat along the batch, bit for bit (more rows than one launch takes).
    for dtype in [DType::F32, bf] {
        let big = randn(&[70, 96, 54], dtype, dev)?;
        let rows: Vec<Tensor> = (0..70)
            .map(|i| big.narrow(0, (i * 37) % 70, 1))
            .collect::<candle_core::Result<_>>()?;
        let refs: Vec<&Tensor> = rows.iter().collect();
        let got = gather_rows(&refs)?;
        let want = Tensor::cat(&refs, 0)?;
        r.check(
            "gather_rows [70 rows of 96x54]",
            dtype,
            rel_err(&got, &want)?,
            0.0,
        );
    }
    // The streaming layers: chunked = whole (within one bf16 rounding: cuBLAS may block a
    // product of another length differently).
    let x = randn(&[2, 96, 200], bf, dev)?;
    let w = randn(&[96, 96, 7], bf, dev)?.affine(1.0 / 672.0, 0.0)?;
    let conv = StreamingCausalConv1d::new(w, Some(randn(&[96], bf, dev)?), 3, 1)?;
    let err = chunked_vs_whole(&x, |x, s: &mut CausalConvState| conv.forward(x, s))?;
    r.check("conv layer chunked = whole", bf, err, 2e-3);
    let w = randn(&[96, 48, 6], bf, dev)?.affine(1.0 / 96.0, 0.0)?;
    let up = StreamingCausalConvTranspose1d::new(w, Some(randn(&[48], bf, dev)?), 3)?;
    let err = chunked_vs_whole(&x, |x, s: &mut ConvTransposeState| up.forward(x, s))?;
    r.check("conv transposed layer chunked = whole", bf, err, 2e-3);
    Ok(())
}
