//! A linear layer whose weight is either a dense tensor (the checkpoint's values in the model
//! dtype) or a block-quantized one, multiplied by candle's quantized CPU kernels.
//!
//! Quantized forms follow the GGML block formats that candle implements ([`Quantization`]):
//! the weight `[out, in]` is cut along `in` into blocks, each stored as small integers and a
//! scale. The activation is quantized the same way per row and block (int8 for both forms), the
//! block dot products are exact integer sums, and the partial sums are scaled and accumulated in
//! f32: the output is f32. On x86 with AVX512-VNNI candle repacks the blocks into 16-row tiles
//! on first use, which is what makes these forms faster than f32 on a CPU (one frame's matmuls
//! read 4× (int8) or ~7× (4-bit) fewer bytes).
//!
//! The form is decided per layer at load ([`QuantizationSpec::for_layer`]). A form asked for by
//! name applies to every layer whose input width is a whole number of its blocks (the others keep
//! the next larger form, down to dense). `auto` quantizes to int8 only the layers that candle's
//! repacked kernels take (input width a multiple of 256, output a multiple of 16, a CPU with
//! VNNI int8 dot products): its generic block kernels are slower than the f32 matmul (measured
//! 1.7–190× on 192- to 1056-wide layers, docs/cpu.md), so elsewhere dense is the faster form.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Module, Result, Tensor};

/// The stored form of the quantized layers' weights (`engine_args.quantization`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Quantization {
    /// Dense weights in the model dtype (bit-for-bit the checkpoint's values).
    #[default]
    None,
    /// int8 blocks of 32 weights with an f16 scale (GGML `Q8_0`, 8.5 bits a weight).
    Q8_0,
    /// 4-bit "k-quant" super-blocks of 256 weights with 6-bit sub-block scales and minima
    /// (GGML `Q4_K`, 4.5 bits a weight).
    Q4K,
}

impl Quantization {
    /// Parses `none`, `q8_0` (also `int8`, `q8`) and `q4_k` (also `q4k`, `int4`, `4bit`),
    /// case-insensitively. `None` for anything else.
    pub fn parse(s: &str) -> Option<Quantization> {
        match s.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "none" | "f32" | "float32" | "dense" => Some(Quantization::None),
            "q8_0" | "q8" | "int8" => Some(Quantization::Q8_0),
            "q4_k" | "q4k" | "int4" | "4bit" => Some(Quantization::Q4K),
            _ => None,
        }
    }

    /// The canonical name (`none`, `q8_0`, `q4_k`).
    pub fn name(&self) -> &'static str {
        match self {
            Quantization::None => "none",
            Quantization::Q8_0 => "q8_0",
            Quantization::Q4K => "q4_k",
        }
    }

    fn ggml(&self) -> Option<GgmlDType> {
        match self {
            Quantization::None => None,
            Quantization::Q8_0 => Some(GgmlDType::Q8_0),
            Quantization::Q4K => Some(GgmlDType::Q4K),
        }
    }

    /// Weights per block along the input dimension.
    pub fn block(&self) -> usize {
        self.ggml().map_or(1, |d| d.block_size())
    }

    /// The form a layer with `in_width` inputs gets when `self` is asked for: `self` when
    /// `in_width` is a whole number of its blocks, else the next larger form that fits
    /// (`q4_k` → `q8_0` → `none`).
    pub fn for_width(self, in_width: usize) -> Quantization {
        let mut q = self;
        while q != Quantization::None && !in_width.is_multiple_of(q.block()) {
            q = match q {
                Quantization::Q4K => Quantization::Q8_0,
                _ => Quantization::None,
            };
        }
        q
    }
}

/// What the loader is asked for (`engine_args.quantization`, the elements' `quantization`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuantizationSpec {
    /// int8 where candle's fast kernels run (see the module doc), dense elsewhere; always dense
    /// off the CPU or with activations other than f32.
    #[default]
    Auto,
    /// This form for every layer it fits ([`Quantization::for_width`]).
    Form(Quantization),
}

impl QuantizationSpec {
    /// Dense weights everywhere.
    pub const DENSE: QuantizationSpec = QuantizationSpec::Form(Quantization::None);

    /// Parses `auto` or a [`Quantization`] name.
    pub fn parse(s: &str) -> Option<QuantizationSpec> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Some(QuantizationSpec::Auto);
        }
        Quantization::parse(s).map(QuantizationSpec::Form)
    }

    /// The canonical name (`auto`, `none`, `q8_0`, `q4_k`).
    pub fn name(&self) -> &'static str {
        match self {
            QuantizationSpec::Auto => "auto",
            QuantizationSpec::Form(q) => q.name(),
        }
    }

    /// The spec a model on `device` with activations in `dtype` loads with: quantized forms are
    /// CPU and f32 only, so `auto` becomes dense elsewhere. Errors, naming the form, the device
    /// and the dtype, when a quantized form is asked for where it cannot run.
    pub fn resolve(
        self,
        device: &candle_core::Device,
        dtype: DType,
    ) -> std::result::Result<QuantizationSpec, String> {
        let usable = device.is_cpu() && dtype == DType::F32;
        match self {
            QuantizationSpec::Auto if !usable => Ok(QuantizationSpec::DENSE),
            QuantizationSpec::Form(q) if q != Quantization::None && !usable => Err(format!(
                "quantization {q} runs on the CPU with float32 activations only \
                 (this stage runs on {} in {dtype:?}); use quantization none or auto",
                if device.is_cpu() { "the CPU" } else { "a GPU" }
            )),
            spec => Ok(spec),
        }
    }

    /// The form of a layer with weight `[out_width, in_width]` on the CPU.
    pub fn for_layer(&self, in_width: usize, out_width: usize) -> Quantization {
        match self {
            QuantizationSpec::Form(q) => q.for_width(in_width),
            QuantizationSpec::Auto
                if fast_int8_kernels()
                    && in_width.is_multiple_of(256)
                    && out_width.is_multiple_of(16) =>
            {
                Quantization::Q8_0
            }
            QuantizationSpec::Auto => Quantization::None,
        }
    }
}

/// Whether this CPU has the int8 dot-product instructions candle's repacked `Q8_0` kernels
/// need (x86-64: AVX512-VNNI or AVX-VNNI; aarch64: the dot-product extension).
pub fn fast_int8_kernels() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        (std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vnni"))
            || (std::arch::is_x86_feature_detected!("avxvnni")
                && std::arch::is_x86_feature_detected!("avx2"))
    }
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("dotprod")
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

impl std::fmt::Display for QuantizationSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::fmt::Display for Quantization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `y = x · Wᵀ + b` with `W` `[out, in]` and `b` `[out]`.
#[derive(Debug, Clone)]
pub enum Linear {
    /// The weight as a tensor in the model dtype.
    Dense(candle_nn::Linear),
    /// The weight block-quantized on the CPU ([`Quantization::Q8_0`] or [`Quantization::Q4K`]);
    /// the bias, if any, in f32.
    Quantized {
        weight: QMatMul,
        bias: Option<Tensor>,
        form: Quantization,
    },
}

impl Linear {
    /// A dense layer.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Linear {
        Linear::Dense(candle_nn::Linear::new(weight, bias))
    }

    /// Quantizes `weight` (`[out, in]`, any float dtype, on the CPU) to `form`
    /// ([`Quantization::for_width`] already applied: `in` must be a whole number of blocks).
    /// `Quantization::None` gives a dense layer of `weight` as it is. Errors from candle's
    /// quantizer (a width that is not a whole number of blocks, a device other than the CPU).
    pub fn quantize(weight: &Tensor, bias: Option<Tensor>, form: Quantization) -> Result<Linear> {
        let Some(ggml) = form.ggml() else {
            return Ok(Linear::new(weight.clone(), bias));
        };
        let q = QTensor::quantize(&weight.to_dtype(DType::F32)?, ggml)?;
        let bias = bias.map(|b| b.to_dtype(DType::F32)).transpose()?;
        Ok(Linear::Quantized {
            weight: QMatMul::from_qtensor(q)?,
            bias,
            form,
        })
    }

    /// The stored form.
    pub fn form(&self) -> Quantization {
        match self {
            Linear::Dense(_) => Quantization::None,
            Linear::Quantized { form, .. } => *form,
        }
    }

    /// Bytes the weight takes as stored (the compact blocks when quantized; candle keeps a
    /// repacked copy of about the same size beside them once the layer has run on x86).
    pub fn weight_bytes(&self) -> usize {
        match self {
            Linear::Dense(l) => l.weight().elem_count() * l.weight().dtype().size_in_bytes(),
            Linear::Quantized { weight, .. } => match weight {
                QMatMul::QTensor(t) => t.storage_size_in_bytes(),
                QMatMul::Tensor(t) | QMatMul::TensorF16(t) => {
                    t.elem_count() * t.dtype().size_in_bytes()
                }
            },
        }
    }

    /// The dense layer (for the CUDA kernels, which read the weight tensor directly); `None`
    /// when quantized.
    pub fn dense(&self) -> Option<&candle_nn::Linear> {
        match self {
            Linear::Dense(l) => Some(l),
            Linear::Quantized { .. } => None,
        }
    }

    /// The dense weight `[out, in]`; `None` when quantized.
    pub fn weight(&self) -> Option<&Tensor> {
        self.dense().map(candle_nn::Linear::weight)
    }

    /// The bias `[out]`, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        match self {
            Linear::Dense(l) => l.bias(),
            Linear::Quantized { bias, .. } => bias.as_ref(),
        }
    }
}

impl Module for Linear {
    /// `x` `[.., in]` → `[.., out]`. A quantized layer takes and gives f32.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Linear::Dense(l) => l.forward(x),
            Linear::Quantized { weight, bias, .. } => {
                let y = weight.forward(&x.contiguous()?)?;
                match bias {
                    Some(b) => y.broadcast_add(b),
                    None => Ok(y),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::*;

    /// Normal samples from a fixed ChaCha stream (Box-Muller), so the error bounds below are
    /// checked on the same data on every machine.
    fn seeded_normal(seed: u64, std: f32, shape: &[usize]) -> Tensor {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                let (u1, u2): (f32, f32) = (rng.random(), rng.random());
                let r = (-2.0 * (1.0 - u1).ln()).sqrt();
                std * r * (std::f32::consts::TAU * u2).cos()
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
        let d = (a - b).unwrap().sqr().unwrap().sum_all().unwrap();
        let n = b.sqr().unwrap().sum_all().unwrap();
        (d.to_scalar::<f32>().unwrap() / n.to_scalar::<f32>().unwrap()).sqrt()
    }

    #[test]
    fn parses_the_forms_and_falls_back_by_width() {
        assert_eq!(Quantization::parse("Q8_0"), Some(Quantization::Q8_0));
        assert_eq!(Quantization::parse("q4-k"), Some(Quantization::Q4K));
        assert_eq!(Quantization::parse("none"), Some(Quantization::None));
        assert_eq!(Quantization::parse("fp8"), None);
        assert_eq!(Quantization::Q4K.for_width(1024), Quantization::Q4K);
        assert_eq!(Quantization::Q4K.for_width(192), Quantization::Q8_0);
        assert_eq!(Quantization::Q8_0.for_width(48), Quantization::None);
        assert_eq!(Quantization::None.for_width(1024), Quantization::None);
        assert_eq!(
            QuantizationSpec::parse(" AUTO"),
            Some(QuantizationSpec::Auto)
        );
        let q8 = QuantizationSpec::Form(Quantization::Q8_0);
        assert_eq!(QuantizationSpec::parse("int8"), Some(q8));
        assert_eq!(q8.for_layer(64, 8), Quantization::Q8_0);
        // auto: only the widths the repacked kernels take, and never narrow layers.
        assert_eq!(
            QuantizationSpec::Auto.for_layer(192, 640),
            Quantization::None
        );
        let wide = QuantizationSpec::Auto.for_layer(1024, 3072);
        assert_eq!(wide == Quantization::Q8_0, fast_int8_kernels());
    }

    #[test]
    fn quantized_forms_are_refused_off_the_cpu_and_f32() {
        let cpu = Device::Cpu;
        let q8 = QuantizationSpec::Form(Quantization::Q8_0);
        assert_eq!(q8.resolve(&cpu, DType::F32), Ok(q8));
        let err = q8.resolve(&cpu, DType::BF16).unwrap_err();
        assert!(err.contains("q8_0") && err.contains("BF16"), "{err}");
        let dense = QuantizationSpec::DENSE;
        assert_eq!(QuantizationSpec::Auto.resolve(&cpu, DType::BF16), Ok(dense));
        assert_eq!(
            QuantizationSpec::Auto.resolve(&cpu, DType::F32),
            Ok(QuantizationSpec::Auto)
        );
        assert_eq!(dense.resolve(&cpu, DType::F16), Ok(dense));
    }

    /// The quantized products stay close to the dense ones, for every row of a batch and with a
    /// bias; dense stays exact. Widths are multiples of 256 so that candle's repacked kernels
    /// (the ones that run for the released checkpoints) are the ones tested. The data is seeded;
    /// the bounds are about twice the spread measured over 200 random draws of these shapes
    /// (q8_0: 0.77-1.05 %, weights and activations both rounded to 8 bits; q4_k: 6.6-8.3 %, 16
    /// levels over each 32 weights' range).
    #[test]
    fn quantized_forward_is_close_to_dense() {
        let w = seeded_normal(1, 0.05, &[64, 512]);
        let b = seeded_normal(2, 0.1, &[64]);
        let x = seeded_normal(3, 1.0, &[3, 2, 512]);
        let dense = Linear::new(w.clone(), Some(b.clone()));
        let want = dense.forward(&x).unwrap();
        let exact = candle_nn::Linear::new(w.clone(), Some(b.clone()))
            .forward(&x)
            .unwrap();
        assert_eq!(rel_err(&want, &exact), 0.0);
        for (form, bound) in [(Quantization::Q8_0, 0.02), (Quantization::Q4K, 0.16)] {
            let q = Linear::quantize(&w, Some(b.clone()), form).unwrap();
            assert_eq!(q.form(), form);
            assert!(q.weight().is_none());
            let got = q.forward(&x).unwrap();
            assert_eq!(got.dims(), want.dims());
            let e = rel_err(&got, &want);
            assert!(e > 0.0 && e < bound, "{form}: relative error {e}");
            // Each row alone gives what it gives in the batch.
            let row = q.forward(&x.narrow(0, 1, 1).unwrap()).unwrap();
            let in_batch = got.narrow(0, 1, 1).unwrap();
            assert!(rel_err(&row, &in_batch) < 1e-6, "{form}: row differs alone");
        }
    }
}
