//! `gpu_parity --check-kernels`: each fused CUDA decode kernel (`src/nn/cuda_kernels`) against the
//! unfused candle ops it replaces, on random tensors of the real talker / code-predictor shapes,
//! in f32 and bf16, on the device. Prints one line per check and returns whether all passed.
//!
//! Error measure: max |fused − reference| / max |reference|. The reference runs the unfused candle
//! ops on the device in the same dtype (as the model did before the fusion), except attention,
//! whose reference is computed in f32 from the same dtype-rounded inputs (the unfused bf16 path
//! rounds scores and probabilities to bf16, the kernel does not). Tolerances: f32 1e-5 (2e-5 for
//! attention: other summation order); bf16 1.6e-2 (about two bf16 roundings, 2⁻⁸ each, of the
//! largest value: the fused kernels round once where the unfused ops round after every op).

use anyhow::Result;
use candle_core::{D, DType, Device, Tensor};
use gstomnitts::nn::cuda_kernels::{
    Pos,
    add_rms_norm::add_rms_norm,
    decode_attention::decode_attention,
    qk_norm_rope::{Heads, qk_norm_rope_kv},
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
    let pos_t = Tensor::new(&[p as u32], dev)?;
    let pos = if dev_pos {
        Pos::Device(&pos_t)
    } else {
        Pos::Host(p)
    };
    let q_out = qk_norm_rope_kv(&q, &k, &v, &qw, &kw, eps, &cos, &sin, pos, &kc, &vc, heads)?;

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
    Ok(())
}
